#include "models/registry.h"

#include <fmt/format.h>

#include "models/gpt.h"
#include "nn/optim.h"

namespace tg::models {
namespace {

int64_t field(const Config& c, const std::string& key) {
  auto it = c.find(key);
  if (it == c.end()) throw ValueError(fmt::format("model config: field '{}' is missing", key));
  try {
    size_t used = 0;
    int64_t v = std::stoll(it->second, &used);
    if (used != it->second.size()) throw std::invalid_argument("trailing characters");
    return v;
  } catch (const std::exception&) {
    throw ValueError(fmt::format("model config: field '{}' is '{}', not an integer", key, it->second));
  }
}

}  // namespace

CellKind cell_kind(const std::string& kind) {
  if (kind == "rnn") return CellKind::rnn;
  if (kind == "lstm") return CellKind::lstm;
  if (kind == "gru") return CellKind::gru;
  throw ValueError(fmt::format("language model: unknown kind '{}' (gpt, rnn, lstm or gru)", kind));
}

std::string kind_of(CellKind cell) {
  switch (cell) {
    case CellKind::rnn: return "rnn";
    case CellKind::lstm: return "lstm";
    case CellKind::gru: return "gru";
  }
  throw ValueError("kind_of: not a cell kind");
}

std::shared_ptr<LanguageModel> make_language_model(const ModelSpec& s) {
  if (s.kind == "gpt")
    return std::make_shared<GPT>(GPTOptions{.vocab = s.vocab, .block = s.block, .layers = s.layers, .heads = s.heads,
                                            .dim = s.dim, .dropout = s.dropout,
                                            .checkpoint_blocks = s.checkpoint ? 1 : 0});
  return std::make_shared<RNNLM>(RNNLMOptions{.vocab = s.vocab, .embed = s.embed, .hidden = s.hidden,
                                              .layers = s.layers, .cell = cell_kind(s.kind), .dropout = s.dropout,
                                              .checkpoint_time = s.checkpoint});
}

std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& kind, LanguageModel& model, double lr) {
  if (kind == "gpt")
    return std::make_unique<nn::AdamW>(nn::weight_decay_groups(model, 0.01),
                                       nn::AdamWOptions{.lr = lr > 0 ? lr : 1e-3, .weight_decay = 0.01});
  cell_kind(kind);  // an unknown kind is an error, not Adam
  return std::make_unique<nn::Adam>(model.parameters(), nn::AdamOptions{.lr = lr > 0 ? lr : 2e-3});
}

Config config_of(const LanguageModel& m) {
  if (auto* g = dynamic_cast<const GPT*>(&m)) {
    const GPTOptions& o = g->options;
    return {{"model", "gpt"},
            {"vocab", std::to_string(o.vocab)},
            {"block", std::to_string(o.block)},
            {"layers", std::to_string(o.layers)},
            {"heads", std::to_string(o.heads)},
            {"dim", std::to_string(o.dim)},
            {"hidden_mult", std::to_string(o.hidden_mult)},
            {"post_ln", o.norm == nn::NormPosition::post ? "1" : "0"},
            {"sinusoidal", o.positions == PositionKind::sinusoidal ? "1" : "0"},
            {"tied", o.tied ? "1" : "0"}};
  }
  if (auto* r = dynamic_cast<const RNNLM*>(&m)) {
    const RNNLMOptions& o = r->options;
    return {{"model", kind_of(o.cell)},
            {"vocab", std::to_string(o.vocab)},
            {"embed", std::to_string(o.embed)},
            {"hidden", std::to_string(o.hidden)},
            {"layers", std::to_string(o.layers)}};
  }
  throw ValueError(fmt::format("config_of: unknown language model {}", m.type_name()));
}

std::shared_ptr<LanguageModel> make_language_model(const Config& c) {
  auto it = c.find("model");
  if (it == c.end()) throw ValueError("model config: field 'model' is missing");
  const std::string& kind = it->second;
  if (kind == "gpt") {
    GPTOptions o{.vocab = field(c, "vocab"), .block = field(c, "block"), .layers = field(c, "layers"),
                 .heads = field(c, "heads"), .dim = field(c, "dim"), .hidden_mult = field(c, "hidden_mult")};
    o.norm = field(c, "post_ln") ? nn::NormPosition::post : nn::NormPosition::pre;
    o.positions = field(c, "sinusoidal") ? PositionKind::sinusoidal : PositionKind::learned;
    o.tied = field(c, "tied") != 0;
    return std::make_shared<GPT>(o);
  }
  const CellKind cell = cell_kind(kind);
  return std::make_shared<RNNLM>(RNNLMOptions{.vocab = field(c, "vocab"), .embed = field(c, "embed"),
                                              .hidden = field(c, "hidden"), .layers = field(c, "layers"),
                                              .cell = cell});
}

}  // namespace tg::models
