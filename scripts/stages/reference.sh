# Explicit stage (not in CI): self-checks of the PyTorch reference, then regenerates the golden
# data of models/tiny with it and checks that it matches the committed models/tiny/golden.
set -euo pipefail
bash scripts/install_reference_deps.sh
PY=/usr/bin/python3
export OMP_NUM_THREADS=1
timeout 600 $PY tools/reference/test_reference.py --model models/tiny
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
timeout 1200 $PY tools/reference/write_golden.py --model models/tiny --out "$tmp" \
  --prompts models/tiny/golden/prompts.txt
$PY tools/reference/check_golden.py models/tiny/golden "$tmp"
