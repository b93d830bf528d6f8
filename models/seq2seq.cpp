#include "models/seq2seq.h"

#include "autograd/autograd.h"

namespace tg::models {

Seq2SeqRNN::Seq2SeqRNN(const Seq2SeqRNNOptions& o)
    : Seq2SeqModel(o.attention ? "Seq2SeqLSTMAttention" : "Seq2SeqLSTM"), options(o) {
  if (o.vocab <= 0 || o.embed <= 0 || o.hidden <= 0)
    throw ValueError(fmt::format("{}: vocab ({}), embed ({}) and hidden ({}) must be positive", type_name(), o.vocab,
                                 o.embed, o.hidden));
  const int64_t H = o.hidden, A = o.attention_dim > 0 ? o.attention_dim : H;
  embed = register_module("embed", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = o.vocab, .dim = o.embed}));
  encoder = register_module("encoder", std::make_shared<nn::LSTM>(nn::RNNOptions{.input = o.embed, .hidden = H}));
  decoder = register_module("decoder", std::make_shared<nn::LSTMCell>(
                                           nn::RNNCellOptions{.input = o.embed + (o.attention ? H : 0), .hidden = H}));
  if (o.attention)
    attn = register_module("attn", std::make_shared<nn::AdditiveAttention>(
                                       nn::AdditiveAttentionOptions{.query_dim = H, .key_dim = H, .hidden = A}));
  out = register_module("out", std::make_shared<nn::Linear>(nn::LinearOptions{.in = o.attention ? 2 * H : H, .out = o.vocab}));
}

std::string Seq2SeqRNN::extra_repr() const {
  return fmt::format("vocab={}, embed={}, hidden={}, attention={}", options.vocab, options.embed, options.hidden,
                     options.attention ? "additive" : "none");
}

Seq2SeqRNN::Encoded Seq2SeqRNN::encode(const Tensor& src, const Tensor& src_padding) {
  if (src.dim() != 2) throw ShapeError(fmt::format("{}: src must be (B,S), got {}", type_name(), src.shape()));
  nn::RNNOutput r = encoder->forward(embed->forward(src));  // outputs (B,S,H), h/c (1,B,H)
  Encoded e;
  e.outputs = r.output;
  e.padding = src_padding;
  e.state = {r.h.select(0, 0), r.c.select(0, 0)};
  if (attn) e.projected = attn->project_keys(e.outputs);
  return e;
}

Tensor Seq2SeqRNN::step(const Tensor& ids, const Encoded& enc, nn::LSTMState& state, Tensor& context) {
  Tensor x = embed->forward(ids);  // (B,E)
  if (!attn) {
    state = decoder->forward(x, state);
    return out->forward(state.h);
  }
  // Bahdanau: attend with the previous decoder state, feed the context in.
  context = attn->forward_projected(state.h, enc.outputs, enc.projected, enc.padding).context;  // (B,H)
  state = decoder->forward(concat({x, context}, 1), state);
  return out->forward(concat({state.h, context}, 1));
}

Tensor Seq2SeqRNN::forward(const Tensor& src, const Tensor& tgt_in, const Tensor& src_padding) {
  ModulePathScope path(name());
  if (tgt_in.dim() != 2 || tgt_in.size(0) != src.size(0))
    throw ShapeError(fmt::format("{}: tgt_in must be (B,T) with the source's B, got src {} and tgt_in {}", type_name(),
                                 src.shape(), tgt_in.shape()));
  Encoded enc = encode(src, src_padding);
  nn::LSTMState state = enc.state;
  Tensor context;
  std::vector<Tensor> logits;
  for (int64_t t = 0; t < tgt_in.size(1); ++t) logits.push_back(step(tgt_in.select(1, t), enc, state, context));
  return stack(logits, 1);  // (B,T,V)
}

std::vector<std::vector<int64_t>> Seq2SeqModel::greedy_loop(int64_t batch, int64_t bos, int64_t eos, int64_t max_len,
                                                             const std::function<Tensor(const Tensor&, int64_t)>& next) {
  std::vector<std::vector<int64_t>> result(batch);
  std::vector<bool> done(batch, false);
  std::vector<int64_t> prev(batch, bos);
  for (int64_t t = 0; t < max_len; ++t) {
    std::vector<int64_t> ids = argmax(next(from_vector(prev, {batch}), t), 1).to_vector<int64_t>();  // (B)
    bool all = true;
    for (int64_t b = 0; b < batch; ++b) {
      if (!done[b]) {
        if (ids[b] == eos) done[b] = true;
        else result[b].push_back(ids[b]);
      }
      all &= done[b];
    }
    if (all) break;
    prev = ids;
  }
  return result;
}

std::vector<std::vector<int64_t>> Seq2SeqRNN::greedy(const Tensor& src, const Tensor& src_padding, int64_t bos,
                                                     int64_t eos, int64_t max_len) {
  NoGradGuard no_grad;
  eval();
  const int64_t B = src.size(0);
  Encoded enc = encode(src, src_padding);
  nn::LSTMState state = enc.state;
  Tensor context;
  return greedy_loop(B, bos, eos, max_len, [&](const Tensor& prev, int64_t) { return step(prev, enc, state, context); });
}

}  // namespace tg::models
