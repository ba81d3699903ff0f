# `deepinfer serve` on models/tiny through real HTTP (issue 20's tests), with curl and a client on
# Python's standard library (tests/serve/serve_client.py, which prints most PASS/FAIL lines):
# greedy answers = `deepinfer generate`; streaming; stop strings; 400/401/404/413/429; 16
# concurrent greedy requests = each alone, at --ep 2 = --ep 1 = under mpirun; a client that
# disconnects frees its pages (seen in /metrics); SIGTERM finishes the running stream and exits 0;
# models/tiny-mtp with --speculative mtp answers the 16 requests as models/tiny does.
# Every server runs on a free port and is killed on exit. Logs: $BUILD_DIR/stage-logs/serve/.
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=${BUILD_DIR:-build}/stage-logs/serve
rm -rf "$LOGS"
mkdir -p "$LOGS"
MODEL=models/tiny
CLIENT=tests/serve/serve_client.py
failed=0
pids=()

report() {  # NAME OK DETAIL
  printf '%-4s %-52s %s\n' "$([[ $2 == 1 ]] && echo PASS || echo FAIL)" "$1" "$3"
  [[ $2 == 1 ]] || failed=1
}

cleanup() {  # every process this stage started: TERM (mpirun passes it on), then KILL
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    local alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    ((alive)) || return 0
    sleep 0.3
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
}
trap cleanup EXIT

# start_server NAME CMD...: runs CMD in the background (stderr to $LOGS/NAME.err) and waits for
# its `listening on http://HOST:PORT` line; sets pid and port. Returns 1 if it never listens.
start_server() {
  local name=$1
  shift
  "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" </dev/null &
  pid=$!
  pids+=("$pid")
  port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's|^listening on http://[^ ]*:\([0-9]*\)$|\1|p' "$LOGS/$name.err" | head -1)
    [[ -n $port ]] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $port ]]; then
    kill -0 "$pid" 2>/dev/null && why="still no 'listening on' line after 60 s" ||
      why="it exited without a 'listening on' line"
    report "$name: listening" 0 "$why"
    echo "  \$ $*"
    sed 's/^/  | /' "$LOGS/$name.err" | tail -5
    return 1
  fi
  echo "--- $name: port $port ($*)"
}

# client GROUP ARGS...: one group of checks of serve_client.py; its lines go to stdout.
client() {
  local group=$1
  shift
  timeout 180 python3 "$CLIENT" "$group" "$@" 2>&1 | tee -a "$LOGS/client-$group.log"
  local rc=${PIPESTATUS[0]}
  [[ $rc -eq 0 ]] || failed=1
  [[ $rc -eq 0 || $rc -eq 1 ]] || report "client $group" 0 "exit $rc (124: timed out)"
}

# wait_exit PID SECONDS: sets rc to the process's exit code, or 124 if it still runs by then.
wait_exit() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$1" 2>/dev/null; then
    rc=124
  else
    wait "$1"
    rc=$?
  fi
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

SERVE=("$DEEPINFER" serve --model "$MODEL")

echo "--- EP 2 over threads"
if start_server ep2 "${SERVE[@]}" --ep 2 --port 0; then
  a_pid=$pid a_port=$port
  client generate --port "$a_port" --deepinfer "$DEEPINFER" --model "$MODEL"
  client stream --port "$a_port"
  client stop --port "$a_port"
  client errors --port "$a_port"
  client concurrent --port "$a_port" --where "EP 2" --save "$LOGS/answers16.json"
  # curl as the client: the same greedy answer, and a stream that ends with [DONE].
  url=http://127.0.0.1:$a_port/v1/completions
  body='{"prompt": "The GNU General Public License is a free, copyleft license for", "max_tokens": 32, "temperature": 0}'
  curl -sS --max-time 60 "$url" -H 'Content-Type: application/json' -d "$body" >"$LOGS/curl.json" 2>&1
  got=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))["choices"][0]["text"]))' "$LOGS/curl.json" 2>&1)
  want=$(python3 -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))[0]))' "$LOGS/answers16.json" 2>&1)
  [[ $got == "$want" ]] && ok=1 || ok=0
  report "curl: the same greedy answer" $ok "$got"
  curl -sS -N --max-time 60 "$url" -H 'Content-Type: application/json' \
    -d "${body%\}}, \"stream\": true}" >"$LOGS/curl-stream.txt" 2>&1
  n=$(grep -c '^data: {' "$LOGS/curl-stream.txt")
  [[ $(tail -n 2 "$LOGS/curl-stream.txt" | head -1) == "data: [DONE]" && $n -gt 1 ]] && ok=1 || ok=0
  report "curl -N: SSE chunks, then data: [DONE]" $ok "$n chunks"
  client disconnect --port "$a_port"
  client sigterm --port "$a_port" --pid "$a_pid"
  wait_exit "$a_pid" 60
  [[ $rc -eq 0 ]] && grep -q '^serve: stopped$' "$LOGS/ep2.err" && ok=1 || ok=0
  report "SIGTERM: exit 0, 'serve: stopped'" $ok "exit $rc: $(tail -1 "$LOGS/ep2.err")"
