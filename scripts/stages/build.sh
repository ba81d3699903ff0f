# Build everything (warnings are errors when DEEPINFER_WERROR=ON, as in CI).
set -euo pipefail
cmake --build "$BUILD_DIR" -j "$(nproc)"
