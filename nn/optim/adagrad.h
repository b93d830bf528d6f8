#pragma once
/// \file
/// nn::Adagrad.
#include "optimizer.h"

namespace tg::nn {

/// Options of Adagrad, as torch.optim.Adagrad's.
struct AdagradOptions {
  double lr = 1e-2;  ///< the learning rate
  double lr_decay = 0;  ///< the step-t learning rate is lr / (1 + (t - 1) * lr_decay)
  double weight_decay = 0;  ///< L2, added to the gradient
  double eps = 1e-10;  ///< added to the denominator
  double initial_accumulator_value = 0;  ///< where sum starts
};

/// Adagrad, exactly as torch.optim.Adagrad (1.13). Per parameter, at step t:
///
///     g += weight_decay * p
///     sum += g^2                      (sum starts at initial_accumulator_value)
///     p -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)
///
/// State buffer: sum.
class Adagrad : public Optimizer {
 public:
  /// One group of parameters, with options' hyperparameters.
  Adagrad(std::vector<Tensor> params, AdagradOptions options = {});
  /// Groups with their own lr or weight_decay (options' where -1).
  Adagrad(std::vector<ParamGroup> groups, AdagradOptions options = {});
  void step() override;
  /// As constructed.
  const AdagradOptions& options() const { return options_; }

 private:
  AdagradOptions options_;
};

}  // namespace tg::nn
