#!/usr/bin/env bash
# Runs the libFuzzer targets of fuzz/ (ASan + UBSan), each for a while.
#   scripts/fuzz.sh                      every target, 30 s each, one at a time
#   scripts/fuzz.sh --seconds 600        longer
#   scripts/fuzz.sh --jobs 2             two targets at a time (one core each)
#   scripts/fuzz.sh tokenizer text       only these targets
#   scripts/fuzz.sh -- -runs=10000000    more libFuzzer flags, for every target
#   --rss-mb 2048 --malloc-mb 64 --timeout 10   the limits (defaults shown)
# Builds build-fuzz/ first (scripts/setup.sh --fuzz: clang, libFuzzer). Each
# target starts from its seeds (fuzz/corpus/<target>/), the reproducers of
# earlier findings (fuzz/findings/<target>/, all run at the start: regression
# tests) and what earlier runs here added (build-fuzz/corpus/<target>/). Prints per
# target: executions, coverage (libFuzzer's cov and ft at the end), corpus size
# and findings. A finding -- crash, sanitizer report, typed-error rule broken,
# single allocation above --malloc-mb, RSS above --rss-mb, an input slower than
# --timeout -- stops that target, leaves its reproducer in
# fuzz/findings/<target>/ (commit it) and makes the script exit 1.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=30 jobs=1 rss_mb=2048 malloc_mb=64 timeout=10
targets=() extra=()
while (($#)); do
  case "$1" in
    --seconds) seconds=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --rss-mb) rss_mb=$2; shift 2 ;;
    --malloc-mb) malloc_mb=$2; shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
# libFuzzer reads a bare argument as a corpus directory: a target name put
# after -- would make every target run on it and exit at once.
for arg in "${extra[@]}"; do
  if [[ "$arg" != -* ]]; then
    echo "fuzz.sh: '$arg' after -- is not a libFuzzer flag (targets go before --)" >&2
    exit 2
  fi
done
if ((${#targets[@]} == 0)); then
  for f in fuzz/fuzz_*.cpp; do t=${f#fuzz/fuzz_}; targets+=("${t%.cpp}"); done
fi
for t in "${targets[@]}"; do
  [[ -f fuzz/fuzz_$t.cpp ]] || { echo "fuzz.sh: no target $t (fuzz/fuzz_$t.cpp)" >&2; exit 2; }
done

scripts/setup.sh --fuzz

out=build-fuzz/runs
rm -rf "$out"
mkdir -p "$out"
# The targets write every input to a file under TMPDIR before loading it:
# in memory (tmpfs) where there is one, as on disk they run 15-50x slower
# (e.g. 15000 against 300-1000 inputs/s for `text`). It goes when the run ends.
scratch_root=build-fuzz
[[ -d /dev/shm && -w /dev/shm ]] && scratch_root=/dev/shm
export TMPDIR=$(mktemp -d "$scratch_root/tapegrad-fuzz.XXXXXX")
trap 'rm -rf "$TMPDIR"' EXIT
# UBSan is compiled to abort on its first report; leaks are findings too.
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

run_target() {
  local t=$1 corpus=build-fuzz/corpus/$1 findings=fuzz/findings/$1
  mkdir -p "$corpus" "$findings"
  # Targets share the dictionary of their format: safetensors_module uses
  # fuzz/dict/safetensors.dict, word2vec_text fuzz/dict/word2vec.dict.
  local dict=fuzz/dict/${t%%_*}.dict flags=()
  [[ -f $dict ]] && flags+=(-dict="$dict")
  local status=0
  build-fuzz/fuzz/fuzz_"$t" "$corpus" fuzz/corpus/"$t" "$findings" \
    -max_total_time="$seconds" -rss_limit_mb="$rss_mb" -malloc_limit_mb="$malloc_mb" -timeout="$timeout" \
    -artifact_prefix="$findings/" -print_final_stats=1 "${flags[@]}" "${extra[@]}" \
    >"$out/$t.log" 2>&1 || status=$?
  echo "$status" >"$out/$t.status"
}

start=$SECONDS
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  run_target "$t" &
done
wait

failed=0
printf '%-22s %12s %9s %7s %7s %7s  %s\n' target executions exec/s cov ft corpus findings
for t in "${targets[@]}"; do
  log=$out/$t.log
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # The last status line: "#123 ... cov: 456 ft: 789 corp: 12/3456b ...".
  last=$(grep -E '^#[0-9]+.* cov: ' "$log" | tail -1 || true)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\)\/.*/\1/p' <<<"$last")
  found=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log")
  if [[ $(cat "$out/$t.status") != 0 || -n $found ]]; then
    failed=1
    what=$(grep -m1 -E '^==[0-9]+==ERROR|^SUMMARY|runtime error|broken promise|terminate called|ERROR: libFuzzer' "$log" ||
           echo "exit status $(cat "$out/$t.status")")
    findings="FOUND: ${found:-no reproducer written} -- $what (log: $log)"
  else
    findings=0
  fi
  printf '%-22s %12s %9s %7s %7s %7s  %s\n' "$t" "${execs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" \
    "$findings"
done
echo "fuzz: ${#targets[@]} targets, ${seconds} s each, ${jobs} at a time, $((SECONDS - start)) s in all; logs in $out/"
exit $failed
