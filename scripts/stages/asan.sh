# ASan + UBSan (issue 24): the whole tree built with gcc -fsanitize=address,undefined (-O1, line
# tables; a UBSan report aborts) into $ASAN_BUILD_DIR (build-asan, incrementally, with ccache),
# then under it:
#   unit         every unit test (ctest -L unit)
#   collectives  check collectives on local at 1, 3, 8 ranks and on mpi at 2, 3; the a2av-hang
#                and rank-exit faults on local (the suite must still fail and name them)
#   ep           check ep on local at 1, 3, 8 and on mpi at 2, 3; a2a with large rows; auto
#                under a broken all_to_all_v
#   kernels      check kernels
#   e2e          check e2e on models/tiny at EP 1, 2, 4 (local, ag and a2a) and 2 (mpi), every run
#                with EP 1's logits hash
#   diff         deepinfer diff: clean, and over 2 rank threads
# Any sanitizer report fails its run; leaks are reported at exit (LeakSanitizer). Open MPI's own
# leaks (what MPI_Init allocates and MPI_Finalize keeps) are suppressed in
# scripts/sanitize/lsan.supp (third-party code only). For that to match, the mpirun ranks keep
# Open MPI's components mapped (scripts/sanitize/keep_dlopened.c, preloaded after the ASan
# runtime) and record whole allocation stacks (fast_unwind_on_malloc=0: the frame-pointer unwinder
# stops inside libc's asprintf and leaves a stack that names nobody). World sizes are smaller than
# the default stages' so that the stage takes about 10 minutes on 2 cores (the build aside).
# Not a default stage. Logs: $ASAN_BUILD_DIR/stage-logs/asan/.
set -uo pipefail
source scripts/sanitize/build.sh
source scripts/sanitize/run.sh
export BUILD_DIR=${ASAN_BUILD_DIR:-build-asan}
DEEPINFER=$BUILD_DIR/bin/deepinfer
LOGS=$BUILD_DIR/stage-logs/asan
mkdir -p "$LOGS"
export ASAN_OPTIONS=detect_leaks=1:check_initialization_order=1:strict_init_order=1:abort_on_error=0
export LSAN_OPTIONS=suppressions=$PWD/scripts/sanitize/lsan.supp:print_suppressions=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export DEEPINFER_COMM_TIMEOUT_S=${DEEPINFER_COMM_TIMEOUT_S:-120}

echo "--- build ($BUILD_DIR)"
sanitize_build address,undefined "$LOGS" || exit 1
keep=$(realpath -m "$BUILD_DIR/libkeep_dlopened.so")
gcc -shared -fPIC -O1 -o "$keep" scripts/sanitize/keep_dlopened.c || exit 1
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1
  -x LD_PRELOAD="$(gcc -print-file-name=libasan.so):$keep"
  -x ASAN_OPTIONS="$ASAN_OPTIONS:fast_unwind_on_malloc=0")

echo "--- runs (one line each; logs in $LOGS)"
san_run "unit tests" ctest --test-dir "$BUILD_DIR" -L unit --output-on-failure -j "$(nproc)" --timeout 900
for w in 1 3 8; do
  san_run "check collectives local $w" "$DEEPINFER" check collectives --comm local --world "$w"
done
for w in 2 3; do
  san_run "check collectives mpi $w" "${MPIRUN[@]}" -np "$w" "$DEEPINFER" check collectives --comm mpi
done
# The faults make the suite fail (exit 3: a timeout); the run passes when it says so, cleanly.
for f in a2av-hang rank-exit; do
  san_run "check collectives fault $f" bash -c '"$1" check collectives --comm local --world 8 --quick \
    --fault "$2" --timeout 2; rc=$?; echo "exit $rc"; [[ $rc -eq 3 ]]' _ "$DEEPINFER" "$f"
done
for w in 1 3 8; do
  san_run "check ep local $w" "$DEEPINFER" check ep --comm local --world "$w"
done
for w in 2 3; do
  san_run "check ep mpi $w" "${MPIRUN[@]}" -np "$w" "$DEEPINFER" check ep --comm mpi --world "$w"
done
san_run "check ep local 2 a2a hidden 8192" "$DEEPINFER" check ep --comm local --world 2 --algo a2a --hidden 8192
san_run "check ep local 8 auto fault a2a-diverge" "$DEEPINFER" check ep --comm local --world 8 --algo auto \
  --fault a2a-diverge --timeout 20
san_run "check kernels" "$DEEPINFER" check kernels

export DEEPINFER_EP_COMBINE=exact
san_run "check e2e EP 1" "$DEEPINFER" check e2e --model models/tiny --ep 1
hash=$(sed -n 's/^logits hash: //p' "$LOGS/check_e2e_EP_1.log")
if [[ -z $hash ]]; then
  echo "FAIL check e2e EP 1 printed no logits hash"
  san_failed=1
else
  for algo in ag a2a; do
    for ep in 2 4; do
      san_run "check e2e local EP $ep $algo" "$DEEPINFER" check e2e --model models/tiny --ep "$ep" --comm local \
        --algo "$algo" --expect-hash "$hash"
    done
  done
  san_run "check e2e mpi EP 2 a2a" "${MPIRUN[@]}" -np 2 "$DEEPINFER" check e2e --model models/tiny --ep 2 \
    --comm mpi --algo a2a --expect-hash "$hash"
fi
unset DEEPINFER_EP_COMBINE
san_run "diff clean" "$DEEPINFER" diff --model models/tiny --golden --max-tokens 3
san_run "diff EP 2" "$DEEPINFER" diff --model models/tiny --golden --max-tokens 3 --ep 2 --comm local
exit $san_failed
