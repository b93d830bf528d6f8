#include "models/registry.h"

#include <fmt/format.h>

#include "models/gpt.h"
#include "models/rnn_lm.h"

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
    const char* kind = o.cell == CellKind::rnn ? "rnn" : o.cell == CellKind::lstm ? "lstm" : "gru";
    return {{"model", kind},
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
  CellKind cell;
  if (kind == "rnn") cell = CellKind::rnn;
  else if (kind == "lstm") cell = CellKind::lstm;
  else if (kind == "gru") cell = CellKind::gru;
  else throw ValueError(fmt::format("model config: unknown model '{}' (gpt, rnn, lstm or gru)", kind));
  return std::make_shared<RNNLM>(RNNLMOptions{.vocab = field(c, "vocab"), .embed = field(c, "embed"),
                                              .hidden = field(c, "hidden"), .layers = field(c, "layers"), .cell = cell});
}

}  // namespace tg::models
