# Explicit stage (not in CI): every `deepinfer bench ...` command. `bench collectives` (4 MiB per
# rank) and `bench ep` run on local and mpi at 2, 4 and 8 ranks; every other bench with its defaults.
# Each output line must be a benchmark-contract JSON object with "correct":true (where given).
# The JSON lines are collected in $BUILD_DIR/stage-logs/bench/bench.jsonl.
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=${BUILD_DIR:-build}/stage-logs/bench
mkdir -p "$LOGS"
OUT="$LOGS/bench.jsonl"
: >"$OUT"
MPIRUN=(mpirun --oversubscribe --bind-to none --mca mpi_yield_when_idle 1)
FIELDS=(bench case seconds limit limit_value ratio)
failed=0
field() {  # KEY JSON-LINE: the value of "KEY" (string or number), spaces after ':' allowed
  echo "$2" | grep -ao "\"$1\": *\"[^\"]*\"\|\"$1\": *[-0-9.eE+a-z]*" | head -1 | sed 's/^"[^"]*": *//; s/"//g'
}

run() {  # NAME -- COMMAND...
  local name=$1
  shift 2
  local log="$LOGS/${name// /_}.log"
  timeout 1800 "$@" >"$log" 2>"$log.err"
  local rc=$? ok=1 lines=0 why="" figures=()
  [[ $rc -eq 0 ]] || { ok=0; why="exit $rc"; }
  while IFS= read -r line; do
    [[ $line == \{*\} ]] || continue
    lines=$((lines + 1))
    echo "$line" >>"$OUT"
    for f in "${FIELDS[@]}"; do [[ $line == *"\"$f\":"* ]] || { ok=0; why="$why; a line lacks \"$f\""; }; done
    [[ $line == *'"bytes":'* || $line == *'"flops":'* ]] || { ok=0; why="$why; a line lacks bytes/flops"; }
    [[ $line == *'"correct":'*false* && $line =~ \"correct\":\ *false ]] && { ok=0; why="$why; a result was wrong"; }
    figures+=("       $(field case "$line")  ratio $(field ratio "$line") vs $(field limit "$line")")
  done <"$log"
  ((lines > 0)) || { ok=0; why="$why; no JSON lines"; }
  printf '%-4s %-34s %s\n' "$([[ $ok == 1 ]] && echo PASS || echo FAIL)" "$name" "$lines lines${why:+  [$why]}"
  printf '%s\n' "${figures[@]}"
  if [[ $ok != 1 ]]; then failed=1; tail -n 5 "$log.err"; fi
}

for w in 2 4 8; do
  run "collectives local $w" -- "$DEEPINFER" bench collectives --comm local --world "$w"
  run "collectives mpi $w" -- "${MPIRUN[@]}" -np "$w" "$DEEPINFER" bench collectives --comm mpi
  run "ep local $w" -- "$DEEPINFER" bench ep --comm local --world "$w"
  run "ep mpi $w" -- "${MPIRUN[@]}" -np "$w" "$DEEPINFER" bench ep --comm mpi
done
# Every other bench command the CLI has (each registers itself under `bench`).
for name in $("$DEEPINFER" bench --help 2>/dev/null | awk '/^Subcommands:/{s=1; next} s && /^  [a-z]/{print $1}'); do
  [[ $name == collectives || $name == ep ]] && continue
  run "$name" -- "$DEEPINFER" bench "$name"
done
exit $failed
