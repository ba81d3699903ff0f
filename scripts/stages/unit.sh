# GoogleTest unit tests of every layer, through ctest (label `unit`).
set -euo pipefail
ctest --test-dir "$BUILD_DIR" -L unit --output-on-failure -j "$(nproc)" --timeout 600
