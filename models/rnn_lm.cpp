#include "models/rnn_lm.h"

#include <cmath>
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
  if (lstm) {
    // The LSTM's own option does its trade (see RNNLMOptions::checkpoint_time),
    // set at every call since checkpoint_time may change between steps.
    lstm->options.recompute_gates = options.checkpoint_time;
    return lstm->forward(x, h0, c0);
  }
  if (gru) return gru->forward(x, h0);
  return rnn->forward(x, h0);
}

// The RNN's and the GRU's. checkpoint() keeps one output per region: a
// chunk's output (B,k,H) and final state (L,B,H) travel flattened into one
// vector and are cut apart after. The state is copied out (L B H values), so
// that the next chunk saves that copy and the vector goes once its output
// was concatenated. The last chunk is not checkpointed: backward needs its
// activations first, so a rerun would rebuild what the forward just had.
nn::RNNOutput RNNLM::run_checkpointed(const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), H = options.hidden, L = options.layers;
  const int64_t chunk = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(T))));
  std::vector<Tensor> outputs;
  Tensor h;
  for (int64_t t0 = 0; t0 < T; t0 += chunk) {
    const int64_t k = std::min(chunk, T - t0);
    if (t0 + k == T) {
      nn::RNNOutput last = run(x.narrow(1, t0, k), h, Tensor());
      outputs.push_back(last.output);
      h = last.h;
      break;
    }
    Tensor packed = checkpoint(
        [this](const std::vector<Tensor>& in) {
          nn::RNNOutput o = run(in[0], in[1], Tensor());
          return concat({o.output.reshape({-1}), o.h.reshape({-1})}, 0);
        },
        {x.narrow(1, t0, k), h});
    outputs.push_back(packed.narrow(0, 0, B * k * H).reshape({B, k, H}));
    h = packed.narrow(0, B * k * H, L * B * H).reshape({L, B, H}).clone();
  }
  return {.output = concat(outputs, 1), .h = h, .c = Tensor()};
}

Tensor RNNLM::forward(const Tensor& ids) {
  ModulePathScope path(name());
  if (ids.dim() != 2) throw ShapeError(fmt::format("{}: ids must be (B,T), got {}", type_name(), ids.shape()));
  const Tensor x = embedding->forward(ids);
  nn::RNNOutput out = options.checkpoint_time && !lstm ? run_checkpointed(x) : run(x, Tensor(), Tensor());
  return (*head)((*drop)(out.output));  // through operator(): hooks see them
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
