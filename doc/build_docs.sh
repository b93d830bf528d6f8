#!/usr/bin/env bash
# Builds the API reference (HTML) with Doxygen, and fails when a public member
# of the nn API has no doc comment. `ninja -C build docs` runs it as
#   doc/build_docs.sh DOXYGEN BUILD/doc/Doxyfile BUILD/docs
# and the test suite runs it into a directory of its own.
set -euo pipefail
doxygen=$1 doxyfile=$2 out=$3
mkdir -p "$out"
log=$out/warnings.log
{ cat "$doxyfile"; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $log"; } | "$doxygen" -

# Doxygen's warnings are one line each, some with continuation lines; a
# warning's file comes first ("$file:$line: warning: $text").
nn=$(grep -E '^[^:]*/nn/[^:]*:[0-9]+: warning: ' "$log" || true)
others=$(grep -cE '^[^:]*:[0-9]+: warning: ' "$log" || true)
echo "docs: $out/html/index.html ($((others - $(printf '%s' "$nn" | grep -c . || true))) warnings outside nn/ in $log)"
if [[ -n $nn ]]; then
  echo "docs: the nn API must be documented; doxygen says:" >&2
  echo "$nn" >&2
  exit 1
fi
