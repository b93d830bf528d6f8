#include "bench/workloads.h"

#include "autograd/autocast.h"
#include "models/training_state.h"

namespace tg::bench {

const std::map<std::string, Workload>& workloads() {
  static const std::map<std::string, Workload> kWorkloads = {
      {"gpt-s", {.model = {.kind = "gpt", .layers = 2, .block = 64, .heads = 4, .dim = 128}, .batch = 32}},
      {"gpt-m", {.model = {.kind = "gpt", .layers = 4, .block = 128, .heads = 4, .dim = 256}, .batch = 16}},
      {"rnn", {.model = {.kind = "rnn", .block = 64, .embed = 64, .hidden = 256}, .batch = 32}},
      {"lstm", {.model = {.kind = "lstm", .block = 64, .embed = 64, .hidden = 256}, .batch = 32}},
  };
  return kWorkloads;
}

Trainer make_trainer(const Workload& w, int64_t vocab) {
  models::ModelSpec spec = w.model;
  spec.vocab = vocab;
  Trainer t;
  t.model = models::make_language_model(spec);
  t.opt = models::make_optimizer(spec.kind, *t.model);
  return t;
}

double Trainer::step(const Tensor& inputs, const Tensor& targets) {
  // zero_grad first (drops the .grad tensors), so the previous step's
  // gradients are not held through this forward's activation peak.
  opt->zero_grad();
  // Forward and loss only, as torch.autocast is used: each node's backward
  // runs under the precision it was recorded with. A non-finite loss stops
  // the run with the anomaly report.
  Tensor loss = models::checked_loss(
      [&] {
        AutocastGuard precision(autocast);
        return model->loss(inputs, targets);
      },
      "lm_train");
  loss.backward();
  opt->step();
  return loss.item();
}

}  // namespace tg::bench
