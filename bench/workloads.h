#pragma once
// The training workloads of the PyTorch comparison, shared by bench/lm_train
// (the tapegrad side of bench/compare.py) and bench/bench_models: model sizes, optimizer
// settings (AdamW lr 1e-3 with weight decay 0.01 on the GPTs, Adam lr 2e-3 on
// the RNNs; constant LR, no dropout, no clipping) and one training step.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "autograd/storage.h"
#include "models/language_model.h"
#include "nn/optim/optimizer.h"

namespace tg::bench {

struct Workload {
  std::string kind;  // gpt, rnn or lstm
  int64_t layers = 0, heads = 0, dim = 0, embed = 0, hidden = 0, block = 0, batch = 0;
};

// By name: gpt-s, gpt-m, rnn, lstm.
const std::map<std::string, Workload>& workloads();

// A workload's model and optimizer.
struct Trainer {
  std::shared_ptr<models::LanguageModel> model;
  std::unique_ptr<nn::Optimizer> opt;

  // One training step on inputs, targets (B,T): forward and loss, zero_grad,
  // backward, optimizer step. Returns the loss before the update.
  double step(const Tensor& inputs, const Tensor& targets);
};

// The model is initialised from the default generator (seed it first).
Trainer make_trainer(const Workload& w, int64_t vocab);

// Real (system) allocations the caching allocator makes while f runs: zero
// in a steady-state training step, where every buffer comes from the cache.
template <class F>
uint64_t count_system_allocs(F&& f) {
  const uint64_t before = allocator_stats().system_allocs;
  f();
  return allocator_stats().system_allocs - before;
}

}  // namespace tg::bench
