#pragma once
/// \file
/// Losses, as torch.nn.functional; all numerically stable. Reduction is
/// tg::Reduction {mean, sum, none} (autograd/ops/softmax.h).
#include "../autograd/autograd.h"

namespace tg::nn {

/// Options of cross_entropy, as torch.nn.functional.cross_entropy's.
struct CrossEntropyOptions {
  int64_t ignore_index = -100;  ///< targets equal to it add nothing, and are not counted by the mean
  double label_smoothing = 0.0;  ///< in [0, 1]: the target puts this much mass evenly on all C classes
  Reduction reduction = Reduction::mean;  ///< of the per-element losses
};
/// logits (N, C) or (N, C, d...), targets (N) / (N, d...) int64 -> scalar (or per element for none).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& options = {});
/// log_probs (N, C), targets (N) int64: -log_probs[n, targets[n]], ignore_index excluded from the mean.
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, int64_t ignore_index = -100,
                Reduction reduction = Reduction::mean);
/// (input - target)^2, same shapes.
Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::mean);
/// max(x, 0) - x y + log(1 + exp(-|x|)), targets in [0, 1] of logits' shape;
/// pos_weight (C) or undefined scales the positive term as torch.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets,
                                        Reduction reduction = Reduction::mean, const Tensor& pos_weight = Tensor());

}  // namespace tg::nn
