#pragma once
/// \file
/// Softmax and the losses built on it, each one fused op on the tape whose
/// backward reuses the probabilities forward saved (written in tensor ops
/// under create_graph, so differentiable twice).
#include "../tensor.h"

namespace tg {

/// exp(x) / sum(exp(x)) along axis. Stable at logits of +-1e4 (max subtracted). Saves the output.
Tensor softmax(const Tensor& x, int64_t axis = -1);
/// x - logsumexp(x) along axis, stable.
Tensor log_softmax(const Tensor& x, int64_t axis = -1);

/// The softmax's Jacobian at probabilities y (a softmax along axis) applied
/// to v of y's shape: y (v - sum(y v)) along axis. Linear in v and symmetric,
/// so it is softmax's backward and its tangent rule; differentiable in y too.
Tensor softmax_jvp(const Tensor& y, const Tensor& v, int64_t axis = -1);

/// How a loss reduces its per-element values: their mean, their sum, or none (the values).
enum class Reduction { mean, sum, none };
/// logits (N,C) or (N,C,d...) with targets (N) / (N,d...) int64, as torch's
/// cross_entropy: ignore_index targets contribute nothing (and are excluded
/// from the mean), label_smoothing in [0,1). Saves the softmax.
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     double label_smoothing = 0.0, Reduction reduction = Reduction::mean);

}  // namespace tg
