# The CLI as a new user meets it (issue 19 §5): every mistake is an error before anything loads or
# prints, says what is wrong and what to do, names the option the user typed, never shows a source
# path or an internal check, and leaves stdout empty. Plus --version, tokenize, the prompts-file
# format, the run summary, and generate under mpirun without --comm. Logs: $BUILD_DIR/stage-logs/cli/.
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
LOGS=${BUILD_DIR:-build}/stage-logs/cli
rm -rf "$LOGS"
mkdir -p "$LOGS"
MODEL=models/tiny
MPIRUN=(mpirun --oversubscribe)
failed=0
n=0

report() {  # NAME OK DETAIL
  printf '%-4s %-52s %s\n' "$([[ $2 == 1 ]] && echo PASS || echo FAIL)" "$1" "$3"
  [[ $2 == 1 ]] || failed=1
}

# user_error NAME RC REGEX CMD...: exit code RC (or any non-zero for "nz"), nothing on stdout,
# stderr matching REGEX (extended), and no source path or internal check text on stderr.
user_error() {
  local name=$1 want=$2 regex=$3
  shift 3
  n=$((n + 1))
  local out=$LOGS/$n.out err=$LOGS/$n.err
  timeout 120 "$@" >"$out" 2>"$err" </dev/null
  local rc=$? ok=1 why=""
  if [[ $want == nz ]]; then [[ $rc -ne 0 ]] || { ok=0; why="exit 0"; }
  else [[ $rc -eq $want ]] || { ok=0; why="exit $rc, want $want"; }; fi
  [[ -s $out ]] && { ok=0; why="$why; stdout not empty ($(head -c 80 "$out"))"; }
  grep -Eq -- "$regex" "$err" || { ok=0; why="$why; stderr lacks /$regex/"; }
  grep -Eq 'check `|\.(cpp|h):[0-9]' "$err" && { ok=0; why="$why; stderr shows an internal check or source path"; }
  report "$name" $ok "${why:-$(grep -m1 -E -- "$regex" "$err" | head -c 150)}"
  [[ $ok == 1 ]] || { echo "  \$ $*"; sed 's/^/  | /' "$err" | head -5; }
}

# A model folder with config.json and the tokenizer but no weights: an option error must come
# before loading, or this would fail on the missing safetensors instead.
NOWEIGHTS=$(mktemp -d)
trap 'rm -rf "$NOWEIGHTS" "$BADSHAPE" "$TMPF"' EXIT
cp "$MODEL"/config.json "$MODEL"/tokenizer.json "$MODEL"/tokenizer_config.json "$NOWEIGHTS"/
GEN=("$DEEPINFER" generate --model "$NOWEIGHTS" --prompt hi)

echo "--- options are checked before anything loads, in the user's words"
user_error "--top-p 0" 2 '--top-p must be in \(0, 1\]' "${GEN[@]}" --top-p 0
user_error "--top-p 1.5" 2 '--top-p must be in \(0, 1\]' "${GEN[@]}" --top-p 1.5
user_error "--temperature -1" 2 '--temperature must be a number >= 0' "${GEN[@]}" --temperature -1
user_error "--top-k -1" 2 '--top-k must be >= 0' "${GEN[@]}" --top-k -1
user_error "--max-tokens abc" 2 "--max-tokens: expects an integer in \[1, 1048576\], got 'abc'" "${GEN[@]}" --max-tokens abc
user_error "--temperature warm" 2 "--temperature: expects a number, got 'warm'" "${GEN[@]}" --temperature warm
user_error "--gemm bf16 --quantize fp8" 2 '--gemm bf16 and --quantize fp8 contradict each other' \
  "${GEN[@]}" --gemm bf16 --quantize fp8
user_error "--model missing folder" 2 '--model /no/such/model: no such folder; give the folder that holds config.json' \
  "$DEEPINFER" generate --model /no/such/model --prompt hi
