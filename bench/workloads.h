#pragma once
// The training workloads of the PyTorch comparison, shared by bench/lm_train
// (the tapegrad side of bench/compare.py) and bench/bench_models: model sizes, optimizer
// settings (AdamW lr 1e-3 with weight decay 0.01 on the GPTs, Adam lr 2e-3 on
// the RNNs; constant LR, no dropout, no clipping) and one training step.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "autograd/dtype.h"
#include "autograd/storage.h"
#include "models/registry.h"

namespace tg::bench {

// model.block is the sequence length T of every kind (the recurrent models
// read it from the data, GPT also as its context); model.vocab is the text's.
struct Workload {
  models::ModelSpec model;
  int64_t batch = 0;  // B
};

// By name: gpt-s, gpt-m, rnn, lstm.
const std::map<std::string, Workload>& workloads();

// A workload's model and optimizer.
struct Trainer {
  std::shared_ptr<models::LanguageModel> model;
  std::unique_ptr<nn::Optimizer> opt;
  // The precision of the step's GEMMs: f32, or bf16 for autocast (float32
  // master weights, as torch.autocast on the PyTorch side).
  DType autocast = DType::f32;

  // One training step on inputs, targets (B,T): zero_grad, forward and loss
  // (under `autocast`), backward, optimizer step. Returns the loss before the
  // update.
  double step(const Tensor& inputs, const Tensor& targets);
};

// The model (with vocabulary vocab) and the optimizer its kind trains with
// (models::make_optimizer); the model is initialised from the default
// generator (seed it first).
Trainer make_trainer(const Workload& w, int64_t vocab);

// Real (system) allocations the caching allocator makes while f runs: zero
// in a steady-state training step, where every buffer comes from the cache.
template <class F>
uint64_t count_system_allocs(F&& f) {
  const uint64_t before = memory_stats().system_allocs;
  f();
  return memory_stats().system_allocs - before;
}

}  // namespace tg::bench
