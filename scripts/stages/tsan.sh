# ThreadSanitizer (issue 24): what runs threads in one process, built with gcc -fsanitize=thread
# (-O1, line tables) into $TSAN_BUILD_DIR (build-tsan, incrementally, with ccache), then under it:
#   thread pool   core_tests ThreadPool.* (the kernels' worker pool)
#   local         comm_tests (the local backend: ranks as threads, its collectives, deadlines and
#                 failures) and check collectives on local at 2, 5 ranks and with a rank exiting
#   ep            ep_tests (EPBuffer and EngramBuffer over rank threads) and check ep / check
#                 engram on local at 2, 4 ranks
#   serve         serve_tests, and a short session of `deepinfer serve --ep 2` (rank threads,
#                 the HTTP threads and the scheduler): one greedy request, a stream, 16
#                 concurrent requests, a client disconnecting mid-stream, SIGTERM
# Any ThreadSanitizer report fails its run (halt_on_error=0: a run reports every race it meets,
# then exits 66). No suppressions are needed: nothing here runs MPI. About 10 minutes on 2 cores.
# Not a default stage. Logs: $TSAN_BUILD_DIR/stage-logs/tsan/.
set -uo pipefail
source scripts/sanitize/build.sh
source scripts/sanitize/run.sh
export BUILD_DIR=${TSAN_BUILD_DIR:-build-tsan}
DEEPINFER=$BUILD_DIR/bin/deepinfer
LOGS=$BUILD_DIR/stage-logs/tsan
mkdir -p "$LOGS"
export TSAN_OPTIONS="halt_on_error=0:exitcode=66:second_deadlock_stack=1:history_size=4"
export DEEPINFER_COMM_TIMEOUT_S=${DEEPINFER_COMM_TIMEOUT_S:-120}
BIN=$BUILD_DIR/bin

echo "--- build ($BUILD_DIR)"
sanitize_build thread "$LOGS" deepinfer core_tests comm_tests ep_tests serve_tests || exit 1

echo "--- runs (one line each; logs in $LOGS)"
san_run "thread pool: core_tests ThreadPool.*" "$BIN/core_tests" --gtest_filter='ThreadPool*'
san_run "local backend: comm_tests" "$BIN/comm_tests"
for w in 2 5; do
  san_run "check collectives local $w" "$DEEPINFER" check collectives --comm local --world "$w" --quick
done
san_run "check collectives local 8 fault rank-exit" bash -c '"$1" check collectives --comm local --world 8 \
  --quick --fault rank-exit --timeout 2; rc=$?; echo "exit $rc"; [[ $rc -eq 3 ]]' _ "$DEEPINFER"
san_run "ep: ep_tests" "$BIN/ep_tests"
for w in 2 4; do
  san_run "check ep local $w" "$DEEPINFER" check ep --comm local --world "$w"
  san_run "check engram local $w" "$DEEPINFER" check engram --comm local --world "$w"
done
san_run "serve: serve_tests" "$BIN/serve_tests"

# A short serve session. The server's stderr is checked after it exits (TSan reports at exit too).
echo "--- serve --ep 2 session"
"$DEEPINFER" serve --model models/tiny --ep 2 --port 0 >"$LOGS/serve.out" 2>"$LOGS/serve.err" </dev/null &
pid=$!
trap 'kill -KILL $pid 2>/dev/null' EXIT
port=""
for _ in $(seq 1 1200); do
  port=$(sed -n 's|^listening on http://[^ ]*:\([0-9]*\)$|\1|p' "$LOGS/serve.err" | head -1)
  [[ -n $port ]] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [[ -z $port ]]; then
  echo "FAIL serve: no 'listening on' line (log: $LOGS/serve.err)"
  tail -n 20 "$LOGS/serve.err"
  exit 1
fi
for group in generate stream concurrent disconnect; do
  san_run "serve client: $group" python3 tests/serve/serve_client.py "$group" --port "$port" \
    --deepinfer "$DEEPINFER" --model models/tiny --where "EP 2 under TSan"
done
kill -TERM "$pid"
for _ in $(seq 1 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
  rc=124
else
  wait "$pid"
  rc=$?
fi
reports=$(grep -aEc "$SAN_REPORT" "$LOGS/serve.err")
if [[ $rc -eq 0 && $reports -eq 0 ]]; then
  echo "PASS serve --ep 2 session: exit 0 after SIGTERM, no report"
else
  echo "FAIL serve --ep 2 session: exit $rc, $reports report line(s) (log: $LOGS/serve.err)"
  grep -aE -A12 "$SAN_REPORT" "$LOGS/serve.err" | head -n 60 | cut -c1-240
  san_failed=1
fi
exit $san_failed