user_error "--prompts-file missing" 2 'cannot read --prompts-file /no/such/p.txt: No such file' \
  "$DEEPINFER" generate --model "$MODEL" --prompts-file /no/such/p.txt
TMPF=$(mktemp)
printf '\n\r\n' >"$TMPF"
user_error "--prompts-file empty" 2 "--prompts-file $TMPF holds no prompt" \
  "$DEEPINFER" generate --model "$MODEL" --prompts-file "$TMPF"
long=$(printf 'the GNU General Public License %.0s' $(seq 1 1200))
user_error "too long a prompt: error, stdout empty" 2 \
  "--prompt: the prompt \([0-9]+ tokens\) \+ up to 64 new tokens exceed the model's context of [0-9]+ positions.*lower --max-tokens" \
  "$DEEPINFER" generate --model "$MODEL" --prompt "$long"
user_error "--ep 2 --comm mpi without mpirun" 2 '--ep 2 with --comm mpi needs 2 processes.*`mpirun -np 2 deepinfer' \
  "$DEEPINFER" generate --model "$MODEL" --prompt hi --ep 2 --comm mpi --max-tokens 2
user_error "check e2e without golden data" 2 "has no golden data .*golden.json is missing.*models/tiny does" \
  "$DEEPINFER" check e2e --model "$NOWEIGHTS"
user_error "diff --json into a missing folder (before the run)" 2 '--json /no/such/dir/r.json: its folder /no/such/dir does not exist' \
  "$DEEPINFER" diff --model "$MODEL" --golden --json /no/such/dir/r.json
