#pragma once
/// \file
/// Scaled dot-product attention as one op on the tape (forward and backward
/// are GEMMs per head; the probabilities are recomputed, not saved).
#include "../tensor.h"

namespace tg {

/// q (B,H,Tq,D), k and v (B,H,Tk,D) -> (B,H,Tq,D): softmax over keys of
/// q k^T / sqrt(D) (+ masks). causal: query t sees keys <= t + (Tk - Tq).
/// key_padding_mask (B,Tk), nonzero = padding (not attended). If attn_weights
/// is given, it receives the (B,H,Tq,Tk) probabilities (no gradient).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    const Tensor& key_padding_mask = Tensor(), Tensor* attn_weights = nullptr);

}  // namespace tg
