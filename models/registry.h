#pragma once
// Language models by name: the one place that maps a kind ("gpt", "rnn",
// "lstm", "gru") to a model and to the optimizer it trains with. Programs
// describe a model as a ModelSpec (charlm from its flags, the benchmark
// workloads from their table); a checkpoint describes it as a Config (its
// metadata, from config_of) so that `generate` can rebuild it.
#include <map>
#include <memory>
#include <string>

#include "language_model.h"
#include "rnn_lm.h"
#include "../nn/optim/optimizer.h"

namespace tg::models {

// A language model by kind and size. GPT reads block, layers, heads and dim;
// the recurrent kinds read embed, hidden and layers; every kind reads vocab
// and dropout.
struct ModelSpec {
  std::string kind;  // "gpt", "rnn", "lstm" or "gru"
  int64_t vocab = 0;
  int64_t layers = 1;
  int64_t block = 0, heads = 0, dim = 0;  // gpt: context T, attention heads, width C
  int64_t embed = 0, hidden = 0;          // rnn, lstm, gru: E and H
  double dropout = 0.0;
  // Activation checkpointing: gpt checkpoints every block, the recurrent
  // kinds their recurrence over chunks of ceil(sqrt(T)) steps.
  bool checkpoint = false;
};

// The cell of a recurrent kind: "rnn", "lstm", "gru"; ValueError naming the
// kind otherwise.
CellKind cell_kind(const std::string& kind);
// The kind that names a cell ("rnn", "lstm", "gru"): cell_kind's inverse.
std::string kind_of(CellKind cell);

// A fresh model (weights from the default generator); ValueError naming an
// unknown kind, and the model's own for a bad size.
std::shared_ptr<LanguageModel> make_language_model(const ModelSpec& spec);

// The optimizer each kind trains with: AdamW (weight decay 0.01 on the
// matrices, nn::weight_decay_groups) at lr 1e-3 for GPT, Adam at lr 2e-3 for
// the recurrent kinds. lr > 0 replaces the kind's rate.
std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& kind, LanguageModel& model, double lr = 0);

using Config = std::map<std::string, std::string>;

// The settings that rebuild m: {"model": "gpt"|"rnn"|"lstm"|"gru", "vocab": ..., ...}.
Config config_of(const LanguageModel& m);
// Builds the model a config describes (fresh weights); ValueError naming a
// missing or bad field.
std::shared_ptr<LanguageModel> make_language_model(const Config& config);

}  // namespace tg::models