BADSHAPE=$(mktemp -d)
cp "$MODEL"/* "$BADSHAPE"/ 2>/dev/null
sed -i 's/"intermediate_size": 512/"intermediate_size": 640/' "$BADSHAPE/config.json"
user_error "weights that do not match config.json" 1 \
  'tensor model.layers.0.mlp.[a-z_]+.weight in model.safetensors is [A-Z0-9_]+\[[0-9, ]+\], but config.json implies [A-Z0-9_]+\[[0-9, ]+\]: the weights do not match' \
  "$DEEPINFER" generate --model "$BADSHAPE" --prompt hi --max-tokens 2

echo "--- commands"
user_error "unknown command" 2 "unknown command 'foo'; the commands are: .*check bucket\|collectives.*generate.*tokenize" "$DEEPINFER" foo
user_error "unknown check" 2 "deepinfer check: unknown command 'bar'; the commands are: bucket, collectives, e2e, engram, ep, kernels" "$DEEPINFER" check bar
user_error "no command" 2 "no command given; the commands are" "$DEEPINFER"
ver=$("$DEEPINFER" --version 2>&1); rc=$?
want=$(sed -n 's/^project(deepinfer VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
[[ $rc -eq 0 && $ver == "deepinfer $want" ]] && ok=1 || ok=0
report "--version" $ok "exit $rc: $ver (CMakeLists.txt: $want)"

echo "--- bench decode --vs-ep1: EP 2 against EP 1 on the same sequences, in one run"
user_error "--vs-ep1 without --ep N" 2 '--vs-ep1 compares EP N with EP 1: give --ep N with N >= 2 \(got --ep 1\)' \
  "$DEEPINFER" bench decode --model "$MODEL" --vs-ep1
"$DEEPINFER" bench decode --model "$MODEL" --ep 2 --vs-ep1 --batch 1,3 --reps 1 --decode-tokens 8 \
  --prompt-tokens 8 >"$LOGS/vs_ep1.out" 2>"$LOGS/vs_ep1.err"; rc=$?
# Each decode line checked (its greedy tokens equal EP 1's: the exact combine gives the same bits at
# every EP size) and carrying the ratio; batch 3 per rank has more experts than one sequence's 4.
lines=$(grep -c '"case":"[^"]* decode batch [13]"' "$LOGS/vs_ep1.out")
good=$(grep -cE '"correct":true.*"greedy_identical_ep1":1\.0.*"ratio_vs_ep1":[0-9]*\.[0-9]*[1-9]' "$LOGS/vs_ep1.out")
[[ $rc -eq 0 && $lines -eq 2 && $good -eq 2 ]] && ok=1 || ok=0
report "--vs-ep1: tokens equal EP 1's, ratio printed" $ok "exit $rc, $good of $lines decode lines"

echo "--- bench decode --profile: each rank's step per op, the GEMMs against their floors"
"$DEEPINFER" bench decode --model "$MODEL" --ep 2 --profile --batch 2 --reps 1 --decode-tokens 4 \
  --prompt-tokens 8 >"$LOGS/profile.out" 2>"$LOGS/profile.err"; rc=$?
# Per rank: the floor line with a positive floor, and the head's GEMM by place with its x floor.
floors=$(grep -cE '^# floor: .* against [0-9]+\.[0-9]*[1-9][0-9]* ms' "$LOGS/profile.out")
heads=$(grep -cE '^# head gemm_bf16 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9]+\.[0-9]+ ' "$LOGS/profile.out")
[[ $rc -eq 0 && $floors -eq 2 && $heads -eq 2 ]] && ok=1 || ok=0
report "--profile: floors on both ranks" $ok "exit $rc, $floors floor lines, $heads head rows"

echo "--- bench decode --ab: two processes decode the same sequences, taking turns step by step"
"$DEEPINFER" bench decode --model "$MODEL" --ab "$DEEPINFER" --batch 1,2 --reps 2 --decode-tokens 8 \
  >"$LOGS/ab.out" 2>"$LOGS/ab.err"; rc=$?
# The same binary on both sides: the same greedy tokens, 2 timed runs x 8 decode steps on each side.
good=$(grep -cE '"ratio":[0-9]+\.[0-9]+.*"identical_tokens":1\.0.*"peer_steps":16\.0.*"steps":16\.0' "$LOGS/ab.out")
[[ $rc -eq 0 && $good -eq 2 ]] && ok=1 || ok=0
report "--ab: same binary, same tokens, every step timed" $ok "exit $rc, $good of 2 lines"
# A peer whose final norm is perturbed in the timed run's second step (17 norms a step on the tiny
# model): its tokens differ, and the line says so.
"$DEEPINFER" bench decode --model "$MODEL" --ab "$DEEPINFER" --ab-env DEEPINFER_FAULT=kernel:rms_norm:186 \
  --reps 1 --decode-tokens 8 >"$LOGS/ab_fault.out" 2>"$LOGS/ab_fault.err"; rc=$?
[[ $rc -eq 0 ]] && grep -q '"identical_tokens":0\.0' "$LOGS/ab_fault.out" && ok=1 || ok=0
report "--ab-env: a perturbed peer's tokens differ" $ok "exit $rc: $(grep -o '"identical_tokens":[0-9.]*' "$LOGS/ab_fault.out")"
# At EP 2 (two local ranks a side), against a peer whose ranks each run all their replicated work
# (DEEPINFER_EP_SPLIT=off): the same tokens (docs/ep.md §14), every step of both sides timed.
"$DEEPINFER" bench decode --model "$MODEL" --ep 2 --ab "$DEEPINFER" --ab-env DEEPINFER_EP_SPLIT=off \
  --reps 2 --decode-tokens 8 >"$LOGS/ab_ep2.out" 2>"$LOGS/ab_ep2.err"; rc=$?
good=$(grep -cE 'ep=2 .*"identical_tokens":1\.0.*"peer_steps":16\.0.*"steps":16\.0' "$LOGS/ab_ep2.out")
[[ $rc -eq 0 && $good -eq 1 ]] && ok=1 || ok=0
report "--ab --ep 2: ranks take turns together, same tokens" $ok "exit $rc, $good of 1 line"
user_error "--ab /bin/false" nz 'bench decode --ab: /bin/false (is gone|exited before it finished)' \
  "$DEEPINFER" bench decode --model "$MODEL" --ab /bin/false --reps 1 --decode-tokens 4
user_error "--ab-env without =" 2 '--ab-env FOO: expected NAME=VALUE' \
  "$DEEPINFER" bench decode --model "$MODEL" --ab "$DEEPINFER" --ab-env FOO

echo "--- faults that cannot act at the world size"
user_error "--fault a2av-hang --world 2" 2 '--fault a2av-hang acts only at world sizes >= 4, so at --world 2 the suite would pass' \
  "$DEEPINFER" check collectives --comm local --fault a2av-hang --world 2 --quick
user_error "--fault int32-ag-corrupt --world 4" 2 '--fault int32-ag-corrupt acts only at world sizes >= 16' \
  "$DEEPINFER" check collectives --comm local --fault int32-ag-corrupt --world 4 --quick

echo "--- prompts file: [i] is line i (from 0), CRLF, - for stdin"
printf 'This program is free software: you can redistribute it and/or modify\r\n\r\nThe GNU General Public License is a free, copyleft license for\r\n' >"$TMPF"
"$DEEPINFER" generate --model "$MODEL" --prompts-file "$TMPF" --max-tokens 4 >"$LOGS/pf.out" 2>"$LOGS/pf.err"; rc=$?
ok=1
[[ $rc -eq 0 ]] || ok=0
[[ $(grep -o '^\[[0-9]*\]' "$LOGS/pf.out" | tr '\n' ' ') == "[0] [2] " ]] || ok=0
grep -q $'\r' "$LOGS/pf.out" && ok=0
# line 2's prompt, then its continuation (the model starts it with a newline)
grep -A1 '^\[2\] The GNU General Public License is a free, copyleft license for$' "$LOGS/pf.out" | grep -q '^software' || ok=0
report "--prompts-file CRLF + empty line" $ok "exit $rc: $(tr '\n' '|' <"$LOGS/pf.out" | head -c 120)"
"$DEEPINFER" generate --model "$MODEL" --prompts-file - --max-tokens 4 <"$TMPF" >"$LOGS/pf_stdin.out" 2>"$LOGS/pf_stdin.err"; rc=$?
[[ $rc -eq 0 ]] && cmp -s "$LOGS/pf.out" "$LOGS/pf_stdin.out" && ok=1 || ok=0
report "--prompts-file - (stdin) prints the same" $ok "exit $rc"

echo "--- generate: summary on stderr, stdout only the text"
prompt="The GNU General Public License is a free, copyleft license for"
ntok=$("$DEEPINFER" tokenize --model "$MODEL" --text "$prompt" | wc -w)
"$DEEPINFER" generate --model "$MODEL" --prompt "$prompt" --max-tokens 16 --ep 2 >"$LOGS/gen.out" 2>"$LOGS/gen.err"; rc=$?
ok=1
[[ $rc -eq 0 ]] || ok=0
[[ $(tr '\n' ' ' <"$LOGS/gen.out") == "$prompt software and other kinds of works."* ]] || ok=0
summary="^generate: load [0-9.]+ s, $ntok prompt tokens, [0-9]+ generated, first token after [0-9.]+ s, decode [0-9.]+ tokens/s\$"
grep -Eq "$summary" "$LOGS/gen.err" || ok=0
report "generate summary" $ok "$(grep '^generate:' "$LOGS/gen.err")"
# The EP lowering is news for a developer (DEEPINFER_LOG=debug), not for every generate.
grep -q 'ep: ' "$LOGS/gen.err" && ok=0 || ok=1
DEEPINFER_LOG=debug "$DEEPINFER" generate --model "$MODEL" --prompt hi --max-tokens 2 --ep 2 \
  >/dev/null 2>"$LOGS/gen-debug.err"
grep -q 'debug: ep: auto -> a2a' "$LOGS/gen-debug.err" || ok=0
report "no ep lowering lines at info (they are debug)" $ok ""

echo "--- generate under mpirun -np 2 without --comm: one job over 2 processes"
"${MPIRUN[@]}" -np 2 "$DEEPINFER" generate --model "$MODEL" --prompt "The GNU General Public License is a free, copyleft license for" \
  --max-tokens 16 >"$LOGS/mpi.out" 2>"$LOGS/mpi.err"; rc=$?
[[ $rc -eq 0 ]] && cmp -s "$LOGS/gen.out" "$LOGS/mpi.out" && [[ $(grep -c '^generate:' "$LOGS/mpi.err") -eq 1 ]] && ok=1 || ok=0
report "mpirun -np 2 generate (no --comm)" $ok "exit $rc, $(wc -l <"$LOGS/mpi.out") line(s) on stdout"
user_error "mpirun -np 2 ... --comm local (said once)" nz '--comm local, but this process is one of 2 started by a launcher \(OMPI_COMM_WORLD_SIZE=2\)' \
  "${MPIRUN[@]}" -np 2 "$DEEPINFER" generate --model "$MODEL" --prompt hi --comm local --max-tokens 2
[[ $(grep -c 'comm local, but' "$LOGS/$n.err") -eq 1 ]] && ok=1 || ok=0
report "  ... by rank 0 only" $ok "$(grep -c 'comm local, but' "$LOGS/$n.err") time(s)"

echo "--- tokenize"
# The golden prompts' ids (with BOS) and the tokenizer cases (without) come from the PyTorch/HF side.
ok=1; count=0
while IFS=$'\t' read -r text ids; do
  count=$((count + 1))
  got=$("$DEEPINFER" tokenize --model "$MODEL" --text "$text") || ok=0
  [[ $got == "$ids" ]] || { ok=0; echo "  golden: '$text': got '$got' want '$ids'"; }
  back=$("$DEEPINFER" tokenize --tokenizer "$MODEL/tokenizer.json" --decode "$got") || ok=0
  [[ $back == "<｜begin▁of▁sentence｜>$text" ]] || { ok=0; echo "  decode: got '$back'"; }
done < <(python3 -c '
import json
for p in json.load(open("'"$MODEL"'/golden/golden.json"))["prompts"]:
    print(p["text"] + "\t" + " ".join(map(str, p["ids"])))')
report "tokenize = golden ids, --decode round trip" $ok "$count prompts"
ok=1; count=0
while IFS= read -r i; do
  python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))[int(sys.argv[2])]; open(sys.argv[3],"w").write(c["text"]); print(" ".join(map(str,c["ids"])))' \
    "$MODEL/golden/tokenizer_cases.json" "$i" "$TMPF" >"$LOGS/want_ids"
  count=$((count + 1))
  got=$("$DEEPINFER" tokenize --model "$MODEL" --file "$TMPF" --no-bos) || ok=0
  [[ $got == "$(cat "$LOGS/want_ids")" ]] || { ok=0; echo "  case $i: got '$got'"; }
  got_stdin=$("$DEEPINFER" tokenize --model "$MODEL" --file - --no-bos <"$TMPF") || ok=0
  [[ $got_stdin == "$got" ]] || ok=0
done < <(python3 -c 'import json; print("\n".join(str(i) for i in range(len(json.load(open("'"$MODEL"'/golden/tokenizer_cases.json"))))))')
report "tokenize --file --no-bos = tokenizer cases" $ok "$count cases"
user_error "tokenize --decode junk" 2 "--decode expects token ids separated by spaces.*'x1' is not an id" \
  "$DEEPINFER" tokenize --model "$MODEL" --decode "1 x1"
user_error "tokenize --decode out of range" 2 "id 99999 is outside this tokenizer's vocabulary \[0, 2048\)" \
  "$DEEPINFER" tokenize --model "$MODEL" --decode "1 99999"
user_error "tokenize without input" 2 "give one input: --text T or --file F" "$DEEPINFER" tokenize --model "$MODEL"

exit $failed
