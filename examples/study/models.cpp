// The line-up: GPT at the configured size, and RNN/LSTM/GRU language models
// whose hidden size H brings their parameter count closest to GPT's.
#include <cstdlib>
#include <stdexcept>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "examples/study/study.h"
#include "models/registry.h"
#include "models/rnn_lm.h"
#include "models/training_state.h"
#include "nn/checkpoint.h"

namespace tg::study {
namespace {

models::CellKind cell_of(const std::string& kind) {
  if (kind == "rnn") return models::CellKind::rnn;
  if (kind == "lstm") return models::CellKind::lstm;
  if (kind == "gru") return models::CellKind::gru;
  throw std::invalid_argument(fmt::format("study: unknown model '{}' (rnn, lstm, gru or gpt)", kind));
}

// Parameters of a one-layer recurrent LM: embedding V*E, G gate blocks of
// (W_ih (H,E), W_hh (H,H), two biases (H)), head H*V + V; G = 1 RNN, 3 GRU, 4 LSTM.
int64_t recurrent_params(models::CellKind cell, int64_t V, int64_t E, int64_t H) {
  const int64_t G = cell == models::CellKind::lstm ? 4 : cell == models::CellKind::gru ? 3 : 1;
  return V * E + G * H * (E + H + 2) + H * V + V;
}

models::GPTOptions gpt_options(const Config& c, int64_t V, int64_t block, models::PositionKind positions) {
  return {.vocab = V, .block = block, .layers = c.gpt_layers, .heads = c.gpt_heads, .dim = c.gpt_dim,
          .positions = positions};
}

}  // namespace

std::shared_ptr<models::LanguageModel> make_model(const Config& c, const std::string& kind, int64_t V, int64_t block,
                                                  uint64_t seed, models::PositionKind positions) {
  // GPT's count, from its shapes: two LayerNorms, qkv, proj and the MLP per
  // block; token and (learned) position embeddings; the final LayerNorm.
  const int64_t C = c.gpt_dim, L = c.gpt_layers;
  const int64_t per_block = 4 * C + (3 * C * C + 3 * C) + (C * C + C) + (4 * C * C + 4 * C) + (4 * C * C + C);
  const int64_t budget = V * C + (positions == models::PositionKind::learned ? block * C : 0) + L * per_block + 2 * C;
  manual_seed(seed);
  if (kind == "gpt") {
    auto g = std::make_shared<models::GPT>(gpt_options(c, V, block, positions));
    if (g->num_parameters() != budget)
      throw std::logic_error(fmt::format("study: GPT has {} parameters, the count the others are matched to says {}",
                                         g->num_parameters(), budget));
    return g;
  }
  const models::CellKind cell = cell_of(kind);
  int64_t H = 1;
  for (int64_t h = 2; h <= 8192; ++h)
    if (std::llabs(recurrent_params(cell, V, c.embed, h) - budget) < std::llabs(recurrent_params(cell, V, c.embed, H) - budget))
      H = h;
  auto m = std::make_shared<models::RNNLM>(models::RNNLMOptions{.vocab = V, .embed = c.embed, .hidden = H, .cell = cell});
  if (m->num_parameters() != recurrent_params(cell, V, c.embed, H))
    throw std::logic_error(fmt::format("study: {} has {} parameters, the count it was matched by says {}", kind,
                                       m->num_parameters(), recurrent_params(cell, V, c.embed, H)));
  return m;
}

std::string shape_of(const models::LanguageModel& m) {
  if (auto* g = dynamic_cast<const models::GPT*>(&m))
    return fmt::format("{} layers x {} heads, C {}", g->options.layers, g->options.heads, g->options.dim);
  auto& r = dynamic_cast<const models::RNNLM&>(m);
  return fmt::format("E {}, H {}", r.options.embed, r.options.hidden);
}

void save_model(const models::LanguageModel& m, const std::string& path, const std::map<std::string, std::string>& extra) {
  models::check_finite_parameters(m, fmt::format("study: {}", path));
  std::map<std::string, std::string> meta = models::config_of(m);
  meta.insert(extra.begin(), extra.end());
  nn::save(m, path, meta);
}

std::shared_ptr<models::LanguageModel> load_model(const std::string& path) {
  auto m = models::make_language_model(nn::load_tensors(path).metadata);
  nn::load(*m, path);
  return m;
}

Tensor embed_tokens(models::LanguageModel& m, const Tensor& ids) {
  if (auto* g = dynamic_cast<models::GPT*>(&m)) return g->wte->forward(ids);
  return dynamic_cast<models::RNNLM&>(m).embedding->forward(ids);
}

// Mirrors GPT::forward and RNNLM::forward after the lookup; part 4 checks
// that the two give the same logits before it trusts the gradients.
Tensor logits_from_embedded(models::LanguageModel& m, const Tensor& x) {
  if (auto* g = dynamic_cast<models::GPT*>(&m)) {
    const int64_t T = x.size(1);
    Tensor h = g->drop->forward(x + (g->wpe ? g->wpe->forward(T, 0) : g->pe->forward(T, 0)));
    for (auto& block : *g->blocks) h = block->forward(h, nn::AttentionMask{.causal = true});
    h = g->ln_f->forward(h);
    return g->head ? g->head->forward(h) : linear(h, g->wte->weight);
  }
  auto& r = dynamic_cast<models::RNNLM&>(m);
  nn::RNNOutput out = r.lstm ? r.lstm->forward(x) : r.gru ? r.gru->forward(x) : r.rnn->forward(x);
  return r.head->forward(r.drop->forward(out.output));
}

}  // namespace tg::study
