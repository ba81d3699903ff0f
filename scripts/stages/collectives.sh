# Collective conformance (docs/architecture.md §3, §7): `deepinfer check collectives` on `local` at
# 1..64 ranks and on `mpi` at 1..8, then every injected fault, which the suite must catch: a
# non-zero exit AND output naming the broken op (and the timeout, for hangs and dead ranks).
# One line per run; the full output of each run is in $BUILD_DIR/stage-logs/collectives/.
# 16 and 64 ranks over mpi: scripts/stages/large.sh (explicit stage `large`).
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=${BUILD_DIR:-build}/stage-logs/collectives
mkdir -p "$LOGS"
# Oversubscribed on a small machine: never bind, and yield while waiting.
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
RUN_LIMIT_S=300   # no single run may take longer than this (the suite's own deadlines are shorter)
HANG_TIMEOUT=2    # --timeout for the faults that hang or kill a rank

failed=0
# check NAME EXPECT PATTERN -- COMMAND...
#   EXPECT=pass: exit 0 and the last line says 0 failed.
#   EXPECT=fail: non-zero exit, and every `|`-free regex in PATTERN (separated by ` && `) appears.
#   EXPECT=fail:N: as fail, and the exit status is exactly N (3 = a collective timed out).
check() {
  local name=$1 expect=$2 pattern=$3
  shift 4
  local log="$LOGS/${name// /_}.log"
  local start=$(date +%s%N)
  timeout "$RUN_LIMIT_S" "$@" >"$log" 2>&1
  local rc=$?
  local secs=$(( ($(date +%s%N) - start) / 1000000 ))
  local ok=1 why=""
  local summary=$(grep -a 'collectives: [0-9]* passed' "$log" | tail -1)
  if [[ $expect == pass ]]; then
    [[ $rc -eq 0 ]] || { ok=0; why="exit $rc"; }
    [[ $summary =~ passed,\ 0\ failed ]] || { ok=0; why="$why; no '0 failed' summary"; }
  else
    [[ $rc -ne 0 ]] || { ok=0; why="exit 0 under a fault"; }
    if [[ $expect == fail:* && $rc -ne ${expect#fail:} ]]; then ok=0; why="$why; exit $rc, expected ${expect#fail:}"; fi
    local p
    while IFS= read -r p; do
      grep -aEq -- "$p" "$log" || { ok=0; why="$why; output lacks /$p/"; }
    done < <(echo "$pattern" | sed 's/ && /\n/g')
    [[ $rc -eq 124 ]] && { ok=0; why="$why; killed after ${RUN_LIMIT_S}s"; }
  fi
  printf '%-4s %-40s %4d.%ds  %s\n' "$([[ $ok == 1 ]] && echo PASS || echo FAIL)" "$name" \
    $((secs / 1000)) $((secs % 1000 / 100)) "${summary:-exit $rc}${why:+  [$why]}"
  if [[ $ok != 1 ]]; then
    failed=1
    echo "---- last lines of $log:"
    tail -n 15 "$log" | cut -c1-300
    echo "----"
  fi
}

for w in 1 2 3 4 8 16 32 64; do
  check "local world $w" pass "" -- "$DEEPINFER" check collectives --comm local --world "$w"
done
for w in 1 2 3 4 8; do
  check "mpi world $w" pass "" -- "${MPIRUN[@]}" -np "$w" "$DEEPINFER" check collectives --comm mpi
done

# Capabilities: a healthy run trusts both lowerings, a2a-diverge loses all_to_all_v only.
caps_ok="$LOGS/capabilities-local.json" caps_bad="$LOGS/capabilities-a2a-diverge.json"
rm -f "$caps_ok" "$caps_bad"
check "local world 4 --save-capabilities" pass "" -- \
  "$DEEPINFER" check collectives --comm local --world 4 --quick --save-capabilities "$caps_ok"

# Faults: the suite must fail and say where.
check "fault int32-ag-corrupt local 16" fail:1 \
  'FAIL all_gather i32 >=1MiB at 16 ranks: [0-9]+ wrong elements, first on rank [0-9]+ at src rank [0-9]+ index [0-9]+: expected -?[0-9]+ got -?[0-9]+' -- \
  "$DEEPINFER" check collectives --comm local --world 16 --quick --fault int32-ag-corrupt
check "fault a2a-diverge local 8" fail:1 \
  'FAIL all_to_all_v [a-z0-9]+ mixed .* wrong elements' -- \
  "$DEEPINFER" check collectives --comm local --world 8 --quick --fault a2a-diverge --save-capabilities "$caps_bad"
check "fault a2av-hang local 8" fail:3 \
  'all_to_all_v .*uneven.* timed out after 2.0 s && collectives: stopped on rank 0 after a timeout in all_to_all_v' -- \
  "$DEEPINFER" check collectives --comm local --world 8 --quick --fault a2av-hang --timeout "$HANG_TIMEOUT"
check "fault rank-exit local 8" fail:3 \
  'timed out after 2.0 s && rank 7 of 8 dies in the middle of && collectives: stopped on rank 0 after a timeout' -- \
  "$DEEPINFER" check collectives --comm local --world 8 --quick --fault rank-exit --timeout "$HANG_TIMEOUT"
check "fault a2a-diverge mpi 4" fail \
  'FAIL all_to_all_v [a-z0-9]+ mixed .* wrong elements' -- \
  "${MPIRUN[@]}" -np 4 "$DEEPINFER" check collectives --comm mpi --quick --fault a2a-diverge
check "fault a2av-hang mpi 4" fail \
  'collectives: stopped on rank 0 after a timeout in all_to_all_v .*timed out after 2.0 s' -- \
  "${MPIRUN[@]}" -np 4 "$DEEPINFER" check collectives --comm mpi --quick --fault a2av-hang --timeout "$HANG_TIMEOUT"
# mpi: the dead process makes mpirun end the job; the run must still fail and name the rank.
check "fault rank-exit mpi 4" fail \
  'rank 3 of 4 dies in the middle of' -- \
  "${MPIRUN[@]}" -np 4 "$DEEPINFER" check collectives --comm mpi --quick --fault rank-exit --timeout "$HANG_TIMEOUT"

# The mpi backend's own closed-form and failure-probe tests (tests/comm, ctest label `mpi`).
if ctest --test-dir "${BUILD_DIR:-build}" -L mpi --output-on-failure >"$LOGS/ctest_mpi.log" 2>&1; then
  echo "PASS ctest -L mpi: $(grep -a 'tests passed' "$LOGS/ctest_mpi.log" | tail -1)"
else
  echo "FAIL ctest -L mpi (log: $LOGS/ctest_mpi.log)"
  failed=1
fi

caps_line() { tr -d ' \n' <"$1" 2>/dev/null; }
if [[ $(caps_line "$caps_ok") == *'"all_to_all":true'*'"all_to_all_v":true'* ]] &&
   [[ $(caps_line "$caps_bad") == *'"all_to_all":true'*'"all_to_all_v":false'* ]]; then
  echo "PASS capabilities files: healthy trusts all_to_all(_v); a2a-diverge distrusts all_to_all_v"
else
  echo "FAIL capabilities files: healthy: $(caps_line "$caps_ok")  a2a-diverge: $(caps_line "$caps_bad")"
  failed=1
fi
exit $failed
