#!/usr/bin/env bash
# Installs what tools/reference/ needs: Debian's PyTorch (CPU), NumPy and the `regex` module
# (Unicode classes in the pre-tokenizer). Idempotent and quiet when everything is present.
# The reference runs on /usr/bin/python3 (Debian's), not a pyenv/venv python without these packages.
set -euo pipefail
PACKAGES=(python3 python3-torch python3-numpy python3-regex)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install_reference_deps: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
/usr/bin/python3 -c 'import torch, numpy, regex' || {
  echo "install_reference_deps: /usr/bin/python3 cannot import torch, numpy and regex after installing" \
       "${PACKAGES[*]}; check the apt output above" >&2
  exit 1
}
