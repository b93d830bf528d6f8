// Multi-head and additive attention, built from tg::linear, shape views and
// tg::scaled_dot_product_attention. Heads are never copied apart: the fused
// projection (B,T,n*C) is viewed as (B,T,n,H,D), and its slices along n,
// transposed to (B,H,T,D), are the operands of the attention op.
#include "nn/attention.h"

#include <limits>

namespace tg::nn {
namespace {

void check_seq(const char* what, const Tensor& x, int64_t width) {
  if (!x.defined()) throw ValueError(fmt::format("MultiHeadAttention: {} is undefined", what));
  if (x.dim() != 3 || x.size(2) != width)
    throw ShapeError(fmt::format("MultiHeadAttention: {} {} must be (B,T,{})", what, x.shape(), width));
}

void check_mask(const AttentionMask& mask, int64_t B, int64_t Tk) {
  const Tensor& m = mask.key_padding_mask;
  if (m.defined() && !(m.shape() == Shape{B, Tk}))
    throw ShapeError(fmt::format("MultiHeadAttention: key_padding_mask {} must be (B,Tk) = ({},{})", m.shape(), B, Tk));
}

// y (B,T,n*C) -> n tensors (B,H,T,D), views of y. Sliced before the
// transpose, so that the slices' backward assembles y's gradient in y's own
// layout (B,T,n,H,D), which the view's backward then reads as (B,T,n*C)
// without a copy.
std::vector<Tensor> split_heads(const Tensor& y, int64_t n, int64_t H) {
  const int64_t B = y.size(0), T = y.size(1), D = y.size(2) / (n * H);
  Tensor h = y.view({B, T, n, H, D});
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n; ++i) out.push_back(h.select(2, i).transpose(1, 2));
  return out;
}

}  // namespace

MultiHeadAttention::MultiHeadAttention(const MultiHeadAttentionOptions& o) : Module("MultiHeadAttention"), options(o) {
  if (o.dim <= 0 || o.heads <= 0 || o.kdim < 0)
    throw ValueError(fmt::format("MultiHeadAttention: dim ({}) and heads ({}) must be positive, kdim ({}) >= 0", o.dim,
                                 o.heads, o.kdim));
  if (o.dim % o.heads != 0)
    throw ValueError(fmt::format("MultiHeadAttention: dim {} is not divisible by heads {}", o.dim, o.heads));
  if (!o.cross && o.kdim != 0 && o.kdim != o.dim)
    throw ValueError(fmt::format("MultiHeadAttention: kdim {} != dim {} needs cross = true", o.kdim, o.dim));
  if (o.cross) options.kdim = o.kdim == 0 ? o.dim : o.kdim;
  const int64_t C = o.dim;
  if (o.cross) {
    q = register_module("q", std::make_shared<Linear>(LinearOptions{.in = C, .out = C, .bias = o.bias}));
    kv = register_module("kv", std::make_shared<Linear>(LinearOptions{.in = options.kdim, .out = 2 * C, .bias = o.bias}));
  } else {
    qkv = register_module("qkv", std::make_shared<Linear>(LinearOptions{.in = C, .out = 3 * C, .bias = o.bias}));
  }
  proj = register_module("proj", std::make_shared<Linear>(LinearOptions{.in = C, .out = C, .bias = o.bias}));
  drop = register_module("drop", std::make_shared<Dropout>(DropoutOptions{.p = o.dropout}));
}

// (B,H,Tq,D) -> proj(heads side by side) (B,Tq,C).
static Tensor merge_and_project(MultiHeadAttention& m, const Tensor& y) {
  const int64_t B = y.size(0), Tq = y.size(2);
  Tensor merged = y.transpose(1, 2).reshape({B, Tq, m.options.dim});
  return m.drop->forward(m.proj->forward(merged));
}

