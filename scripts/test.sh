#!/usr/bin/env bash
# Sets everything up and runs the whole test suite.
#   scripts/test.sh              release build
#   scripts/test.sh --sanitize   under AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/test.sh --tsan       the threaded tests under ThreadSanitizer: the kernels' pool
#                                (parallel), attention split over it and two models trained
#                                in two threads (threads), and the suites whose kernels and
#                                layers run on the pool (autograd, nn_ops, nn_layers),
#                                checkpointed training in two threads (activation_checkpoint),
#                                and every feature with every model (feature_matrix)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh "$@"
builddir=build
tests=()  # meson test names; none named: all
[[ "${1:-}" == "--sanitize" ]] && builddir=build-asan
if [[ "${1:-}" == "--tsan" ]]; then
  builddir=build-tsan
  tests=(parallel threads autograd nn_ops nn_layers activation_checkpoint feature_matrix)
  # OpenBLAS runs at one thread (the library splits GEMMs over its own pool),
  # but OpenBLAS is not instrumented: TSan sees only the libc calls it makes
  # (memset of a GEMM's output), and the peak measurements start its threads.
  # Reports with an OpenBLAS frame are suppressed, and only those
  # (tests/tsan/openblas.supp).
  # Four kernel threads even on two cores, so the pool's chunks interleave.
  export TAPEGRAD_NUM_THREADS=4
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4 suppressions=$PWD/tests/tsan/openblas.supp"
fi
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
meson test -C "$builddir" --print-errorlogs --num-processes 2 "${tests[@]}" || status=$?
# One closing line that any CI can read.
python3 - "$builddir/meson-logs/testlog.json" <<'PY'
import json, sys
res = [json.loads(l)["result"] for l in open(sys.argv[1]) if l.strip()]
ok = sum(r == "OK" for r in res); skip = sum(r == "SKIP" for r in res)
print(f"tests: {ok} passed, {len(res) - ok - skip} failed, {skip} skipped")
PY
exit $status
