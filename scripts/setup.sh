#!/usr/bin/env bash
# Installs the Debian packages deepinfer needs (idempotent, quiet) and builds Release into build/.
# Usage: scripts/setup.sh            (BUILD_DIR and CMAKE_ARGS may be set in the environment)
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config libopenmpi-dev openmpi-bin
  nlohmann-json3-dev libcli11-dev libhwy-dev libgtest-dev libgmock-dev
  libpcre2-dev libopenblas-dev libfmt-dev libicu-dev libutf8proc-dev clang-format
  libcpp-httplib-dev prometheus-cpp-dev curl)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j "$(nproc)"
echo "setup: built $BUILD_DIR/bin/deepinfer"