Tensor MultiHeadAttention::forward(const Tensor& x, const AttentionMask& mask, Tensor* weights) {
  ModulePathScope path(name());
  if (options.cross)
    throw ValueError("MultiHeadAttention: built for cross-attention (cross = true); call forward(queries, memory)");
  check_seq("input", x, options.dim);
  check_mask(mask, x.size(0), x.size(1));
  auto h = split_heads(qkv->forward(x), 3, options.heads);
  Tensor y = scaled_dot_product_attention(h[0], h[1], h[2], mask.causal, mask.key_padding_mask, weights);
  return merge_and_project(*this, y);
}

Tensor MultiHeadAttention::forward(const Tensor& queries, const Tensor& memory, const AttentionMask& mask,
                                   Tensor* weights) {
  ModulePathScope path(name());
  if (!options.cross)
    throw ValueError("MultiHeadAttention: built for self-attention (cross = false); call forward(x)");
  check_seq("queries", queries, options.dim);
  check_seq("memory", memory, options.kdim);
  if (memory.size(0) != queries.size(0))
    throw ShapeError(fmt::format("MultiHeadAttention: queries {} and memory {} differ in batch size", queries.shape(),
                                 memory.shape()));
  check_mask(mask, memory.size(0), memory.size(1));
  Tensor qh = split_heads(q->forward(queries), 1, options.heads)[0];
  auto kvh = split_heads(kv->forward(memory), 2, options.heads);
  Tensor y = scaled_dot_product_attention(qh, kvh[0], kvh[1], mask.causal, mask.key_padding_mask, weights);
  return merge_and_project(*this, y);
}

Tensor MultiHeadAttention::forward_cached(const Tensor& x, KVCache& cache) {
  if (options.cross)
    throw ValueError("MultiHeadAttention: built for cross-attention (cross = true); call forward_cached(queries, memory, cache)");
  check_seq("input", x, options.dim);
  auto h = split_heads(qkv->forward(x), 3, options.heads);
  if (cache.length() > 0 && cache.k.size(0) != x.size(0))
    throw ShapeError(fmt::format("MultiHeadAttention: input {} and KV cache {} differ in batch size", x.shape(),
                                 cache.k.shape()));
  const bool empty = cache.length() == 0;
  cache.k = empty ? h[1].contiguous() : concat({cache.k, h[1]}, 2);
  cache.v = empty ? h[2].contiguous() : concat({cache.v, h[2]}, 2);
  // sdpa's causal mask is offset by Tk - Tq: new query t sees every cached key and the new keys <= t.
  return merge_and_project(*this, scaled_dot_product_attention(h[0], cache.k, cache.v, true));
}

Tensor MultiHeadAttention::forward_cached(const Tensor& queries, const Tensor& memory, KVCache& cache,
                                          const AttentionMask& mask) {
  if (!options.cross)
    throw ValueError("MultiHeadAttention: built for self-attention (cross = false); call forward_cached(x, cache)");
  check_seq("queries", queries, options.dim);
  if (cache.length() == 0) {
    check_seq("memory", memory, options.kdim);
    auto kvh = split_heads(kv->forward(memory), 2, options.heads);
    cache.k = kvh[0];
    cache.v = kvh[1];
  }
  if (cache.k.size(0) != queries.size(0))
    throw ShapeError(fmt::format("MultiHeadAttention: queries {} and cached memory keys {} differ in batch size",
                                 queries.shape(), cache.k.shape()));
  check_mask(mask, cache.k.size(0), cache.k.size(2));
  Tensor qh = split_heads(q->forward(queries), 1, options.heads)[0];
  return merge_and_project(*this, scaled_dot_product_attention(qh, cache.k, cache.v, mask.causal, mask.key_padding_mask));
}

std::string MultiHeadAttention::extra_repr() const {
  std::string s = fmt::format("dim={}, heads={}", options.dim, options.heads);
  if (options.cross) s += fmt::format(", kdim={}, cross=true", options.kdim);
  return s + fmt::format(", bias={}, dropout={}", options.bias, options.dropout);
}

