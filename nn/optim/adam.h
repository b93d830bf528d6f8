#pragma once
/// \file
/// nn::Adam and nn::AdamW, exactly as torch.optim (1.13, amsgrad off). Per
/// parameter, at its step t:
///
///     Adam:  g += weight_decay * p                   (L2, into the gradient)
///     AdamW: p *= 1 - lr * weight_decay               (decoupled)
///     m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
///     p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
///
/// State buffers: exp_avg (m), exp_avg_sq (v).
#include "optimizer.h"

namespace tg::nn {

/// Options of Adam, as torch.optim.Adam's.
struct AdamOptions {
  double lr = 1e-3;  ///< the learning rate
  double beta1 = 0.9;  ///< decay of the first moment m
  double beta2 = 0.999;  ///< decay of the second moment v
  double eps = 1e-8;  ///< added to the denominator
  double weight_decay = 0;  ///< L2, added to the gradient
};

/// Options of AdamW, as torch.optim.AdamW's.
struct AdamWOptions {
  double lr = 1e-3;  ///< the learning rate
  double beta1 = 0.9;  ///< decay of the first moment m
  double beta2 = 0.999;  ///< decay of the second moment v
  double eps = 1e-8;  ///< added to the denominator
  double weight_decay = 0.01;  ///< decoupled: p *= 1 - lr * weight_decay
};

/// Adam, with L2 weight decay added to the gradient (see the file's formulas).
class Adam : public Optimizer {
 public:
  /// One group of parameters, with options' hyperparameters.
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  /// Groups with their own lr or weight_decay (options' where -1).
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {});
  void step() override;
  /// As constructed.
  const AdamOptions& options() const { return options_; }

 private:
  AdamOptions options_;
};

/// Adam with decoupled weight decay (see the file's formulas).
class AdamW : public Optimizer {
 public:
  /// One group of parameters, with options' hyperparameters.
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  /// Groups with their own lr or weight_decay (options' where -1), e.g. from
  /// weight_decay_groups().
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  void step() override;
  /// As constructed.
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
};

}  // namespace tg::nn
