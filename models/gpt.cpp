#include "models/gpt.h"

#include <cmath>

#include "autograd/autograd.h"
#include "nn/init.h"

namespace tg::models {
namespace {

struct GPTState : DecodeState {
  std::vector<nn::KVCache> caches;  // one per block
};

}  // namespace

GPT::GPT(const GPTOptions& o) : LanguageModel("GPT"), options(o) {
  if (o.vocab <= 0 || o.block <= 0 || o.layers <= 0 || o.dim <= 0)
    throw ValueError(fmt::format("GPT: vocab ({}), block ({}), layers ({}) and dim ({}) must be positive", o.vocab,
                                 o.block, o.layers, o.dim));
  if (o.checkpoint_blocks < 0)
    throw ValueError(fmt::format("GPT: checkpoint_blocks ({}) must be 0 (none) or positive", o.checkpoint_blocks));
  wte = register_module("wte", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = o.vocab, .dim = o.dim}));
  if (o.positions == PositionKind::learned)
    wpe = register_module("wpe", std::make_shared<nn::LearnedPositionalEmbedding>(nn::PositionalOptions{.max_len = o.block, .dim = o.dim}));
  else
    pe = register_module("pe", std::make_shared<nn::SinusoidalPositionalEncoding>(nn::PositionalOptions{.max_len = o.block, .dim = o.dim}));
  drop = register_module("drop", std::make_shared<nn::Dropout>(nn::DropoutOptions{.p = o.dropout}));
  blocks = register_module("blocks", std::make_shared<nn::ModuleList<nn::TransformerEncoderLayer>>());
  for (int64_t l = 0; l < o.layers; ++l)
    blocks->push_back(std::make_shared<nn::TransformerEncoderLayer>(nn::TransformerLayerOptions{
        .dim = o.dim, .heads = o.heads, .hidden_mult = o.hidden_mult, .activation = o.activation, .norm = o.norm,
        .bias = o.bias, .dropout = o.dropout}));
  ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.dim = o.dim}));
  if (!o.tied) head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{.in = o.dim, .out = o.vocab, .bias = false}));

  // GPT-2 initialisation (see the header).
  const double residual_std = 0.02 / std::sqrt(2.0 * o.layers);
  for (auto& [name, p] : named_parameters()) {
    bool is_norm = name.find("ln") != std::string::npos;
    if (is_norm) continue;  // LayerNorm keeps weight 1, bias 0
    if (p.dim() < 2) {
      nn::init::zeros_(p);
    } else if (name.ends_with("attn.proj.weight") || name.ends_with("mlp.proj.weight")) {
      nn::init::normal_(p, 0.0, residual_std);
    } else {
      nn::init::normal_(p, 0.0, 0.02);
    }
  }
}

std::string GPT::extra_repr() const {
  return fmt::format("vocab={}, block={}, layers={}, heads={}, dim={}, {}, {}", options.vocab, options.block,
                     options.layers, options.heads, options.dim,
                     options.norm == nn::NormPosition::pre ? "pre-LN" : "post-LN", options.tied ? "tied" : "untied");
}

Tensor GPT::embed(const Tensor& ids, int64_t start) {
  if (ids.dim() != 2) throw ShapeError(fmt::format("GPT: ids must be (B,T), got {}", ids.shape()));
  const int64_t T = ids.size(1);
  if (start + T > options.block)
    throw ValueError(fmt::format("GPT: positions {}..{} exceed the block size {}", start, start + T - 1, options.block));
  Tensor tok = wte->forward(ids);                                   // (B,T,C)
  Tensor pos = wpe ? wpe->forward(T, start) : pe->forward(T, start);  // (T,C)
  return drop->forward(tok + pos);
}

Tensor GPT::unembed(const Tensor& x) {
  Tensor h = ln_f->forward(x);
  return head ? head->forward(h) : linear(h, wte->weight);  // (B,T,V)
}

Tensor GPT::forward(const Tensor& ids) {
  ModulePathScope path(name());
  Tensor x = embed(ids, 0);
  nn::AttentionMask causal{.causal = true};
  const int64_t every = options.checkpoint_blocks;
  int64_t l = 0;
  ModulePathScope list_path(blocks->name());  // the list's forward is this loop
  for (const std::shared_ptr<nn::TransformerEncoderLayer>& block : *blocks) {
    if (every > 0 && l++ % every == 0)
      x = nn::checkpointed_forward(block, x, causal);
    else
      x = block->forward(x, causal);
  }
  return unembed(x);
}

std::unique_ptr<DecodeState> GPT::start(int64_t /*B*/) const {
  auto s = std::make_unique<GPTState>();
  s->caches.resize(options.layers);
  return s;
}

Tensor GPT::forward_step(const Tensor& ids, DecodeState& state) {
  auto* s = dynamic_cast<GPTState*>(&state);
  if (!s) throw ValueError("GPT::forward_step: the state was not made by GPT::start");
  Tensor x = embed(ids, s->position);
  for (int64_t l = 0; l < options.layers; ++l) x = (*blocks)[l].forward_cached(x, s->caches[l]);
  s->position += ids.size(1);
  return unembed(x);
}

}  // namespace tg::models
