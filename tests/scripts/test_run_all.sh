#!/usr/bin/env bash
# scripts/run_all.sh against stub stages (RUN_ALL_STAGES_DIR), so nothing real runs:
#   1. every default stage present and passing: exit 0, each ran once, in the default order;
#   2. one stub failing: exit 1, the later stages still run;
#   3. a default stage without a script: exit 2 naming it, before any stage runs;
#   4. an unknown stage named on the command line (real stages dir too): exit 2 listing the stages.
# The default set is read from run_all.sh itself, so the test follows it.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
run_all=$root/scripts/run_all.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

read -ra defaults < <(sed -n 's/^DEFAULT_STAGES=(\(.*\))$/\1/p' "$run_all")
((${#defaults[@]} >= 2)) || { echo "FAIL: no DEFAULT_STAGES=(...) line in $run_all"; exit 1; }

stubs() {  # DIR [STAGE-TO-FAIL]: one stub per default stage, appending its name to DIR/ran
  mkdir -p "$1"
  for s in "${defaults[@]}"; do
    printf 'echo %s >>"%s/ran"\n' "$s" "$1" >"$1/$s.sh"
    [[ $s == "${2:-}" ]] && echo 'exit 1' >>"$1/$s.sh"
  done
}
run() {  # DIR ARGS...: run_all with stages from DIR; sets rc and out
  local dir=$1
  shift
  out=$(RUN_ALL_STAGES_DIR=$dir bash "$run_all" "$@" 2>&1)
  rc=$?
}

# 1. all present and passing
stubs "$tmp/ok"
run "$tmp/ok"
[[ $rc -eq 0 ]] || fail "all stubs pass: exit $rc, expected 0"
[[ $(paste -sd ' ' "$tmp/ok/ran" 2>/dev/null) == "${defaults[*]}" ]] ||
  fail "all stubs pass: ran '$(paste -sd ' ' "$tmp/ok/ran" 2>/dev/null)', expected '${defaults[*]}'"
grep -q "stages: ${#defaults[@]} passed, 0 failed" <<<"$out" || fail "all stubs pass: no summary line"

# 2. one failing stage: non-zero, the others still run
stubs "$tmp/failing" "${defaults[1]}"
run "$tmp/failing"
[[ $rc -eq 1 ]] || fail "one failing stub: exit $rc, expected 1"
[[ $(wc -l <"$tmp/failing/ran") -eq ${#defaults[@]} ]] || fail "one failing stub: not every stage ran"

# 3. a default stage without a script: exit 2 before anything runs
stubs "$tmp/missing"
gone=${defaults[-1]}
rm "$tmp/missing/$gone.sh"
run "$tmp/missing"
[[ $rc -eq 2 ]] || fail "missing default stage: exit $rc, expected 2"
grep -q "default stage without a script: $gone " <<<"$out" || fail "missing default stage: message lacks '$gone': $out"
[[ ! -e $tmp/missing/ran ]] || fail "missing default stage: stages ran before the error"

# 4. an unknown stage: exit 2, the message lists the stages there are
run "$root/scripts/stages" nosuchstage
[[ $rc -eq 2 ]] || fail "unknown stage: exit $rc, expected 2"
grep -q "unknown stage: nosuchstage " <<<"$out" || fail "unknown stage: message lacks the name: $out"
grep -q "stages: .*build.*unit" <<<"$out" || fail "unknown stage: message does not list the stages: $out"
stubs "$tmp/unknown"
run "$tmp/unknown" "${defaults[0]}" nosuchstage
[[ $rc -eq 2 ]] || fail "unknown stage after a known one: exit $rc, expected 2"
[[ ! -e $tmp/unknown/ran ]] || fail "unknown stage after a known one: '${defaults[0]}' ran before the error"

((failures == 0)) && echo "run_all: 4 cases passed"
exit $((failures > 0))
