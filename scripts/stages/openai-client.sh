# Explicit stage (not in CI: it installs from the npm registry): a session with OpenAI's own
# Node client library (`openai` on npm) against `deepinfer serve --ep 2` on models/tiny
# (tests/serve/openai_session.mjs). Needs node and npm; the package goes to $BUILD_DIR/npm-openai.
set -uo pipefail
: "${DEEPINFER:?run through scripts/run_all.sh, or set DEEPINFER and BUILD_DIR}"
BUILD_DIR=${BUILD_DIR:-build}
LOGS=$(realpath -m "$BUILD_DIR/stage-logs/openai-client")
mkdir -p "$LOGS"
command -v npm >/dev/null || { echo "openai-client: npm is missing (apt-get install npm)"; exit 1; }
NPM_DIR=$(realpath -m "$BUILD_DIR/npm-openai")
if [[ ! -d $NPM_DIR/node_modules/openai ]]; then
  mkdir -p "$NPM_DIR"
  (cd "$NPM_DIR" && timeout 300 npm install --silent --no-audit --no-fund openai@4 >"$LOGS/npm.log" 2>&1) ||
    { echo "openai-client: npm install openai failed"; cat "$LOGS/npm.log"; exit 1; }
fi
PROMPT="The GNU General Public License is"
EXPECTED=$("$DEEPINFER" generate --model models/tiny --prompt "$PROMPT" --max-tokens 24 --ignore-eos 2>/dev/null)
EXPECTED=${EXPECTED#"$PROMPT"}
"$DEEPINFER" serve --model models/tiny --ep 2 --port 0 --api-key sk-test 2>"$LOGS/serve.err" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null' EXIT
port=""
for _ in $(seq 1 300); do
  port=$(sed -n 's|^listening on http://[^:]*:\([0-9]*\).*|\1|p' "$LOGS/serve.err")
  [[ -n $port ]] && break
  kill -0 $server 2>/dev/null || break
  sleep 0.1
done
[[ -n $port ]] || { echo "openai-client: the server did not start"; cat "$LOGS/serve.err"; exit 1; }
cp tests/serve/openai_session.mjs "$NPM_DIR/"
BASE_URL="http://127.0.0.1:$port/v1" API_KEY=sk-test PROMPT="$PROMPT" EXPECTED="$EXPECTED" \
  timeout 120 node "$NPM_DIR/openai_session.mjs"
