#!/usr/bin/env bash
# Builds and runs examples/standalone, a project outside tapegrad's tree, the
# ways a user's project would; the commands are those of doc/install.md,
# run in a temporary directory.
#   tests/test_standalone.sh installed BUILDDIR   installs BUILDDIR into a
#       temporary DESTDIR, checks the installed tree, then builds the project
#       with meson + pkg-config (shared and static) and with CMake
#   tests/test_standalone.sh subproject           builds the project with this
#       source tree as its meson subproject
#   tests/test_standalone.sh doc_blocks BUILDDIR  installs BUILDDIR the same way,
#       then compiles the docs' compiled blocks (BUILDDIR/doc/doc_blocks.cpp)
#       as a reader would, with `c++ $(pkg-config --cflags --libs tapegrad)`
#       against the installed tree alone, and runs them
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
mode=${1:-}
build=$( [[ -n ${2:-} ]] && cd "$2" && pwd || true)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "test_standalone: $*" >&2; exit 1; }
# Echoes and runs a command, showing its output only when it fails.
run() {
  echo "+ $*"
  "$@" > "$work/log" 2>&1 || { cat "$work/log" >&2; fail "failed: $*"; }
}
# The program itself: it trains, gradchecks, and exits 0 only if both went
# as they should.
show() { echo "+ $*"; "$@"; }

cd "$work"
ln -s "$src/examples" examples

if [[ $mode == subproject ]]; then
  TAPEGRAD=$src
  run cp -r examples/standalone app
  run mkdir app/subprojects
  run ln -s "$TAPEGRAD" app/subprojects/tapegrad
  # -O0 without debug info: the test builds and runs it, nobody steps through it.
  run meson setup build-app app --force-fallback-for=tapegrad -Doptimization=0 -Ddebug=false
  run ninja -C build-app
  show build-app/standalone
  exit 0
fi

[[ ($mode == installed || $mode == doc_blocks) && -n $build ]] ||
  fail "usage: test_standalone.sh installed BUILDDIR | doc_blocks BUILDDIR | subproject"
read -r prefix libdir < <(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["prefix"], o["libdir"])')

DEST=$work/stage
run meson install -C "$build" --no-rebuild --quiet --destdir "$DEST"
PREFIX=$DEST$prefix

if [[ $mode == doc_blocks ]]; then
  # Only the installed tree: no source-tree include path, no build-tree library
  # (meson test may point LD_LIBRARY_PATH at the build tree).
  unset LD_LIBRARY_PATH
  export PKG_CONFIG_PATH=$PREFIX/$libdir/pkgconfig
  flags=$(pkg-config --cflags --libs tapegrad) || fail "pkg-config does not find tapegrad"
  # shellcheck disable=SC2086  # flags are words
  run c++ -std=c++20 -o doc_blocks "$build/doc/doc_blocks.cpp" $flags -Wl,-rpath,"$PREFIX/$libdir"
  libs=$(ldd ./doc_blocks)
  grep -q "libtapegrad.so.*$PREFIX" <<<"$libs" || fail "doc_blocks does not load the installed libtapegrad.so"
  show ./doc_blocks
  exit 0
fi
echo "installed tree:"
(cd "$PREFIX" && find . -type f -o -type l | sort | sed 's/^/  /')

# The installed tree: only tapegrad/ on the include path, no third-party
# headers a user would not expect, a real (not thin) archive, a soname.
[[ $(ls "$PREFIX/include") == tapegrad ]] || fail "include/ holds more than tapegrad/: $(ls "$PREFIX/include")"
if grep -rlE '#include <(nlohmann|CLI|cblas)' "$PREFIX/include"; then fail "an installed header includes nlohmann, CLI11 or cblas"; fi
[[ $(head -c 8 "$PREFIX/$libdir/libtapegrad.a") == '!<arch>' ]] || fail "libtapegrad.a is not a real archive"
soname=$(objdump -p "$PREFIX/$libdir/libtapegrad.so" | awk '$1 == "SONAME" {print $2}')
[[ $soname == libtapegrad.so.* && -e $PREFIX/$libdir/$soname ]] || fail "no soname, or no file named by it: '$soname'"
# Every installed header is reached from the umbrella header, which compiles.
echo '#include <tapegrad/tapegrad.h>' > umbrella.cpp
g++ -std=c++20 -fsyntax-only -MM -MF umbrella.d -I"$PREFIX/include" umbrella.cpp
reached=$(tr ' \\' '\n\n' < umbrella.d | grep "^$PREFIX/include/" | xargs -n1 realpath -m | sort -u)
installed=$(find "$PREFIX/include" -name '*.h' | xargs -n1 realpath -m | sort -u)
[[ $reached == "$installed" ]] ||
  fail "installed headers not reached from <tapegrad/tapegrad.h>: $(comm -13 <(echo "$reached") <(echo "$installed"))"

# meson + pkg-config, against the shared library, then the static one
export PKG_CONFIG_PATH=$PREFIX/$libdir/pkgconfig
run meson setup build-app examples/standalone --wrap-mode=nofallback
run ninja -C build-app
# ldd's output is taken whole before grep reads it: with pipefail, `ldd | grep -q`
# fails whenever grep exits on its match while ldd is still writing (SIGPIPE).
libs=$(ldd build-app/standalone)
grep -q "libtapegrad.so.*$PREFIX" <<<"$libs" || fail "build-app/standalone does not load the installed libtapegrad.so"
show build-app/standalone
run meson setup build-app-static examples/standalone --wrap-mode=nofallback -Dprefer_static=true
run ninja -C build-app-static
libs=$(ldd build-app-static/standalone)
if grep -q libtapegrad <<<"$libs"; then fail "build-app-static/standalone loads libtapegrad.so"; fi
show build-app-static/standalone
# CMake
unset PKG_CONFIG_PATH
run cmake -S examples/standalone -B build-app-cmake -DCMAKE_PREFIX_PATH="$PREFIX"
run cmake --build build-app-cmake
show build-app-cmake/standalone
