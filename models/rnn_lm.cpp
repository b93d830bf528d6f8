#include "models/rnn_lm.h"

#include <cstdlib>

#include "autograd/autograd.h"

namespace tg::models {
namespace {

struct RNNState : DecodeState {
  Tensor h, c;  // (L,B,H); undefined before the first step (zeros)
};

}  // namespace

const char* cell_name(CellKind k) {
  switch (k) {
    case CellKind::rnn: return "RNN";
    case CellKind::lstm: return "LSTM";
    case CellKind::gru: return "GRU";
  }
  return "?";
}

int64_t rnn_lm_parameters(const RNNLMOptions& o) {
  const int64_t G = o.cell == CellKind::lstm ? 4 : o.cell == CellKind::gru ? 3 : 1;
  const int64_t V = o.vocab, E = o.embed, H = o.hidden;
  int64_t n = V * E + H * V + V;
  for (int64_t l = 0; l < o.layers; ++l) n += G * H * ((l == 0 ? E : H) + H + 2);
  return n;
}

int64_t hidden_for_parameters(RNNLMOptions o, int64_t budget) {
  auto distance = [&](int64_t H) {
    o.hidden = H;
    return std::llabs(rnn_lm_parameters(o) - budget);
  };
  int64_t best = 8;
  for (int64_t H = 9; H <= 4096; ++H)
    if (distance(H) < distance(best)) best = H;
  return best;
}

RNNLM::RNNLM(const RNNLMOptions& o) : LanguageModel(std::string(cell_name(o.cell)) + "LM"), options(o) {
  if (o.vocab <= 0 || o.embed <= 0 || o.hidden <= 0 || o.layers <= 0)
    throw ValueError(fmt::format("{}LM: vocab ({}), embed ({}), hidden ({}) and layers ({}) must be positive",
                                 cell_name(o.cell), o.vocab, o.embed, o.hidden, o.layers));
  embedding = register_module("embedding", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = o.vocab, .dim = o.embed}));
  nn::RNNOptions ro{.input = o.embed, .hidden = o.hidden, .layers = o.layers, .batch_first = true, .dropout = o.dropout};
  switch (o.cell) {
    case CellKind::rnn: rnn = register_module("rnn", std::make_shared<nn::RNN>(ro)); break;
    case CellKind::lstm: lstm = register_module("rnn", std::make_shared<nn::LSTM>(ro)); break;
    case CellKind::gru: gru = register_module("rnn", std::make_shared<nn::GRU>(ro)); break;
  }
  drop = register_module("drop", std::make_shared<nn::Dropout>(nn::DropoutOptions{.p = o.dropout}));
  head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{.in = o.hidden, .out = o.vocab}));
}

std::string RNNLM::extra_repr() const {
  return fmt::format("vocab={}, embed={}, hidden={}, layers={}, dropout={}", options.vocab, options.embed,
                     options.hidden, options.layers, options.dropout);
}

nn::RNNOutput RNNLM::run(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  if (lstm) return lstm->forward(x, h0, c0);
  if (gru) return gru->forward(x, h0);
  return rnn->forward(x, h0);
}

Tensor RNNLM::forward(const Tensor& ids) {
  if (ids.dim() != 2) throw ShapeError(fmt::format("{}: ids must be (B,T), got {}", type_name(), ids.shape()));
  nn::RNNOutput out = run(embedding->forward(ids), Tensor(), Tensor());
  return head->forward(drop->forward(out.output));
}

std::unique_ptr<DecodeState> RNNLM::start(int64_t /*B*/) const { return std::make_unique<RNNState>(); }

Tensor RNNLM::forward_step(const Tensor& ids, DecodeState& state) {
  auto* s = dynamic_cast<RNNState*>(&state);
  if (!s) throw ValueError(fmt::format("{}::forward_step: the state was not made by this model", type_name()));
  if (ids.dim() != 2) throw ShapeError(fmt::format("{}: ids must be (B,T), got {}", type_name(), ids.shape()));
  nn::RNNOutput out = run(embedding->forward(ids), s->h, s->c);
  s->h = out.h;
  s->c = out.c;
  s->position += ids.size(1);
  return head->forward(drop->forward(out.output));
}

}  // namespace tg::models
