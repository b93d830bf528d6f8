#include "nn/transformer.h"

#include "autograd/activation_checkpoint.h"

namespace tg::nn {
namespace {

void check_options(const char* layer, const TransformerLayerOptions& o) {
  if (o.dim <= 0 || o.heads <= 0 || o.hidden_mult <= 0)
    throw ValueError(fmt::format("{}: dim ({}), heads ({}) and hidden_mult ({}) must be positive", layer, o.dim,
                                 o.heads, o.hidden_mult));
  if (o.dim % o.heads != 0)
    throw ValueError(fmt::format("{}: dim {} is not divisible by heads {}", layer, o.dim, o.heads));
}

std::shared_ptr<LayerNorm> make_norm(const TransformerLayerOptions& o) {
  return std::make_shared<LayerNorm>(LayerNormOptions{.dim = o.dim, .eps = o.eps});
}

std::shared_ptr<MultiHeadAttention> make_attention(const TransformerLayerOptions& o, bool cross) {
  return std::make_shared<MultiHeadAttention>(
      MultiHeadAttentionOptions{.dim = o.dim, .heads = o.heads, .cross = cross, .bias = o.bias, .dropout = o.dropout});
}

std::shared_ptr<FeedForward> make_mlp(const TransformerLayerOptions& o) {
  return std::make_shared<FeedForward>(FeedForwardOptions{
      .dim = o.dim, .hidden_mult = o.hidden_mult, .activation = o.activation, .bias = o.bias, .dropout = o.dropout});
}

void check_input(const char* layer, const char* what, const Tensor& x, int64_t C) {
  if (!x.defined()) throw ValueError(fmt::format("{}: {} is undefined", layer, what));
  if (x.dim() != 3 || x.size(2) != C)
    throw ShapeError(fmt::format("{}: {} {} must be (B,T,{})", layer, what, x.shape(), C));
}

// One residual sublayer: pre-LN x + f(ln(x)), post-LN ln(x + f(x)).
template <class F>
Tensor sublayer(NormPosition norm, LayerNorm& ln, const Tensor& x, F f) {
  if (norm == NormPosition::pre) return add(x, f(ln.forward(x)));
  return ln.forward(add(x, f(x)));
}

std::string layer_repr(const TransformerLayerOptions& o) {
  return fmt::format("dim={}, heads={}, hidden_mult={}, norm={}, dropout={}", o.dim, o.heads, o.hidden_mult,
                     o.norm == NormPosition::pre ? "pre" : "post", o.dropout);
}

}  // namespace

TransformerEncoderLayer::TransformerEncoderLayer(const TransformerLayerOptions& o)
    : Module("TransformerEncoderLayer"), options(o) {
  check_options("TransformerEncoderLayer", o);
  ln1 = register_module("ln1", make_norm(o));
  attn = register_module("attn", make_attention(o, false));
  ln2 = register_module("ln2", make_norm(o));
  mlp = register_module("mlp", make_mlp(o));
}

Tensor TransformerEncoderLayer::forward(const Tensor& x, const AttentionMask& mask, Tensor* attn_weights) {
  return mlp_sublayer(attention_sublayer(x, mask, attn_weights));
}

Tensor TransformerEncoderLayer::attention_sublayer(const Tensor& x, const AttentionMask& mask, Tensor* attn_weights) {
  ModulePathScope path(name());
  check_input("TransformerEncoderLayer", "input", x, options.dim);
  return sublayer(options.norm, *ln1, x, [&](const Tensor& a) { return attn->forward(a, mask, attn_weights); });
}

Tensor TransformerEncoderLayer::mlp_sublayer(const Tensor& h) {
  ModulePathScope path(name());
  if (!h.defined() || h.dim() < 1 || h.size(-1) != options.dim)
    throw ShapeError(fmt::format("TransformerEncoderLayer: MLP input {} must be (..., {})",
                                 h.defined() ? fmt::format("{}", h.shape()) : std::string("undefined"), options.dim));
  return sublayer(options.norm, *ln2, h, [&](const Tensor& a) { return mlp->forward(a); });
}

Tensor TransformerEncoderLayer::forward_cached(const Tensor& x, KVCache& cache) {
  check_input("TransformerEncoderLayer", "input", x, options.dim);
  Tensor h = sublayer(options.norm, *ln1, x, [&](const Tensor& a) { return attn->forward_cached(a, cache); });
  return sublayer(options.norm, *ln2, h, [&](const Tensor& a) { return mlp->forward(a); });
}

std::string TransformerEncoderLayer::extra_repr() const { return layer_repr(options); }

Tensor checkpointed_forward(const std::shared_ptr<TransformerEncoderLayer>& layer, const Tensor& x,
                            const AttentionMask& mask) {
  check_input("TransformerEncoderLayer", "input", x, layer->options.dim);
  // The attention half's output h is not kept: the MLP chunks save it by
  // reference, and the first of them to run backward gets it from the
  // attention checkpoint's rerun, whose graph that checkpoint's backward
  // reuses. So a layer holds its input x alone between forward and backward,
  // and each half is still rerun once.
  const Tensor h = checkpoint(
      [layer, mask](const std::vector<Tensor>& in) { return layer->attention_sublayer(in[0], mask); }, {x},
      {.generators = {}, .output_by_reference = true});
  const int64_t B = h.size(0), T = h.size(1), C = h.size(2), N = B * T;
  const int64_t regions = 2 * layer->options.hidden_mult, rows = (N + regions - 1) / regions;
  std::vector<Tensor> out;
  for (int64_t r0 = 0; r0 < N; r0 += rows) {
    const int64_t n = std::min(rows, N - r0);
    out.push_back(checkpoint(
        [layer, N, C, r0, n](const std::vector<Tensor>& in) {
          return layer->mlp_sublayer(in[0].reshape({N, C}).narrow(0, r0, n));  // (n, C) rows of (B*T, C)
        },
        {h}));
  }
  return concat(out, 0).reshape({B, T, C});
}

TransformerDecoderLayer::TransformerDecoderLayer(const TransformerLayerOptions& o)
    : Module("TransformerDecoderLayer"), options(o) {
  check_options("TransformerDecoderLayer", o);
  ln1 = register_module("ln1", make_norm(o));
  self_attn = register_module("self_attn", make_attention(o, false));
  ln2 = register_module("ln2", make_norm(o));
  cross_attn = register_module("cross_attn", make_attention(o, true));
  ln3 = register_module("ln3", make_norm(o));
  mlp = register_module("mlp", make_mlp(o));
}

Tensor TransformerDecoderLayer::forward(const Tensor& x, const Tensor& memory, const AttentionMask& self_mask,
                                        const AttentionMask& memory_mask, Tensor* cross_weights) {
  ModulePathScope path(name());
  check_input("TransformerDecoderLayer", "input", x, options.dim);
  check_input("TransformerDecoderLayer", "memory", memory, options.dim);
  Tensor h = sublayer(options.norm, *ln1, x, [&](const Tensor& a) { return self_attn->forward(a, self_mask); });
  h = sublayer(options.norm, *ln2, h,
               [&](const Tensor& a) { return cross_attn->forward(a, memory, memory_mask, cross_weights); });
  return sublayer(options.norm, *ln3, h, [&](const Tensor& a) { return mlp->forward(a); });
}

Tensor TransformerDecoderLayer::forward_cached(const Tensor& x, const Tensor& memory, KVCache& self_cache,
                                               KVCache& cross_cache, const AttentionMask& memory_mask) {
  check_input("TransformerDecoderLayer", "input", x, options.dim);
  Tensor h = sublayer(options.norm, *ln1, x, [&](const Tensor& a) { return self_attn->forward_cached(a, self_cache); });
  h = sublayer(options.norm, *ln2, h,
               [&](const Tensor& a) { return cross_attn->forward_cached(a, memory, cross_cache, memory_mask); });
  return sublayer(options.norm, *ln3, h, [&](const Tensor& a) { return mlp->forward(a); });
}

std::string TransformerDecoderLayer::extra_repr() const { return layer_repr(options); }

}  // namespace tg::nn
