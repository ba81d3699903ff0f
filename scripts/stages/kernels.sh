# Kernel harness: every op's cpu backend against its host reference (quick set + full set of
# small/medium shapes; the largest shapes are marked non-quick and run here too).
set -euo pipefail
"$DEEPINFER" check kernels
