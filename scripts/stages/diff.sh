# `deepinfer diff` (issue 6): replay every kernel call of a tiny-model run on the host reference.
#   1. clean run on the golden prompts: exit 0, every op within tolerance ("OK: all ...").
#   2. one RMSNorm call perturbed (DEEPINFER_FAULT=kernel:rms_norm:3): exit 1 and that op and call
#      ranked first in the table.
#   3. the clean run under EP (2 rank threads): exit 0, rank 0 prints the merged table.
#   4. models/tiny-engram (mHC + Engram) at EP 2: exit 0, and the per-op table lists the Engram and
#      mHC kernels the model calls.
# Full outputs: $BUILD_DIR/stage-logs/diff/.
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=${BUILD_DIR:-build}/stage-logs/diff
mkdir -p "$LOGS"
MODEL=${DIFF_MODEL:-models/tiny}
failed=0

report() {  # NAME OK DETAIL
  printf '%-4s %-40s %s\n' "$([[ $2 == 1 ]] && echo PASS || echo FAIL)" "$1" "$3"
  [[ $2 == 1 ]] || failed=1
}

# 1. clean
timeout 600 "$DEEPINFER" diff --model "$MODEL" --golden --max-tokens 3 --json "$LOGS/clean.json" \
  >"$LOGS/clean.log" 2>&1
rc=$?
ok=0
[[ $rc -eq 0 ]] && grep -q '^OK: all [0-9]* kernel calls within tolerance' "$LOGS/clean.log" && ok=1
report "diff clean (golden prompts)" $ok "exit $rc; $(grep -E '^(OK|FAIL):' "$LOGS/clean.log" | head -1)"
[[ $ok == 1 ]] || tail -n 30 "$LOGS/clean.log"

# 2. one faulted call: rank 1 of the table (row "   1 ...") must be rms_norm call 3.
DEEPINFER_FAULT=kernel:rms_norm:3 timeout 600 "$DEEPINFER" diff --model "$MODEL" --golden --max-tokens 3 --top 5 \
  >"$LOGS/fault.log" 2>&1
rc=$?
first=$(grep -E '^ +1 +[0-9]+ ' "$LOGS/fault.log" | head -1)
ok=0
[[ $rc -eq 1 ]] && awk '{exit !($3 == "rms_norm" && $5 == 3)}' <<<"$first" && ok=1
report "diff fault kernel:rms_norm:3 ranked first" $ok "exit $rc; first row: $(echo $first | cut -c1-90)"
[[ $ok == 1 ]] || tail -n 30 "$LOGS/fault.log"

# 3. EP over 2 rank threads
timeout 600 "$DEEPINFER" diff --model "$MODEL" --golden --max-tokens 3 --ep 2 --comm local \
  >"$LOGS/ep2.log" 2>&1
rc=$?
ok=0
[[ $rc -eq 0 ]] && grep -q '^OK: all' "$LOGS/ep2.log" && ok=1
report "diff clean --ep 2" $ok "exit $rc; $(grep -E '^(OK|FAIL):' "$LOGS/ep2.log" | head -1)"
[[ $ok == 1 ]] || tail -n 30 "$LOGS/ep2.log"

# 4. the Engram + mHC model
ENGRAM_MODEL=${DIFF_ENGRAM_MODEL:-models/tiny-engram}
timeout 600 "$DEEPINFER" diff --model "$ENGRAM_MODEL" --golden --max-tokens 3 --ep 2 --comm local \
  >"$LOGS/engram.log" 2>&1
rc=$?
ok=0
missing=""
for op in engram_hash engram_gate engram_conv_norm engram_short_conv bias_add mhc_pre mhc_post mhc_head; do
  grep -qE "^$op +[0-9]+ +0 " "$LOGS/engram.log" || missing+=" $op"
done
[[ $rc -eq 0 && -z "$missing" ]] && grep -q '^OK: all' "$LOGS/engram.log" && ok=1
report "diff $ENGRAM_MODEL --ep 2 (Engram, mHC ops)" $ok "exit $rc;${missing:+ not listed:$missing;} $(grep -E '^(OK|FAIL):' "$LOGS/engram.log" | head -1)"
[[ $ok == 1 ]] || tail -n 30 "$LOGS/engram.log"
exit $failed
