#!/usr/bin/env bash
# Staged test runner. Each stage is scripts/stages/<name>.sh; each is timed and a PASS/FAIL
# summary table is printed at the end. Exit code is non-zero if any stage failed.
# Usage: scripts/run_all.sh [stage...]     (no stage = the default CI set)
# Stages: build unit collectives ep kernels e2e diff cli   explicit only: large reference bench
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export BUILD_DIR=${BUILD_DIR:-build}
export DEEPINFER=${DEEPINFER:-$BUILD_DIR/bin/deepinfer}

DEFAULT_STAGES=(build unit collectives ep kernels e2e diff cli)
stages=("$@")
((${#stages[@]})) || stages=("${DEFAULT_STAGES[@]}")

names=(); results=(); times=(); failed=0
for s in "${stages[@]}"; do
  script=scripts/stages/$s.sh
  if [[ ! -f $script ]]; then
    if [[ $# -eq 0 ]]; then continue; fi  # default stage not built yet
    echo "run_all: unknown stage '$s' (have: $(ls scripts/stages | sed 's/\.sh$//' | tr '\n' ' '))" >&2
    exit 2
  fi
  echo "=== stage $s ==="
  start=$(date +%s%N)
  if bash "$script"; then r=PASS; else r=FAIL; failed=1; fi
  end=$(date +%s%N)
  names+=("$s"); results+=("$r"); ms=$(((end - start) / 1000000)); times+=("$((ms / 1000)).$(((ms % 1000) / 100))")
done

echo
echo "=== run_all summary ==="
printf '%-14s %-6s %10s\n' stage result seconds
pass=0; fail=0
for i in "${!names[@]}"; do
  printf '%-14s %-6s %10s\n' "${names[$i]}" "${results[$i]}" "${times[$i]}"
  [[ ${results[$i]} == PASS ]] && pass=$((pass + 1)) || fail=$((fail + 1))
done
echo "stages: $pass passed, $fail failed"
exit $failed
