#pragma once
// Stochastic gradient descent with momentum, dampening, Nesterov momentum and
// L2 weight decay, exactly as torch.optim.SGD (1.13):
//   d = grad + weight_decay * p
//   buf = d on the first step, else momentum * buf + (1 - dampening) * d
//   d = nesterov ? d + momentum * buf : buf          (when momentum != 0)
//   p -= lr * d
#include "nn/optim/optimizer.h"

namespace tg::nn {

struct SGDOptions {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  bool nesterov = false;
  double weight_decay = 0;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  void step() override;
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
};

}  // namespace tg::nn
