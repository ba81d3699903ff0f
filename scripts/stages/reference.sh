# Explicit stage (not in CI): self-checks of the PyTorch reference, then regenerates the golden
# data of models/tiny, models/tiny-mtp (main model plus MTP drafts and speculative traces) and
# models/tiny-engram (mHC + Engram: plus the compression table, hash rows and ablation logits) with
# it and checks that they match the committed golden folders.
set -euo pipefail
bash scripts/install_reference_deps.sh
PY=/usr/bin/python3
export OMP_NUM_THREADS=1
timeout 900 $PY tools/reference/test_reference.py --model models/tiny --mtp-model models/tiny-mtp --engram-model models/tiny-engram
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for m in tiny tiny-mtp tiny-engram; do
  timeout 2400 $PY tools/reference/write_golden.py --model models/$m --out "$tmp/$m" \
    --prompts models/$m/golden/prompts.txt
  $PY tools/reference/check_golden.py models/$m/golden "$tmp/$m"
done
