# multihost (explicit only: needs root and network namespaces): deepinfer on 2 "hosts" of this
# machine (scripts/fake-hosts: each a network namespace with its own address and hostname, Open
# MPI's daemon started in it), 4 ranks, 2 per host: across hosts the ranks talk over TCP and share
# no memory window.
# - check collectives, check ep and check e2e (the same logits hash as on one host);
# - generate with the other host killed mid-run, and with it partitioned (link down, its
#   processes live on);
# - serve with a streaming and a non-streamed request open when the other host is killed, and
#   when it is partitioned: the stream ends with an SSE error event, the other with HTTP 5xx.
# Each failure must end every deepinfer process on every host, and the launch with a non-zero
# status and a message naming the failure, within DEEPINFER_COMM_TIMEOUT_S + 30 s; the timings
# are printed and kept in $BUILD_DIR/stage-logs/multihost/timings.txt. mpirun bounds its own
# wait on a host it cannot reach through the oob_tcp_keepalive_* options below (README: running
# on a cluster). Last, the watchdog of a rank whose MPI_Abort never returns: with a host cut off
# and mpirun without those options, every rank must still end; and with MPI_Abort made to loop
# forever (opal_abort_delay -1), the ranks end themselves. The hosts are removed on exit.
# MULTIHOST_CASES picks parts (checks generate serve watchdog); MULTIHOST_TIMEOUT_S sets
# DEEPINFER_COMM_TIMEOUT_S (20).
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=$(realpath -m "${BUILD_DIR:-build}/stage-logs/multihost")
rm -rf "$LOGS"
mkdir -p "$LOGS"
MODEL=models/tiny
CLIENT=tests/serve/serve_client.py
FH=$(realpath scripts/fake-hosts)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # the stage runs as root
export DEEPINFER_COMM_TIMEOUT_S=${MULTIHOST_TIMEOUT_S:-20}
BOUND=$((DEEPINFER_COMM_TIMEOUT_S + 30))  # seconds from a failure to every process gone
# mpirun's own wait on a daemon it cannot reach: TCP keepalive on its daemons' connections
# declares such a host lost after at most 4 + 3 x 2 = 10 s of silence, before the ranks' deadline
# (it must be shorter: once mpirun has sent a message the partitioned daemon never acknowledges,
# keepalive no longer applies and mpirun waits for TCP's retransmissions: minutes).
MPI_OPTS=(--mca oob_tcp_keepalive_time 4 --mca oob_tcp_keepalive_intvl 2
  --mca oob_tcp_keepalive_probes 3 -x DEEPINFER_COMM_TIMEOUT_S)
HOST1=10.78.0.11  # fh1's address: rank 0's host, where serve listens
read -r -a CASES <<<"${MULTIHOST_CASES:-checks generate serve watchdog}"
want() { [[ " ${CASES[*]} " == *" $1 "* ]]; }
failed=0

report() {  # NAME OK DETAIL
  printf '%-4s %-52s %s\n' "$([[ $2 == 1 ]] && echo PASS || echo FAIL)" "$1" "$3"
  [[ $2 == 1 ]] || failed=1
}

if [[ $(id -u) -ne 0 ]]; then
  echo "multihost: needs root (it creates network namespaces); run it as root or with sudo"
  exit 1
