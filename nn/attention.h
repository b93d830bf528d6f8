#pragma once
/// \file
/// Attention layers: nn::MultiHeadAttention (with a KVCache for incremental
/// decoding) and nn::AdditiveAttention.
#include <memory>

#include "dropout.h"
#include "linear.h"

namespace tg::nn {

/// Which keys each query may attend to.
struct AttentionMask {
  bool causal = false;      ///< query t sees keys <= t (offset by cached keys)
  Tensor key_padding_mask = Tensor();  ///< (B, Tk), nonzero = padding, not attended; may be undefined
};

/// Keys and values seen so far, per layer: (B, H, Tcached, D) each.
struct KVCache {
  ///@{
  /// keys, values: (B, H, Tcached, D); undefined while empty
  Tensor k, v;
  ///@}
  /// Tcached, the number of positions held.
  int64_t length() const { return k.defined() ? k.size(2) : 0; }
  /// Empties the cache (before a new sequence).
  void clear() { k = Tensor(); v = Tensor(); }
};

/// Options of MultiHeadAttention.
struct MultiHeadAttentionOptions {
  int64_t dim = 0;     ///< C (model width, query width)
  int64_t heads = 1;   ///< H; C % H must be 0 (ValueError naming both)
  int64_t kdim = 0;    ///< width of the key/value sequence for cross-attention; 0 means C
  bool cross = false;  ///< cross-attention (queries and keys from two sequences) rather than self-attention
  bool bias = true;    ///< whether the projections have biases
  double dropout = 0.0;  ///< on the attention output projection
};

/// Multi-head scaled dot-product attention: heads H of size D = C / H;
/// softmax over keys of Q K^T / sqrt(D) (tg::scaled_dot_product_attention),
/// heads concatenated and projected by "proj".
///  - self-attention (cross = false): one fused projection "qkv" (C -> 3C;
///    rows q, k, v as torch's in_proj_weight);
///  - cross-attention (cross = true): "q" (C -> C) on the queries and a fused
///    "kv" (kdim -> 2C) on the other sequence (keys and values from the
///    encoder, queries from the decoder).
///
/// Incremental decoding keeps a KVCache: each call appends the new keys and
/// values, so generation costs O(T) per token instead of O(T^2), and gives the
/// same outputs as the full forward pass.
class MultiHeadAttention : public Module {
 public:
  /// A layer initialised from the default generator.
  explicit MultiHeadAttention(const MultiHeadAttentionOptions& options);
  /// Self-attention: x (B, T, C) -> (B, T, C). If weights is given it receives
  /// the attention probabilities (B, H, T, T) (no gradient), e.g. for plots.
  Tensor forward(const Tensor& x, const AttentionMask& mask = {}, Tensor* weights = nullptr);
  /// Cross-attention: queries (B, Tq, C), memory (B, Tk, kdim) -> (B, Tq, C).
  Tensor forward(const Tensor& queries, const Tensor& memory, const AttentionMask& mask = {},
                 Tensor* weights = nullptr);
  /// Incremental self-attention: x (B, Tnew, C) are the next positions; their
  /// keys/values are appended to cache and they attend causally to all cached
  /// positions. Returns (B, Tnew, C).
  Tensor forward_cached(const Tensor& x, KVCache& cache);
  /// Incremental cross-attention: the memory's keys/values are computed once
  /// into cache (when empty) and reused.
  Tensor forward_cached(const Tensor& queries, const Tensor& memory, KVCache& cache,
                        const AttentionMask& mask = {});
  std::string extra_repr() const override;

  MultiHeadAttentionOptions options;  ///< as constructed
  std::shared_ptr<Linear> qkv;    ///< self-attention only
  ///@{
  /// cross-attention only
  std::shared_ptr<Linear> q, kv;
  ///@}
  std::shared_ptr<Linear> proj;   ///< the output projection, C -> C
  std::shared_ptr<Dropout> drop;  ///< after proj
};

/// Options of AdditiveAttention.
struct AdditiveAttentionOptions {
  int64_t query_dim = 0;  ///< Cq
  int64_t key_dim = 0;    ///< Ck
  int64_t hidden = 0;     ///< A, the width of the tanh layer
};

/// Additive (Bahdanau) attention, for an RNN decoder over encoder states:
/// score(q, k_t) = v^T tanh(W1 q + W2 k_t), softmax over t, context = sum_t a_t k_t.
class AdditiveAttention : public Module {
 public:
  /// A layer initialised from the default generator.
  explicit AdditiveAttention(const AdditiveAttentionOptions& options);
  /// What forward() returns.
  struct Output {
    Tensor context;  ///< (B, Ck)
    Tensor weights;  ///< (B, Tk), differentiable
  };
  /// query (B, Cq), keys (B, Tk, Ck); key_padding_mask (B, Tk) nonzero = padding.
  Output forward(const Tensor& query, const Tensor& keys, const Tensor& key_padding_mask = Tensor());
  /// W2 k_t depends only on the keys: compute it once per sequence and pass it
  /// to every decoder step. keys (B, Tk, Ck) -> (B, Tk, A).
  Tensor project_keys(const Tensor& keys);
  /// forward() with the keys' projection from project_keys(keys).
  Output forward_projected(const Tensor& query, const Tensor& keys, const Tensor& projected_keys,
                           const Tensor& key_padding_mask = Tensor());
  std::string extra_repr() const override;

  AdditiveAttentionOptions options;  ///< as constructed
  std::shared_ptr<Linear> w_query;  ///< Cq -> A, with bias
  std::shared_ptr<Linear> w_key;    ///< Ck -> A, no bias
  std::shared_ptr<Linear> v;        ///< A -> 1, no bias
};

}  // namespace tg::nn
