#pragma once
// Attention layers.
//
// MultiHeadAttention (seeds 000, 001, 004): heads H of size D = C / H;
// softmax over keys of Q K^T / sqrt(D) (tg::scaled_dot_product_attention),
// heads concatenated and projected by "proj".
//  - self-attention (cross = false): one fused projection "qkv" (C -> 3C;
//    rows q, k, v as torch's in_proj_weight);
//  - cross-attention (cross = true): "q" (C -> C) on the queries and a fused
//    "kv" (kdim -> 2C) on the other sequence (keys and values from the
//    encoder, queries from the decoder).
// Incremental decoding keeps a KVCache: each call appends the new keys and
// values, so generation costs O(T) per token instead of O(T^2), and gives the
// same outputs as the full forward pass.
//
// AdditiveAttention (Bahdanau; seed 001, the RNN + attention of seed 002):
// score(q, k_t) = v^T tanh(W1 q + W2 k_t), softmax over t, context = sum_t a_t k_t.
#include <memory>

#include "nn/dropout.h"
#include "nn/linear.h"

namespace tg::nn {

struct AttentionMask {
  bool causal = false;      // query t sees keys <= t (offset by cached keys)
  Tensor key_padding_mask = Tensor();  // (B, Tk), nonzero = padding, not attended; may be undefined
};

// Keys and values seen so far, per layer: (B, H, Tcached, D) each.
struct KVCache {
  Tensor k, v;
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
  void clear() { k = Tensor(); v = Tensor(); }
};

struct MultiHeadAttentionOptions {
  int64_t dim = 0;     // C (model width, query width)
  int64_t heads = 1;   // H; C % H must be 0 (ValueError naming both)
  int64_t kdim = 0;    // width of the key/value sequence for cross-attention; 0 means C
  bool cross = false;
  bool bias = true;
  double dropout = 0.0;  // on the attention output projection
};

class MultiHeadAttention : public Module {
 public:
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  // Self-attention: x (B, T, C) -> (B, T, C). If weights is given it receives
  // the attention probabilities (B, H, T, T) (no gradient), e.g. for plots.
  Tensor forward(const Tensor& x, const AttentionMask& mask = {}, Tensor* weights = nullptr);
  // Cross-attention: queries (B, Tq, C), memory (B, Tk, kdim) -> (B, Tq, C).
  Tensor forward(const Tensor& queries, const Tensor& memory, const AttentionMask& mask = {},
                 Tensor* weights = nullptr);
  // Incremental self-attention: x (B, Tnew, C) are the next positions; their
  // keys/values are appended to cache and they attend causally to all cached
  // positions. Returns (B, Tnew, C).
  Tensor forward_cached(const Tensor& x, KVCache& cache);
  // Incremental cross-attention: the memory's keys/values are computed once
  // into cache (when empty) and reused.
  Tensor forward_cached(const Tensor& queries, const Tensor& memory, KVCache& cache,
                        const AttentionMask& mask = {});
  std::string extra_repr() const override;

  MultiHeadAttentionOptions options;
  std::shared_ptr<Linear> qkv;    // self-attention only
  std::shared_ptr<Linear> q, kv;  // cross-attention only
  std::shared_ptr<Linear> proj;
  std::shared_ptr<Dropout> drop;
};

struct AdditiveAttentionOptions {
  int64_t query_dim = 0;  // Cq
  int64_t key_dim = 0;    // Ck
  int64_t hidden = 0;     // A, the width of the tanh layer
};

class AdditiveAttention : public Module {
 public:
  explicit AdditiveAttention(const AdditiveAttentionOptions& options);
  struct Output {
    Tensor context;  // (B, Ck)
    Tensor weights;  // (B, Tk), differentiable
  };
  // query (B, Cq), keys (B, Tk, Ck); key_padding_mask (B, Tk) nonzero = padding.
  Output forward(const Tensor& query, const Tensor& keys, const Tensor& key_padding_mask = Tensor());
  // W2 k_t depends only on the keys: compute it once per sequence and pass it
  // to every decoder step. keys (B, Tk, Ck) -> (B, Tk, A).
  Tensor project_keys(const Tensor& keys);
  Output forward_projected(const Tensor& query, const Tensor& keys, const Tensor& projected_keys,
                           const Tensor& key_padding_mask = Tensor());
  std::string extra_repr() const override;

  AdditiveAttentionOptions options;
  std::shared_ptr<Linear> w_query;  // Cq -> A, with bias
  std::shared_ptr<Linear> w_key;    // Ck -> A, no bias
  std::shared_ptr<Linear> v;        // A -> 1, no bias
};

}  // namespace tg::nn
