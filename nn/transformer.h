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
  /// forward() is mlp_sublayer(attention_sublayer(x)). The attention half:
  /// x (B, T, C) -> h (B, T, C), h = x + attn(ln1(x)) pre-LN, ln1(x + attn(x)) post-LN.
  Tensor attention_sublayer(const Tensor& x, const AttentionMask& mask = {}, Tensor* attn_weights = nullptr);
  /// The MLP half, position-wise: h (..., C) -> h + mlp(ln2(h)) pre-LN,
  /// ln2(h + mlp(h)) post-LN. Rows of h may go through it in separate calls.
  Tensor mlp_sublayer(const Tensor& h);
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

/// layer->forward(x, mask) under activation checkpointing (tg::checkpoint),
/// for x (B, T, C): backward keeps x alone (one (B, T, C) tensor), and
/// reruns the attention half as one region (rebuilding its output h) and the
/// MLP half as 2*hidden_mult regions of B*T/(2*hidden_mult) rows each: one
/// region's MLP activations (rows, hidden_mult*C) are half the size of one
/// (B, T, C) tensor, so a rerun rebuilds a few (B, T, C) tensors at a time
/// instead of a whole layer's. Same values and gradients as forward(), the
/// MLP's dropout included (its draws run over the rows in the same order).
Tensor checkpointed_forward(const std::shared_ptr<TransformerEncoderLayer>& layer, const Tensor& x,
                            const AttentionMask& mask = {});

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
