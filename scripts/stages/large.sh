# Explicit stage (not in CI): the collective conformance suite over mpi at 16 and 64 ranks,
# every dtype at >= 1 MiB (--full) at 16, and the int32-ag-corrupt fault over mpi at 16
# (it fires at >= 16 ranks), which must fail and name the op. Oversubscribed: slow but bounded.
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=${BUILD_DIR:-build}/stage-logs/large
mkdir -p "$LOGS"
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
TIMEOUT_S=300  # per collective: 64 processes on a few cores are slow, not hung
failed=0

run() {  # NAME EXPECT(pass|fail) PATTERN -- COMMAND...
  local name=$1 expect=$2 pattern=$3
  shift 4
  local log="$LOGS/${name// /_}.log" start=$(date +%s)
  timeout 3600 "$@" >"$log" 2>&1
  local rc=$? ok=1
  local summary=$(grep -a 'collectives: [0-9]* passed' "$log" | tail -1)
  if [[ $expect == pass ]]; then
    [[ $rc -eq 0 && $summary =~ passed,\ 0\ failed ]] || ok=0
  else
    [[ $rc -ne 0 ]] && grep -aEq -- "$pattern" "$log" || ok=0
  fi
  printf '%-4s %-36s %5ds  %s\n' "$([[ $ok == 1 ]] && echo PASS || echo FAIL)" "$name" $(($(date +%s) - start)) \
    "${summary:-exit $rc}"
  if [[ $ok != 1 ]]; then
    failed=1
    tail -n 15 "$log" | cut -c1-300
  fi
}

run "mpi world 16 --full" pass "" -- \
  "${MPIRUN[@]}" -np 16 "$DEEPINFER" check collectives --comm mpi --full --timeout "$TIMEOUT_S"
run "mpi world 64" pass "" -- \
  "${MPIRUN[@]}" -np 64 "$DEEPINFER" check collectives --comm mpi --timeout "$TIMEOUT_S"
run "fault int32-ag-corrupt mpi 16" fail \
  'FAIL all_gather i32 >=1MiB at 16 ranks: [0-9]+ wrong elements, first on rank [0-9]+ at src rank [0-9]+ index [0-9]+: expected' -- \
  "${MPIRUN[@]}" -np 16 "$DEEPINFER" check collectives --comm mpi --quick --fault int32-ag-corrupt --timeout "$TIMEOUT_S"
run "local world 64 --full" pass "" -- \
  "$DEEPINFER" check collectives --comm local --world 64 --full --timeout "$TIMEOUT_S"
# EPBuffer at 64 ranks over mpi, and the > 2 GiB message tests of the mpi backend.
if bash scripts/stages/large_ep.sh; then echo "PASS large_ep"; else echo "FAIL large_ep"; failed=1; fi
if ctest --test-dir "${BUILD_DIR:-build}" -L large --output-on-failure; then echo "PASS ctest -L large"; else echo "FAIL ctest -L large"; failed=1; fi
exit $failed
