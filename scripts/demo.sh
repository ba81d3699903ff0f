#!/usr/bin/env bash
# The README's first quick-start command: build (scripts/setup.sh), then generate from the committed
# tiny model with two expert-parallel ranks (threads).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build/bin/deepinfer generate --model models/tiny \
  --prompt "The GNU General Public License is a free, copyleft license for" --max-tokens 48 --ep 2
