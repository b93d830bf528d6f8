#!/usr/bin/env bash
# Builds and runs examples/standalone, a project outside tapegrad's tree, the
# ways a user would (the commands are those of the README's "Use tapegrad in
# your project"):
#   tests/test_standalone.sh installed BUILDDIR   install BUILDDIR into a
#       temporary DESTDIR, check the installed tree, then build the project
#       with meson + pkg-config (shared and static) and with CMake
#   tests/test_standalone.sh subproject           build the project with this
#       source tree as its meson subproject
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
mode=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "test_standalone: $*" >&2; exit 1; }

# Echoes and runs a command; its output is shown when it fails. (The program
# itself runs with `show`: it trains, gradchecks, and exits 0 only if both
# went as they should.)
run() {
  echo "+ $*"
  "$@" > "$work/log" 2>&1 || { cat "$work/log" >&2; fail "failed: $*"; }
}
show() { echo "+ $*"; "$@"; }

if [[ $mode == subproject ]]; then
  cp -r "$src/examples/standalone" "$work/app"
  mkdir "$work/app/subprojects"
  ln -s "$src" "$work/app/subprojects/tapegrad"
  cd "$work"
  # -O1 keeps the library's compile short; the project builds it from scratch.
  run meson setup build-app app --force-fallback-for=tapegrad -Doptimization=1
  run ninja -C build-app
  show build-app/standalone
  exit 0
fi

[[ $mode == installed ]] || fail "mode must be 'installed' or 'subproject', not '$mode'"
build=$(cd "$2" && pwd)
read -r prefix libdir < <(meson introspect "$build" --buildoptions | python3 -c '
import json, sys
o = {x["name"]: x["value"] for x in json.load(sys.stdin)}
print(o["prefix"], o["libdir"])')

DEST=$work/stage
cd "$work"
run meson install -C "$build" --no-rebuild --quiet --destdir "$DEST"
PREFIX=$DEST$prefix
echo "installed tree:"
(cd "$PREFIX" && find . -type f -o -type l | sort | sed 's/^/  /')

# The installed tree: only tapegrad/ on the include path, no third-party
# headers a user would not expect, a real (not thin) archive, a soname.
[[ $(ls "$PREFIX/include") == tapegrad ]] || fail "include/ holds more than tapegrad/: $(ls "$PREFIX/include")"
if grep -rlE '#include <(nlohmann|CLI|cblas)' "$PREFIX/include"; then fail "an installed header includes nlohmann, CLI11 or cblas"; fi
[[ $(head -c 8 "$PREFIX/$libdir/libtapegrad.a") == '!<arch>' ]] || fail "libtapegrad.a is not a real archive"
soname=$(objdump -p "$PREFIX/$libdir/libtapegrad.so" | awk '$1 == "SONAME" {print $2}')
[[ $soname == libtapegrad.so.* && -e $PREFIX/$libdir/$soname ]] || fail "no soname, or no file named by it: '$soname'"
# Every installed header is reached from the umbrella header, and compiles.
echo '#include <tapegrad/tapegrad.h>' > umbrella.cpp
g++ -std=c++20 -fsyntax-only -MM -MF umbrella.d -I"$PREFIX/include" umbrella.cpp
reached=$(tr ' \\' '\n\n' < umbrella.d | grep "^$PREFIX/include/" | xargs -n1 realpath -m | sort -u)
installed=$(find "$PREFIX/include" -name '*.h' | xargs -n1 realpath -m | sort -u)
[[ $reached == "$installed" ]] || fail "installed headers not reached from <tapegrad/tapegrad.h>: $(comm -13 <(echo "$reached") <(echo "$installed"))"

# meson + pkg-config, against the shared library, then the static one.
export PKG_CONFIG_PATH=$PREFIX/$libdir/pkgconfig
run meson setup build-app "$src/examples/standalone" --wrap-mode=nofallback
run ninja -C build-app
ldd build-app/standalone | grep -q "libtapegrad.so.*$PREFIX" || fail "build-app/standalone does not load the installed libtapegrad.so"
show build-app/standalone
run meson setup build-app-static "$src/examples/standalone" --wrap-mode=nofallback -Dprefer_static=true
run ninja -C build-app-static
if ldd build-app-static/standalone | grep -q libtapegrad; then fail "build-app-static/standalone loads libtapegrad.so"; fi
show build-app-static/standalone

# CMake: find_package(tapegrad CONFIG REQUIRED), target tapegrad::tapegrad.
unset PKG_CONFIG_PATH
run cmake -S "$src/examples/standalone" -B build-app-cmake -DCMAKE_PREFIX_PATH="$PREFIX"
run cmake --build build-app-cmake
show build-app-cmake/standalone
