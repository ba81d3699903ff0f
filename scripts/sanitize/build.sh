# Sourced by scripts/stages/asan.sh and tsan.sh: configures (once) and builds a sanitizer build
# of the whole tree into $BUILD_DIR with gcc, ccache when present, -O1 and line tables, checks
# kept on. Usage: sanitize_build SANITIZERS LOGS [TARGET...]   (no target = everything)
sanitize_build() {
  local sanitizers=$1 logs=$2
  shift 2
  if [[ ! -f $BUILD_DIR/CMakeCache.txt ]]; then
    local launcher=()
    command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
    # -fno-sanitize-recover: a UBSan report aborts the process, so the run that hit it fails.
    CC=gcc CXX=g++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DDEEPINFER_SANITIZE="$sanitizers" -DCMAKE_CXX_FLAGS="-fno-sanitize-recover=all" \
      -DDEEPINFER_WERROR=ON "${launcher[@]}" >"$logs/configure.log" 2>&1 ||
      { tail -n 30 "$logs/configure.log"; echo "configure failed ($logs/configure.log)"; return 1; }
  fi
  local targets=()
  (($#)) && targets=(--target "$@")
  cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}" >"$logs/build.log" 2>&1 ||
    { grep -E 'error|FAILED' "$logs/build.log" | head -n 20; echo "build failed ($logs/build.log)"; return 1; }
}
