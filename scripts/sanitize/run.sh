# Sourced by scripts/stages/asan.sh and tsan.sh: runs one command of a sanitizer stage and judges
# it. san_run NAME CMD...: the command's output goes to $LOGS/NAME.log; it passes when it exits 0
# within SAN_RUN_LIMIT_S and its output holds no sanitizer report. One line per run.
SAN_REPORT='ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|WARNING: ThreadSanitizer|ThreadSanitizer: reported'
san_failed=0
san_run() {
  local name=$1
  shift
  local log="$LOGS/${name//[ \/]/_}.log"
  local start=$(date +%s)
  timeout "${SAN_RUN_LIMIT_S:-900}" "$@" >"$log" 2>&1
  local rc=$? why=""
  [[ $rc -eq 0 ]] || why="exit $rc"
  [[ $rc -eq 124 ]] && why="killed after ${SAN_RUN_LIMIT_S:-900} s"
  local reports=$(grep -aEc "$SAN_REPORT" "$log")
  ((reports == 0)) || why="$why${why:+; }$reports sanitizer report line(s)"
  printf '%-4s %-48s %5ds  %s\n' "$([[ -z $why ]] && echo PASS || echo FAIL)" "$name" \
    $(($(date +%s) - start)) "${why:-ok}"
  if [[ -n $why ]]; then
    san_failed=1
    echo "---- $log:"
    { grep -aE -A12 "$SAN_REPORT" "$log" | head -n 40; tail -n 8 "$log"; } | cut -c1-240
    echo "----"
  fi
}
