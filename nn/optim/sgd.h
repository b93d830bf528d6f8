#pragma once
/// \file
/// nn::SGD.
#include "optimizer.h"

namespace tg::nn {

/// Options of SGD, as torch.optim.SGD's.
struct SGDOptions {
  double lr = 1e-2;  ///< the learning rate
  double momentum = 0;  ///< 0: plain gradient descent
  double dampening = 0;  ///< scales the gradient's share of the momentum buffer by 1 - dampening
  bool nesterov = false;  ///< Nesterov momentum (needs momentum > 0)
  double weight_decay = 0;  ///< L2, added to the gradient
};

/// Stochastic gradient descent with momentum, dampening, Nesterov momentum and
/// L2 weight decay, exactly as torch.optim.SGD (1.13):
///
///     d = grad + weight_decay * p
///     buf = d on the first step, else momentum * buf + (1 - dampening) * d
///     d = nesterov ? d + momentum * buf : buf          (when momentum != 0)
///     p -= lr * d
class SGD : public Optimizer {
 public:
  /// One group of parameters, with options' hyperparameters.
  SGD(std::vector<Tensor> params, SGDOptions options);
  /// Groups with their own lr or weight_decay (options' where -1).
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  void step() override;
  /// As constructed.
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
};

}  // namespace tg::nn
