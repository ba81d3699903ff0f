#!/usr/bin/env bash
# Staged test runner. Each stage is scripts/stages/<name>.sh; each is timed and a PASS/FAIL
# summary table is printed at the end. Exit code is non-zero if any stage failed.
# Usage: scripts/run_all.sh [stage...]     (no stage = the default CI set)
# Stages: build format unit collectives ep engram kernels e2e diff cli serve   explicit only: large reference bench fuzz multihost asan tsan
# Every stage asked for (or, with none named, every default stage) must exist: a missing or
# unknown one is an error (exit 2) before anything runs, never a stage silently skipped.
# RUN_ALL_STAGES_DIR replaces scripts/stages (the runner's own test points it at stubs).
set -uo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export BUILD_DIR=${BUILD_DIR:-build}
export DEEPINFER=${DEEPINFER:-$BUILD_DIR/bin/deepinfer}

STAGES_DIR=${RUN_ALL_STAGES_DIR:-scripts/stages}
DEFAULT_STAGES=(build format unit collectives ep engram kernels e2e diff cli serve)
stages=("$@")
((${#stages[@]})) || stages=("${DEFAULT_STAGES[@]}")

missing=()
for s in "${stages[@]}"; do [[ -f $STAGES_DIR/$s.sh ]] || missing+=("$s"); done
if ((${#missing[@]})); then
  have=$(find "$STAGES_DIR" -maxdepth 1 -name '*.sh' -printf '%f\n' 2>/dev/null | sed 's/\.sh$//' | sort | paste -sd ' ')
  if (($#)); then what="unknown stage"; else what="default stage without a script"; fi
  echo "run_all: $what: ${missing[*]} (no $STAGES_DIR/<stage>.sh; stages: ${have:-none}; default: ${DEFAULT_STAGES[*]})" >&2
  exit 2
fi

names=(); results=(); times=(); failed=0
for s in "${stages[@]}"; do
  script=$STAGES_DIR/$s.sh
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
