#include "bench/workloads.h"

#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "nn/optim.h"

namespace tg::bench {

const std::map<std::string, Workload>& workloads() {
  static const std::map<std::string, Workload> kWorkloads = {
      {"gpt-s", {.kind = "gpt", .layers = 2, .heads = 4, .dim = 128, .block = 64, .batch = 32}},
      {"gpt-m", {.kind = "gpt", .layers = 4, .heads = 4, .dim = 256, .block = 128, .batch = 16}},
      {"rnn", {.kind = "rnn", .embed = 64, .hidden = 256, .block = 64, .batch = 32}},
      {"lstm", {.kind = "lstm", .embed = 64, .hidden = 256, .block = 64, .batch = 32}},
  };
  return kWorkloads;
}

Trainer make_trainer(const Workload& w, int64_t vocab) {
  Trainer t;
  if (w.kind == "gpt") {
    t.model = std::make_shared<models::GPT>(
        models::GPTOptions{.vocab = vocab, .block = w.block, .layers = w.layers, .heads = w.heads, .dim = w.dim});
    t.opt = std::make_unique<nn::AdamW>(nn::weight_decay_groups(*t.model, 0.01),
                                        nn::AdamWOptions{.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01});
  } else {
    t.model = std::make_shared<models::RNNLM>(models::RNNLMOptions{
        .vocab = vocab, .embed = w.embed, .hidden = w.hidden, .layers = 1,
        .cell = w.kind == "lstm" ? models::CellKind::lstm : models::CellKind::rnn});
    t.opt = std::make_unique<nn::Adam>(t.model->parameters(), nn::AdamOptions{.lr = 2e-3});
  }
  return t;
}

double Trainer::step(const Tensor& inputs, const Tensor& targets) {
  // zero_grad first (drops the .grad tensors), so the previous step's
  // gradients are not held through this forward's activation peak.
  opt->zero_grad();
  Tensor loss = model->loss(inputs, targets);
  loss.backward();
  opt->step();
  return loss.item();
}

}  // namespace tg::bench
