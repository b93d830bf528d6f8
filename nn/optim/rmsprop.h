#pragma once
/// \file
/// nn::RMSprop.
#include "optimizer.h"

namespace tg::nn {

/// Options of RMSprop, as torch.optim.RMSprop's.
struct RMSpropOptions {
  double lr = 1e-2;  ///< the learning rate
  double alpha = 0.99;  ///< decay of the squared-gradient average
  double eps = 1e-8;  ///< added to the denominator
  double weight_decay = 0;  ///< L2, added to the gradient
  double momentum = 0;  ///< 0: no momentum buffer
  bool centered = false;  ///< divide by the gradient's estimated standard deviation rather than its RMS
};

/// RMSprop, exactly as torch.optim.RMSprop (1.13). Per parameter:
///
///     g += weight_decay * p
///     sq = alpha * sq + (1 - alpha) * g^2
///     centered: ga = alpha * ga + (1 - alpha) * g;  avg = sqrt(sq - ga^2) + eps
///     else:     avg = sqrt(sq) + eps
///     momentum > 0: buf = momentum * buf + g / avg;  p -= lr * buf
///     else:         p -= lr * g / avg
///
/// State buffers: square_avg, then momentum_buffer (momentum > 0), then grad_avg (centered).
class RMSprop : public Optimizer {
 public:
  /// One group of parameters, with options' hyperparameters.
  RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  /// Groups with their own lr or weight_decay (options' where -1).
  RMSprop(std::vector<ParamGroup> groups, RMSpropOptions options = {});
  void step() override;
  /// As constructed.
  const RMSpropOptions& options() const { return options_; }

 private:
  RMSpropOptions options_;
};

}  // namespace tg::nn
