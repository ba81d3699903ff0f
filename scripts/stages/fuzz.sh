# libFuzzer targets over every parser of outside bytes (fuzz/): builds them with clang, ASan and
# UBSan into $FUZZ_BUILD_DIR (incrementally), runs each for FUZZ_SECONDS from a copy of its seed
# corpus, and fails on any crash, sanitizer report, leak or timeout. The input that triggered a
# finding is saved under $BUILD_DIR/stage-logs/fuzz/ (replay: $FUZZ_BUILD_DIR/bin/fuzz_NAME FILE).
# Not a default stage. FUZZ_TARGETS (space list) picks targets; FUZZ_RUNS runs that many inputs
# per target instead of FUZZ_SECONDS (a long run: FUZZ_RUNS=1000000), still bounded by
# FUZZ_MAX_SECONDS (14400) per target: a run cut by that bound passes but its note says so.
# Columns: executions; cov and ft, libFuzzer's coverage counters at the end of the run (edges
# reached, and features: edges with hit-count buckets, comparisons and more); peak RSS in MiB.
set -euo pipefail
FUZZ_BUILD_DIR=${FUZZ_BUILD_DIR:-build-fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-20}
FUZZ_RUNS=${FUZZ_RUNS:-}
FUZZ_MAX_SECONDS=${FUZZ_MAX_SECONDS:-14400}
LOGS=$(realpath -m "$BUILD_DIR/stage-logs/fuzz")
mkdir -p "$LOGS"

# Debian's clang and its compiler-rt (libclang_rt.fuzzer, the sanitizer runtimes), installed here
# on first use rather than by scripts/setup.sh: only this stage needs them.
PACKAGES=(clang libclang-rt-14-dev)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "fuzz: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [[ ! -f $FUZZ_BUILD_DIR/CMakeCache.txt ]]; then
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
  CC=clang CXX=clang++ cmake -S . -B "$FUZZ_BUILD_DIR" -G Ninja -DDEEPINFER_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_WERROR=ON "${launcher[@]}" >"$LOGS/configure.log" 2>&1 ||
    { tail -n 30 "$LOGS/configure.log"; echo "fuzz: configure failed ($LOGS/configure.log)"; exit 1; }
fi
cmake --build "$FUZZ_BUILD_DIR" -j "$(nproc)" >"$LOGS/build.log" 2>&1 ||
  { tail -n 40 "$LOGS/build.log"; echo "fuzz: build failed ($LOGS/build.log)"; exit 1; }

mapfile -t all < "$FUZZ_BUILD_DIR/fuzz_targets.txt"
read -r -a targets <<<"${FUZZ_TARGETS:-${all[*]}}"
limit=(-max_total_time="$FUZZ_SECONDS")
[[ -n $FUZZ_RUNS ]] && limit=(-runs="$FUZZ_RUNS" -max_total_time="$FUZZ_MAX_SECONDS")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
printf '%-20s %-6s %12s %6s %7s %7s %8s %s\n' target result executions cov ft rss_mb seconds note
for t in "${targets[@]}"; do
  bin=$FUZZ_BUILD_DIR/bin/fuzz_$t
  [[ -x $bin ]] || { printf '%-20s %-6s %s\n' "$t" FAIL "no $bin (not in fuzz/CMakeLists.txt?)"; failed=1; continue; }
  # The checked-in seeds stay as they are: libFuzzer adds what it finds to a copy.
  mkdir -p "$work/$t"
  cp -r "fuzz/corpus/$t/." "$work/$t/" 2>/dev/null || true
  log=$LOGS/$t.log
  dict=fuzz/$t.dict
  [[ -f $dict ]] || dict=fuzz/json.dict
  start=$(date +%s)
  # -timeout: one input taking longer is a finding; -rss_limit_mb: so is runaway memory.
  if "$bin" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -dict="$dict" -artifact_prefix="$LOGS/$t-" "$work/$t" >"$log" 2>&1; then
    r=PASS; note=""
  else
    r=FAIL; failed=1
    note=$(grep -oE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer)[^(]*|runtime error:.*|what\(\): .*|Test unit written to .*' "$log" | head -n 3 | paste -sd ' ' || true)
    note="${note:-see $log}"
  fi
  secs=$(($(date +%s) - start))
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+' || echo '?')
  ft=$(grep -oE 'ft: [0-9]+' "$log" | tail -n 1 | grep -oE '[0-9]+' || echo '?')
  rss=$(grep -oE 'stat::peak_rss_mb: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo '?')
  if [[ $r == PASS && -n $FUZZ_RUNS && $execs =~ ^[0-9]+$ && $execs -lt $FUZZ_RUNS ]]; then
    note="stopped by FUZZ_MAX_SECONDS before $FUZZ_RUNS executions"
  fi
  printf '%-20s %-6s %12s %6s %7s %7s %8s %s\n' "$t" "$r" "$execs" "$cov" "$ft" "$rss" "$secs" "$note"
done
((failed == 0)) || { echo "fuzz: findings above; inputs and logs in $LOGS"; exit 1; }
echo "fuzz: ${#targets[@]} targets clean (logs in $LOGS)"