fi

echo "--- EP 1, --api-key, --served-model-name"
if start_server ep1 "${SERVE[@]}" --ep 1 --port 0 --api-key s3cret --served-model-name tiny-x; then
  client auth --port "$port" --key s3cret --name tiny-x
  client concurrent --port "$port" --key s3cret --name tiny-x --compare "$LOGS/answers16.json" \
    --where "EP 1" --label "--ep 1 = --ep 2"
  kill -TERM "$pid"
  wait_exit "$pid" 30
  [[ $rc -eq 0 ]] && grep -q '^serve: stopped$' "$LOGS/ep1.err" && ok=1 || ok=0
  report "SIGTERM when idle: exit 0, 'serve: stopped'" $ok "exit $rc"
fi

echo "--- a full queue (--max-batch 1 --max-queue 1) and a request that never fits (--kv-pages 8)"
if start_server busy "${SERVE[@]}" --ep 2 --port 0 --max-batch 1 --max-queue 1 --kv-pages 8; then
  client busy --port "$port" --kv-pages 8
  kill -TERM "$pid"
  wait_exit "$pid" 30
fi

# Speculative decoding (docs/architecture.md §6.1): models/tiny-mtp's main model is models/tiny's
# byte for byte, so 16 concurrent greedy requests through its MTP module must answer as above.
echo "--- EP 2, models/tiny-mtp --speculative mtp --draft-tokens 2"
if start_server mtp "$DEEPINFER" serve --model models/tiny-mtp --served-model-name tiny --ep 2 --port 0 \
  --speculative mtp --draft-tokens 2; then
  client concurrent --port "$port" --compare "$LOGS/answers16.json" --where "EP 2 speculative" \
    --label "--speculative mtp = plain"
  kill -TERM "$pid"
  wait_exit "$pid" 30
  [[ $rc -eq 0 ]] && ok=1 || ok=0
  report "--speculative mtp: SIGTERM, exit 0" $ok "exit $rc"
fi

echo "--- EP 2 under mpirun"
# A port fixed in advance, so that /health can be polled from before the model loads.
m_port=$(free_port)
python3 "$CLIENT" health --port "$m_port" --timeout 90 >"$LOGS/client-health.log" 2>&1 &
health_pid=$!
pids+=("$health_pid")
if start_server mpirun mpirun --oversubscribe -np 2 "$DEEPINFER" serve --model "$MODEL" --port "$m_port"; then
  m_pid=$pid
  wait "$health_pid" || failed=1
  cat "$LOGS/client-health.log"
  client concurrent --port "$m_port" --compare "$LOGS/answers16.json" \
    --where mpirun --label "mpirun -np 2 = threads"
  # mpirun itself answers SIGTERM by killing the ranks after a second; rank 0's process (the one
  # listening) drains, and its last step plan ends rank 1.
  r0=$(ss -ltnpH "sport = :$m_port" 2>/dev/null | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  if [[ -n $r0 ]]; then
    client sigterm --port "$m_port" --pid "$r0"
    wait_exit "$m_pid" 60
    # Rank 0 alone says it listens and that it stopped.
    n=$(grep -c '^serve: stopped$' "$LOGS/mpirun.err")
    l=$(grep -c '^listening on http://' "$LOGS/mpirun.err")
    [[ $rc -eq 0 && $n -eq 1 && $l -eq 1 ]] && ok=1 || ok=0
    report "mpirun: SIGTERM to rank 0: all exit 0" $ok \
      "mpirun exit $rc, 'listening on' x $l, 'serve: stopped' x $n"
  else
    report "mpirun: rank 0's process" 0 "no process listens on port $m_port (ss -ltnp)"
  fi
else
  kill "$health_pid" 2>/dev/null
fi

exit $failed
