#!/usr/bin/env bash
# Builds the API reference (HTML) with Doxygen, and fails when a public member
# of the autograd or nn API (the headers under tapegrad/autograd/ and
# tapegrad/nn/) has no doc comment, or a doc comment doxygen cannot read.
# `ninja -C build docs` runs it as
#   doc/build_docs.sh DOXYGEN BUILD/doc/Doxyfile BUILD/docs
# and the test suite runs it into a directory of its own.
set -euo pipefail
doxygen=$1 doxyfile=$2 out=$3
mkdir -p "$out"
log=$out/warnings.log
{ cat "$doxyfile"; echo "OUTPUT_DIRECTORY = $out"; echo "WARN_LOGFILE = $log"; } | "$doxygen" -

# Doxygen's warnings are one line each, some with continuation lines; a
# warning's file comes first ("$file:$line: warning: $text").
warning='^[^:]*:[0-9]+: warning: '
checked=$(grep -E "$warning" "$log" | grep -E '^[^:]*/tapegrad/(autograd|nn)/' || true)
all=$(grep -cE "$warning" "$log" || true)
echo "docs: $out/html/index.html ($((all - $(printf '%s' "$checked" | grep -c . || true))) warnings outside autograd/ and nn/ in $log)"
if [[ -n $checked ]]; then
  echo "docs: the autograd and nn APIs must be documented; doxygen says:" >&2
  echo "$checked" >&2
  exit 1
fi
