#include "models/transformer.h"

#include "autograd/autograd.h"
#include "nn/init.h"

namespace tg::models {
namespace {

void check_options(const char* who, const TransformerOptions& o) {
  if (o.vocab <= 0 || o.max_len <= 0 || o.layers <= 0 || o.dim <= 0)
    throw ValueError(fmt::format("{}: vocab ({}), max_len ({}), layers ({}) and dim ({}) must be positive", who,
                                 o.vocab, o.max_len, o.layers, o.dim));
  if (o.checkpoint_layers < 0)
    throw ValueError(fmt::format("{}: checkpoint_layers ({}) must be 0 (none) or positive", who, o.checkpoint_layers));
}

nn::TransformerLayerOptions layer_options(const TransformerOptions& o) {
  return {.dim = o.dim, .heads = o.heads, .hidden_mult = o.hidden_mult, .activation = o.activation, .norm = o.norm,
          .dropout = o.dropout};
}

}  // namespace

// Token embeddings ~ N(0, 1/C), so that after the sqrt(C) scaling of the
// forward they have unit scale, like the sinusoids they are added to (as in
// the original transformer). With torch's N(0, 1) default they would be sqrt(C)
// times larger and drown the positions: on digit-string reversal, accuracy
// then fell with length.
static void scale_for_sinusoids(const Tensor& weight, int64_t dim) {
  nn::init::normal_(weight, 0.0, 1.0 / std::sqrt(static_cast<double>(dim)));
}

// ---------------------------------------------------------------- encoder
TransformerEncoder::TransformerEncoder(const TransformerOptions& o) : Module("TransformerEncoder"), options(o) {
  check_options("TransformerEncoder", o);
  embed = register_module("embed", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = o.vocab, .dim = o.dim}));
  if (o.sinusoidal) scale_for_sinusoids(embed->weight, o.dim);
  nn::PositionalOptions po{.max_len = o.max_len, .dim = o.dim};
  if (o.sinusoidal) pe = register_module("pe", std::make_shared<nn::SinusoidalPositionalEncoding>(po));
  else wpe = register_module("wpe", std::make_shared<nn::LearnedPositionalEmbedding>(po));
  drop = register_module("drop", std::make_shared<nn::Dropout>(nn::DropoutOptions{.p = o.dropout}));
  layers = register_module("layers", std::make_shared<nn::ModuleList<nn::TransformerEncoderLayer>>());
  for (int64_t l = 0; l < o.layers; ++l) layers->push_back(std::make_shared<nn::TransformerEncoderLayer>(layer_options(o)));
  if (o.norm == nn::NormPosition::pre) ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.dim = o.dim}));
}

Tensor TransformerEncoder::forward(const Tensor& ids, const Tensor& padding) {
  ModulePathScope path(name());
  if (ids.dim() != 2) throw ShapeError(fmt::format("TransformerEncoder: ids must be (B,S), got {}", ids.shape()));
  const int64_t S = ids.size(1);
  // Token embeddings are scaled by sqrt(C) against the unit-scale sinusoids, as in the original.
  Tensor x = pe ? embed->forward(ids) * std::sqrt(static_cast<double>(options.dim)) + pe->forward(S)
                : embed->forward(ids) + wpe->forward(S);
  x = drop->forward(x);
  nn::AttentionMask mask{.key_padding_mask = padding};
  int64_t l = 0;
  ModulePathScope list_path(layers->name());  // the list's forward is this loop
  for (const std::shared_ptr<nn::TransformerEncoderLayer>& layer : *layers) {
    if (options.checkpoint_layers > 0 && l++ % options.checkpoint_layers == 0)
      x = nn::checkpointed_forward(layer, x, mask);
    else
      x = layer->forward(x, mask);
  }
  return ln_f ? ln_f->forward(x) : x;
}

// ---------------------------------------------------------------- classifier
TransformerClassifier::TransformerClassifier(const TransformerOptions& o, int64_t classes, Pooling p)
    : Module("TransformerClassifier"), pooling(p) {
  if (classes < 2) throw ValueError(fmt::format("TransformerClassifier: need at least 2 classes, got {}", classes));
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(o));
  head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{.in = o.dim, .out = classes}));
}

Tensor TransformerClassifier::forward(const Tensor& ids, const Tensor& padding) {
  ModulePathScope path(name());
  Tensor h = encoder->forward(ids, padding);  // (B,S,C)
  Tensor pooled;
  if (pooling == Pooling::first) {
    pooled = h.select(1, 0);  // (B,C)
  } else if (!padding.defined()) {
    pooled = mean(h, {1});
  } else {
    // Mean over the real tokens only: weights 1/len on non-padding positions.
    Tensor keep = eq(padding, zeros_like(padding)).to(h.dtype());             // (B,S)
    Tensor w = keep / sum(keep, {1}, true);                                    // (B,S)
    pooled = sum(h * w.unsqueeze(2), {1});                                     // (B,C)
  }
  return head->forward(pooled);
}