fi
# iproute2 (ip netns) and util-linux (unshare), installed on first use like scripts/setup.sh does.
PACKAGES=(iproute2 util-linux)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "multihost: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cleanup() {  # the launches still running (mpirun itself: it lives outside the hosts), then the hosts
  local f
  for f in "$LOGS"/*.pid; do
    [[ -f $f && ! -s ${f%.pid}.end ]] && kill -KILL "$(cat "$f")" 2>/dev/null
  done
  "$FH" down >/dev/null 2>&1
  wait
}
trap cleanup EXIT

# What names the failed host in the launch's stderr: mpirun's "Remote daemon: [[j,0],2] on node
# fh2" (after "ORTE has lost communication with a remote daemon"), Open MPI's "Peer host: fh2", or
# a rank's deadline message.
NAMES_FH2="Remote daemon: .* on node fh2|Peer host: +fh2|timed out after"

hosts_up() {
  "$FH" down >/dev/null 2>&1
  "$FH" up 2 >"$LOGS/fake-hosts.log" 2>&1 || {
    report "fake-hosts up 2" 0 "$(tail -1 "$LOGS/fake-hosts.log")"
    exit 1
  }
}

# deepinfer processes still alive on any host (their pids, space-separated).
deepinfer_pids() {
  local h p
  for h in fh1 fh2; do
    for p in $(ip netns pids "$h" 2>/dev/null); do
      [[ $(cat "/proc/$p/comm" 2>/dev/null) == deepinfer ]] && printf '%s ' "$p"
    done
  done
}

since() { awk -v a="$(date +%s.%N)" -v b="$1" 'BEGIN { printf "%.1f", a - b }'; }

# launch NAME ARGS...: `fake-hosts mpirun -np 4 deepinfer ARGS` in the background; its stdout and
# stderr go to $LOGS/NAME.out/.err, mpirun's pid to NAME.pid, its exit status and end time to
# NAME.rc and NAME.end.
launch() {
  local name=$1
  shift
  (
    "$FH" mpirun "${MPI_OPTS[@]}" -np 4 "$DEEPINFER" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" </dev/null &
    echo $! >"$LOGS/$name.pid"
    wait $!
    echo $? >"$LOGS/$name.rc"
    date +%s.%N >"$LOGS/$name.end"
  ) 2>/dev/null &  # (not bash's "Killed" when the stage ends a launch)
}

# fail NAME ACTION: fake-hosts ACTION fh2 (kill | partition), the moment noted in $LOGS/NAME.t0.
fail_host() {
  date +%s.%N >"$LOGS/$1.t0"
  "$FH" "$2" fh2
}

# watch NAME &: waits for the failure ($LOGS/NAME.t0), then polls until no deepinfer process is
# left on any host and the launch has ended, or BOUND + 15 s; writes "procs_s launch_s launch_rc"
# (seconds after the failure, "never" if not by then) to $LOGS/NAME.watch.
watch() {
  local name=$1 t0 el procs_s=never launch_s=never launch_rc=none
  for _ in $(seq 1 3000); do
    [[ -s $LOGS/$name.t0 ]] && break
    sleep 0.1
  done
  t0=$(cat "$LOGS/$name.t0" 2>/dev/null) || return
  for _ in $(seq 1 $(((BOUND + 15) * 5))); do
    el=$(since "$t0")
    [[ $procs_s == never && -z $(deepinfer_pids) ]] && procs_s=$el
    if [[ $launch_s == never && -s $LOGS/$name.end ]]; then
      launch_s=$(awk -v a="$(cat "$LOGS/$name.end")" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
      launch_rc=$(cat "$LOGS/$name.rc")
    fi
    [[ $procs_s != never && $launch_s != never ]] && break
    sleep 0.2
  done
  local left
  left=$(deepinfer_pids)
  [[ -n $left ]] && echo "  deepinfer processes left after $((BOUND + 15)) s: $left"
  echo "$procs_s $launch_s $launch_rc" >"$LOGS/$name.watch"
}

# judge NAME WHAT ERROR_RE: the failure case's verdicts from watch's figures and the launch's
# stderr, which must match ERROR_RE (the message that names the failure).
judge() {
  local name=$1 what=$2 re=$3 ok msg procs_s=never launch_s=never launch_rc=none
  [[ -s $LOGS/$name.watch ]] && read -r procs_s launch_s launch_rc <"$LOGS/$name.watch"
  echo "$what: every deepinfer process gone after $procs_s s, launch ended after $launch_s s" \
    "(exit $launch_rc)" | tee -a "$LOGS/timings.txt"
  [[ $procs_s != never ]] && awk -v t="$procs_s" -v b="$BOUND" 'BEGIN { exit !(t <= b) }' && ok=1 || ok=0
  report "$what: every deepinfer process exits <= ${BOUND} s" $ok "$procs_s s"
  [[ $launch_s != never ]] && awk -v t="$launch_s" -v b="$BOUND" 'BEGIN { exit !(t <= b) }' && ok=1 || ok=0
  report "$what: the launch exits <= ${BOUND} s" $ok "$launch_s s"
  [[ $launch_rc != none && $launch_rc -ne 0 ]] && ok=1 || ok=0
  report "$what: the launch exits non-zero" $ok "exit $launch_rc"
  msg=$(grep -m1 -E "$re" "$LOGS/$name.err")
  [[ -n $msg ]] && ok=1 || ok=0
  report "$what: the error names the failure" $ok "${msg:-no line matches /$re/ in $LOGS/$name.err}"
}

checks() {
  hosts_up
  echo "--- 2 hosts: $(tr '\n' ' ' <"/tmp/fake-hosts/hostfile")"
  placement=$("$FH" mpirun -np 4 hostname 2>&1 </dev/null | sort | uniq -c | awk '{printf "%s x%s ", $2, $1}')
  [[ $placement == "fh1 x2 fh2 x2 " ]] && ok=1 || ok=0
  report "mpirun -np 4: 2 ranks on each host" $ok "$placement"

  echo "--- check collectives, check ep, check e2e at 4 ranks on 2 hosts"
  for what in collectives ep; do
    "$FH" mpirun "${MPI_OPTS[@]}" -np 4 "$DEEPINFER" check "$what" --comm mpi \
      >"$LOGS/check-$what.out" 2>&1 </dev/null
    rc=$?
    last=$(grep -E "^$what: [0-9]+ passed, [0-9]+ failed" "$LOGS/check-$what.out" | tail -1)
    [[ $rc -eq 0 && $last =~ ,\ 0\ failed ]] && ok=1 || ok=0
    report "check $what (mpi, 2 hosts x 2 ranks)" $ok "exit $rc: ${last:-no summary line}"
  done
  # Across hosts there is no shared window: the peer-memory ops are not in the conformance table.
  grep -q "expose" "$LOGS/check-collectives.out" && ok=0 || ok=1
  report "no peer memory across hosts" $ok "$(grep -c . "$LOGS/check-collectives.out") lines, none 'expose'"
  base=$("$DEEPINFER" check e2e --model "$MODEL" --ep 1 2>&1 | sed -n 's/^logits hash: //p')
  "$FH" mpirun "${MPI_OPTS[@]}" -np 4 "$DEEPINFER" check e2e --model "$MODEL" --ep 4 --comm mpi \
    --expect-hash "${base:-none}" >"$LOGS/check-e2e.out" 2>&1 </dev/null
  rc=$?
  got=$(sed -n 's/^logits hash: //p' "$LOGS/check-e2e.out" | head -1)
  [[ $rc -eq 0 && -n $base && $got == "$base" ]] && ok=1 || ok=0
  report "check e2e: the logits hash of one host" $ok "exit $rc: $got (one host, EP 1: ${base:-none})"
}

# generate_case ACTION: one prompt, up to 3000 tokens (rank 0 streams them; every rank joins every
# MoE layer); once the text flows, fh2 fails.
generate_case() {
  local action=$1 name=generate-$1 i
  hosts_up
  launch "$name" generate --model "$MODEL" --max-tokens 3000 --ignore-eos \
    --prompt "The GNU General Public License is a free, copyleft license for"
  for i in $(seq 1 900); do
    [[ -s $LOGS/$name.end || $(stat -c %s "$LOGS/$name.out" 2>/dev/null || echo 0) -gt 200 ]] && break
    sleep 0.1
  done
  if [[ -s $LOGS/$name.end ]]; then
    report "generate, fh2 ${action}ed: the run was still going" 0 \
      "it ended first (exit $(cat "$LOGS/$name.rc")): $(tail -2 "$LOGS/$name.err" | tr '\n' ' ')"
    return
  fi
  echo "--- generate: fh2 ${action}ed mid-run"
  watch "$name" &
  local watcher=$!
  fail_host "$name" "$action"
  wait "$watcher"
  judge "$name" "generate, fh2 ${action}ed" \
    "$NAMES_FH2"
}

# serve_case ACTION: serve at 4 ranks (rank 0 listens on fh1); the client opens a streaming and a
# non-streamed request, then fails fh2.
serve_case() {
  local action=$1 name=serve-$1 port=8000 i
  hosts_up
  launch "$name" serve --model "$MODEL" --host 0.0.0.0 --port "$port"
  for i in $(seq 1 900); do
    grep -q '^listening on http://' "$LOGS/$name.err" 2>/dev/null && break
    [[ -s $LOGS/$name.end ]] && break
    sleep 0.1
  done
  if ! grep -q '^listening on http://' "$LOGS/$name.err"; then
    report "serve, fh2 ${action}ed: listening" 0 "$(tail -3 "$LOGS/$name.err" | tr '\n' ' ')"
    return
  fi
  echo "--- serve: fh2 ${action}ed with a stream and a non-streamed request open"
  watch "$name" &
  local watcher=$!
  timeout $((BOUND + 60)) python3 "$CLIENT" failover --host "$HOST1" --port "$port" \
    --timeout $((BOUND + 30)) --then "date +%s.%N >$LOGS/$name.t0 && $FH $action fh2" 2>&1 |
    tee "$LOGS/client-$name.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || failed=1
  if [[ ! -s $LOGS/$name.t0 ]]; then
    report "serve, fh2 ${action}ed: the host failed" 0 "the client did not get that far"
    kill "$watcher" 2>/dev/null
    return
  fi
  wait "$watcher"
  judge "$name" "serve, fh2 ${action}ed" \
    "$NAMES_FH2"
}

# The watchdog: mpirun with Open MPI's default keepalive cannot give up on a partitioned host (it
# waits on TCP's retransmissions), but every rank must still end: those that reach mpirun are
# killed after their MPI_Abort, those behind the cut end themselves after the abort's grace.
watchdog_case() {
  local name=watchdog i
  hosts_up
  local opts=("${MPI_OPTS[@]}")
  MPI_OPTS=(-x DEEPINFER_COMM_TIMEOUT_S)
  launch "$name" generate --model "$MODEL" --max-tokens 3000 --ignore-eos \
    --prompt "The GNU General Public License is a free, copyleft license for"
  MPI_OPTS=("${opts[@]}")
  for i in $(seq 1 900); do
    [[ -s $LOGS/$name.end || $(stat -c %s "$LOGS/$name.out" 2>/dev/null || echo 0) -gt 200 ]] && break
    sleep 0.1
  done
  echo "--- generate: fh2 partitioned mid-run, mpirun without the keepalive options"
  watch "$name" &
  local watcher=$!
  fail_host "$name" partition
  wait "$watcher"
  local procs_s=never launch_s=never launch_rc=none ok
  read -r procs_s launch_s launch_rc <"$LOGS/$name.watch"
  echo "partitioned, default keepalive: every deepinfer process gone after $procs_s s," \
    "mpirun ended after $launch_s s" | tee -a "$LOGS/timings.txt"
  [[ $procs_s != never ]] && awk -v t="$procs_s" -v b="$BOUND" 'BEGIN { exit !(t <= b) }' && ok=1 || ok=0
  report "default keepalive: every deepinfer process exits <= ${BOUND} s" $ok "$procs_s s"
  msg=$(grep -m1 -E "timed out" "$LOGS/$name.err")
  [[ -n $msg ]] && ok=1 || ok=0
  report "default keepalive: the ranks name the timeout" $ok "${msg:-no 'timed out' in $LOGS/$name.err}"
  [[ $launch_s == never ]] && echo "  (mpirun still waits on fh2's daemon, as the README says; the stage ends it)"
  kill -KILL "$(cat "$LOGS/$name.pid")" 2>/dev/null

  # The abort's own watchdog, made certain: opal_abort_delay -1 makes MPI_Abort loop forever (as it
  # may where mpirun is out of reach). Every rank times out in a hung all_to_all_v and must end
  # itself kMpiAbortGraceSeconds (5 s) later with status 1, and mpirun then exits.
  echo "--- the abort's watchdog: MPI_Abort never returns (--mca opal_abort_delay -1), one host"
  local t0 rc n secs
  t0=$(date +%s.%N)
  DEEPINFER_COMM_TIMEOUT_S=5 timeout 120 mpirun --oversubscribe --mca opal_abort_delay -1 \
    -x DEEPINFER_COMM_TIMEOUT_S -np 4 "$DEEPINFER" check collectives --comm mpi --fault a2av-hang \
    >"$LOGS/abort-watchdog.out" 2>&1 </dev/null
  rc=$?
  secs=$(since "$t0")
  n=$(grep -c "MPI_Abort has not ended this process after 5 s" "$LOGS/abort-watchdog.out")
  echo "abort watchdog (MPI_Abort never returns): mpirun ended after $secs s, exit $rc" >>"$LOGS/timings.txt"
  [[ $rc -ne 0 && $rc -ne 124 && $n -ge 1 ]] && ok=1 || ok=0
  report "MPI_Abort never returns: the ranks end themselves" $ok \
    "exit $rc after $secs s (124: hung), $n rank(s) say so"
}

want checks && checks
if want generate; then
  generate_case kill
  generate_case partition
fi
if want serve; then
  serve_case kill
  serve_case partition
fi
want watchdog && watchdog_case

echo "--- timings (seconds after the failure; DEEPINFER_COMM_TIMEOUT_S=$DEEPINFER_COMM_TIMEOUT_S)"
cat "$LOGS/timings.txt" 2>/dev/null
exit $failed
