// Preloaded into the Open MPI ranks of scripts/stages/asan.sh: dlclose does nothing, so the
// components Open MPI dlopens (mca_*.so) stay mapped until the process exits. LeakSanitizer
// reports leaks at exit; a stack through a module already unmapped reads "<unknown module>"
// and matches no suppression (scripts/sanitize/lsan.supp names Open MPI's modules), and its
// stop-the-world tracer was seen crashing (signal 11) in such processes. Only the stage uses it.
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