// ---------------------------------------------------------------- encoder-decoder
EncoderDecoderTransformer::EncoderDecoderTransformer(const TransformerOptions& o)
    : Seq2SeqModel("EncoderDecoderTransformer"), options(o) {
  check_options("EncoderDecoderTransformer", o);
  encoder = register_module("encoder", std::make_shared<TransformerEncoder>(o));
  tgt_embed = register_module("tgt_embed", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = o.vocab, .dim = o.dim}));
  if (o.sinusoidal) scale_for_sinusoids(tgt_embed->weight, o.dim);
  nn::PositionalOptions po{.max_len = o.max_len, .dim = o.dim};
  if (o.sinusoidal) pe = register_module("pe", std::make_shared<nn::SinusoidalPositionalEncoding>(po));
  else wpe = register_module("wpe", std::make_shared<nn::LearnedPositionalEmbedding>(po));
  drop = register_module("drop", std::make_shared<nn::Dropout>(nn::DropoutOptions{.p = o.dropout}));
  layers = register_module("layers", std::make_shared<nn::ModuleList<nn::TransformerDecoderLayer>>());
  for (int64_t l = 0; l < o.layers; ++l) layers->push_back(std::make_shared<nn::TransformerDecoderLayer>(layer_options(o)));
  if (o.norm == nn::NormPosition::pre) ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.dim = o.dim}));
  head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{.in = o.dim, .out = o.vocab}));
}

Tensor EncoderDecoderTransformer::embed_target(const Tensor& ids, int64_t start) {
  const int64_t T = ids.size(1);
  Tensor x = pe ? tgt_embed->forward(ids) * std::sqrt(static_cast<double>(options.dim)) + pe->forward(T, start)
                : tgt_embed->forward(ids) + wpe->forward(T, start);
  return drop->forward(x);
}

Tensor EncoderDecoderTransformer::decode(const Tensor& x) { return head->forward(ln_f ? ln_f->forward(x) : x); }

Tensor EncoderDecoderTransformer::forward(const Tensor& src, const Tensor& tgt_in, const Tensor& src_padding) {
  ModulePathScope path(name());
  if (tgt_in.dim() != 2 || src.dim() != 2 || tgt_in.size(0) != src.size(0))
    throw ShapeError(fmt::format("EncoderDecoderTransformer: src (B,S) and tgt_in (B,T) must share B, got {} and {}",
                                 src.shape(), tgt_in.shape()));
  Tensor memory = encoder->forward(src, src_padding);  // (B,S,C)
  Tensor x = embed_target(tgt_in, 0);                   // (B,T,C)
  nn::AttentionMask memory_mask{.key_padding_mask = src_padding};
  int64_t l = 0;
  ModulePathScope list_path(layers->name());  // the list's forward is this loop
  for (const std::shared_ptr<nn::TransformerDecoderLayer>& layer : *layers) {
    if (options.checkpoint_layers > 0 && l++ % options.checkpoint_layers == 0)
      x = checkpoint(
          [layer, memory_mask](const std::vector<Tensor>& in) {
            return layer->forward(in[0], in[1], {.causal = true}, memory_mask);
          },
          {x, memory});
    else
      x = layer->forward(x, memory, {.causal = true}, memory_mask);
  }
  return decode(x);
}

std::vector<std::vector<int64_t>> EncoderDecoderTransformer::greedy(const Tensor& src, const Tensor& src_padding,
                                                                    int64_t bos, int64_t eos, int64_t max_len) {
  NoGradGuard no_grad;
  eval();
  const int64_t B = src.size(0);
  max_len = std::min(max_len, options.max_len);
  Tensor memory = encoder->forward(src, src_padding);
  nn::AttentionMask memory_mask{.key_padding_mask = src_padding};
  std::vector<nn::KVCache> self_cache(options.layers), cross_cache(options.layers);
  return greedy_loop(B, bos, eos, max_len, [&](const Tensor& prev, int64_t t) {
    Tensor x = embed_target(prev.reshape({B, 1}), t);  // (B,1,C)
    for (int64_t l = 0; l < options.layers; ++l)
      x = (*layers)[l].forward_cached(x, memory, self_cache[l], cross_cache[l], memory_mask);
    return decode(x).select(1, 0);  // (B,V)
  });
}

}  // namespace tg::models
