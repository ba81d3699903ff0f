#!/usr/bin/env bash
# An UNTRAINED (random-init) tiny-engram checkpoint and its golden, for bringing up the engine's
# Engram/mHC path before models/tiny-engram is trained: train_tiny.py's init and export with zero
# steps (models/tiny's tokenizer), then write_golden.py. Not committed (regenerate it):
#   tools/reference/make_untrained_engram.sh [OUT=models/tiny-engram-untrained]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-models/tiny-engram-untrained}
export OMP_NUM_THREADS=1
/usr/bin/python3 tools/reference/train_tiny.py --arch tiny-engram --tokenizer-from models/tiny --out "$out" --steps 0
/usr/bin/python3 tools/reference/write_golden.py --model "$out" --out "$out/golden" --prompts models/tiny/golden/prompts.txt
