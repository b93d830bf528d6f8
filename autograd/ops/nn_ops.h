#pragma once
// Fused neural-network primitives: each is one op on the tape with a
// hand-written backward that reuses what forward saved (written in tensor
// ops under create_graph, so differentiable twice).
#include "autograd/generator.h"
#include "autograd/tensor.h"

namespace tg {

// Stable at logits of +-1e4 (max subtracted). Saves the output.
Tensor softmax(const Tensor& x, int64_t axis = -1);
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

enum class Reduction { mean, sum, none };
// logits (N,C) or (N,C,d...) with targets (N) / (N,d...) int64, as torch's
// cross_entropy: ignore_index targets contribute nothing (and are excluded
// from the mean), label_smoothing in [0,1). Saves the softmax.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::mean);
// Over the last axis: (x - mean) * rstd * weight + bias; weight/bias (C) may
// be undefined. Saves mean and rstd.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);
// Zeroes elements with probability p and scales the rest by 1/(1-p); the
// identity when !training or p == 0. Saves the mask.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);
// q (B,H,Tq,D), k and v (B,H,Tk,D) -> (B,H,Tq,D): softmax over keys of
// q k^T / sqrt(D) (+ masks). causal: query t sees keys <= t + (Tk - Tq).
// key_padding_mask (B,Tk), nonzero = padding (not attended). If attn_weights
// is given, it receives the (B,H,Tq,Tk) probabilities (no gradient).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    const Tensor& key_padding_mask = Tensor(), Tensor* attn_weights = nullptr);

}  // namespace tg
