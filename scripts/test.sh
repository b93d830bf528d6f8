#!/usr/bin/env bash
# Sets everything up and runs the whole test suite.
#   scripts/test.sh              release build
#   scripts/test.sh --sanitize   under AddressSanitizer + UndefinedBehaviorSanitizer
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "$@"
builddir=build
[[ "${1:-}" == "--sanitize" ]] && builddir=build-asan
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
meson test -C "$builddir" --print-errorlogs --num-processes 2 || status=$?
# One closing line that any CI can read.
python3 - "$builddir/meson-logs/testlog.json" <<'PY'
import json, sys
res = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ok = sum(r == "OK" for r in res); skip = sum(r == "SKIP" for r in res)
print(f"tests: {ok} passed, {len(res) - ok - skip} failed, {skip} skipped")
PY
exit $status