// ============================ additive attention ============================
AdditiveAttention::AdditiveAttention(const AdditiveAttentionOptions& o) : Module("AdditiveAttention"), options(o) {
  if (o.query_dim <= 0 || o.key_dim <= 0 || o.hidden <= 0)
    throw ValueError(fmt::format("AdditiveAttention: query_dim ({}), key_dim ({}) and hidden ({}) must be positive",
                                 o.query_dim, o.key_dim, o.hidden));
  w_query = register_module("w_query", std::make_shared<Linear>(LinearOptions{.in = o.query_dim, .out = o.hidden}));
  w_key = register_module("w_key", std::make_shared<Linear>(LinearOptions{.in = o.key_dim, .out = o.hidden, .bias = false}));
  v = register_module("v", std::make_shared<Linear>(LinearOptions{.in = o.hidden, .out = 1, .bias = false}));
}

Tensor AdditiveAttention::project_keys(const Tensor& keys) {
  if (!keys.defined() || keys.dim() != 3 || keys.size(2) != options.key_dim)
    throw ShapeError(fmt::format("AdditiveAttention: keys {} must be (B,Tk,{})",
                                 keys.defined() ? keys.shape().str() : std::string("undefined"), options.key_dim));
  return w_key->forward(keys);
}

AdditiveAttention::Output AdditiveAttention::forward(const Tensor& query, const Tensor& keys,
                                                     const Tensor& key_padding_mask) {
  ModulePathScope path(name());
  return forward_projected(query, keys, project_keys(keys), key_padding_mask);
}

AdditiveAttention::Output AdditiveAttention::forward_projected(const Tensor& query, const Tensor& keys,
                                                               const Tensor& projected_keys,
                                                               const Tensor& key_padding_mask) {
  if (!query.defined() || query.dim() != 2 || query.size(1) != options.query_dim)
    throw ShapeError(fmt::format("AdditiveAttention: query {} must be (B,{})",
                                 query.defined() ? query.shape().str() : std::string("undefined"), options.query_dim));
  if (!keys.defined() || keys.dim() != 3 || keys.size(2) != options.key_dim || keys.size(0) != query.size(0))
    throw ShapeError(fmt::format("AdditiveAttention: keys {} must be (B,Tk,{}) with B = {}",
                                 keys.defined() ? keys.shape().str() : std::string("undefined"), options.key_dim,
                                 query.size(0)));
  const int64_t B = keys.size(0), Tk = keys.size(1);
  if (!projected_keys.defined() || !(projected_keys.shape() == Shape{B, Tk, options.hidden}))
    throw ShapeError(fmt::format("AdditiveAttention: projected keys {} must be (B,Tk,A) = ({},{},{})",
                                 projected_keys.defined() ? projected_keys.shape().str() : std::string("undefined"), B,
                                 Tk, options.hidden));
  // e (B,Tk,A) = tanh(W1 q + W2 k_t); scores (B,Tk) = v^T e.
  Tensor e = tanh(add(w_query->forward(query).unsqueeze(1), projected_keys));
  Tensor scores = v->forward(e).squeeze(2);
  if (key_padding_mask.defined()) {
    if (!(key_padding_mask.shape() == Shape{B, Tk}))
      throw ShapeError(fmt::format("AdditiveAttention: key_padding_mask {} must be (B,Tk) = ({},{})",
                                   key_padding_mask.shape(), B, Tk));
    scores = masked_fill(scores, key_padding_mask, -std::numeric_limits<double>::infinity());
  }
  Tensor weights = softmax(scores, -1);
  Tensor context = matmul(weights.unsqueeze(1), keys).squeeze(1);  // (B,1,Tk) @ (B,Tk,Ck)
  return {context, weights};
}

std::string AdditiveAttention::extra_repr() const {
  return fmt::format("query_dim={}, key_dim={}, hidden={}", options.query_dim, options.key_dim, options.hidden);
}

}  // namespace tg::nn
