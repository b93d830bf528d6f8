#pragma once
/// \file
/// Transformer layers. Pre-LN is the default:
///
///     x = x + attn(ln1(x));  x = x + mlp(ln2(x))
///
/// post-LN (the original transformer's "add & norm") is an option:
///
///     x = ln1(x + attn(x));  x = ln2(x + mlp(x))
///
/// The encoder layer with a causal mask is the GPT block.
#include <memory>

#include "attention.h"
#include "feedforward.h"
#include "layer_norm.h"

namespace tg::nn {

/// Where a transformer layer normalises: before each sublayer (pre-LN) or
/// after each residual add (post-LN).
enum class NormPosition { pre, post };

/// Options of TransformerEncoderLayer and TransformerDecoderLayer.
struct TransformerLayerOptions {
  int64_t dim = 0;          ///< C
  int64_t heads = 1;        ///< H
  int64_t hidden_mult = 4;  ///< MLP width = hidden_mult * C
  Activation activation = Activation::gelu;  ///< the MLP's
  NormPosition norm = NormPosition::pre;  ///< pre-LN or post-LN
  bool bias = true;         ///< whether the projections have biases
  double dropout = 0.0;     ///< after attention and MLP, before the residual add
  double eps = 1e-5;        ///< the layer norms'
};

/// Self-attention and an MLP, each with a residual connection. Submodules:
/// ln1, attn, ln2, mlp.
class TransformerEncoderLayer : public Module {
 public:
  /// A layer initialised from the default generator.
  explicit TransformerEncoderLayer(const TransformerLayerOptions& options);
  /// x (B, T, C) -> (B, T, C); mask.causal makes it a decoder-only (GPT) block.
  Tensor forward(const Tensor& x, const AttentionMask& mask = {}, Tensor* attn_weights = nullptr);
  /// Causal incremental decoding: x (B, Tnew, C) -> (B, Tnew, C).
  Tensor forward_cached(const Tensor& x, KVCache& cache);
  std::string extra_repr() const override;

  TransformerLayerOptions options;  ///< as constructed
  ///@{
  /// before (pre-LN) or after (post-LN) attn and mlp
  std::shared_ptr<LayerNorm> ln1, ln2;
  ///@}
  std::shared_ptr<MultiHeadAttention> attn;  ///< self-attention
  std::shared_ptr<FeedForward> mlp;  ///< the position-wise MLP
};

/// Causal self-attention, cross-attention to the encoder's output and an
/// MLP, each with a residual connection. Submodules: ln1, self_attn (causal),
/// ln2, cross_attn, ln3, mlp.
class TransformerDecoderLayer : public Module {
 public:
  /// A layer initialised from the default generator.
  explicit TransformerDecoderLayer(const TransformerLayerOptions& options);
  /// x (B, T, C), memory (B, S, C) from the encoder -> (B, T, C).
  /// self_mask is causal by default; memory_mask masks encoder padding.
  Tensor forward(const Tensor& x, const Tensor& memory, const AttentionMask& self_mask = {.causal = true},
                 const AttentionMask& memory_mask = {}, Tensor* cross_weights = nullptr);
  /// Incremental decoding: self-attention appends to self_cache, cross-attention
  /// computes the memory's keys/values once into cross_cache.
  Tensor forward_cached(const Tensor& x, const Tensor& memory, KVCache& self_cache, KVCache& cross_cache,
                        const AttentionMask& memory_mask = {});
  std::string extra_repr() const override;

  TransformerLayerOptions options;  ///< as constructed
  ///@{
  /// around self_attn, cross_attn and mlp
  std::shared_ptr<LayerNorm> ln1, ln2, ln3;
  ///@}
  ///@{
  /// causal self-attention; attention to the memory
  std::shared_ptr<MultiHeadAttention> self_attn, cross_attn;
  ///@}
  std::shared_ptr<FeedForward> mlp;  ///< the position-wise MLP
};

}  // namespace tg::nn
