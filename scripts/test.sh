#!/usr/bin/env bash
# The test command: set up (install + build, warnings as errors), then run the default stages.
# Usage: scripts/test.sh [stage...]
set -euo pipefail
cd "$(dirname "$0")/.."
export CMAKE_ARGS="${CMAKE_ARGS:-} -DDEEPINFER_WERROR=ON"
scripts/setup.sh
exec scripts/run_all.sh "$@"
