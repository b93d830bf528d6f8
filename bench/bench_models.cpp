// Google Benchmark of one full training step (forward, loss, zero_grad,
// backward, optimizer step) of each training workload (bench/workloads.h:
// gpt-s, gpt-m, rnn, lstm) on synthetic data: random ids over an 85-symbol
// vocabulary (the Brown corpus' characters), so no corpus is needed.
// Counters: tokens/s (B*T per step, wall time) and system_allocs, the real
// allocations of the caching allocator per step (0 in a steady state).
// Each benchmark validates the model first: at init the loss is about ln V,
// and a few steps on one fixed batch must lower it (SkipWithError if not).
//
//   build/bench/bench_models                         # threads: TAPEGRAD_NUM_THREADS or all cores
//   TAPEGRAD_NUM_THREADS=1 build/bench/bench_models --benchmark_filter=gpt_s
#include <benchmark/benchmark.h>

#include <cmath>

#include "autograd/autograd.h"
#include "bench/workloads.h"
#include "data/lm_batches.h"

using namespace tg;

namespace {

constexpr int64_t kVocab = 85;

void BM_train_step(benchmark::State& state, const std::string& name) {
  const bench::Workload& w = bench::workloads().at(name);
  manual_seed(1337);
  bench::Trainer trainer = bench::make_trainer(w, kVocab);
  Generator gen(7);
  data::LMBatches stream(randint(0, kVocab, {100000}, &gen), w.model.block);
  {
    // Memorising one batch: 8 steps must take the loss from ~ln V well down.
    data::LMBatch fixed = stream.sample(w.batch, gen);
    const double first = trainer.step(fixed.inputs, fixed.targets);
    double last = first;
    for (int i = 0; i < 8; ++i) last = trainer.step(fixed.inputs, fixed.targets);
    if (!(std::abs(first - std::log(kVocab)) < 0.3)) {
      state.SkipWithError("initial loss is not about ln V");
      return;
    }
    if (!(std::isfinite(last) && last < first - 0.05)) {
      state.SkipWithError("training does not lower the loss");
      return;
    }
  }
  uint64_t allocs = 0;
  for (auto _ : state) {
    data::LMBatch b = stream.sample(w.batch, gen);
    allocs += bench::count_system_allocs([&] { trainer.step(b.inputs, b.targets); });
  }
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * w.batch * w.model.block), benchmark::Counter::kIsRate);
  state.counters["system_allocs"] = benchmark::Counter(static_cast<double>(allocs), benchmark::Counter::kAvgIterations);
}
BENCHMARK_CAPTURE(BM_train_step, gpt_s, std::string("gpt-s"))->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, gpt_m, std::string("gpt-m"))->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, rnn, std::string("rnn"))->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_train_step, lstm, std::string("lstm"))->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
