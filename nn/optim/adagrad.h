#pragma once
// Adagrad, exactly as torch.optim.Adagrad (1.13). Per parameter, at step t:
//   g += weight_decay * p
//   sum += g^2                      (sum starts at initial_accumulator_value)
//   p -= lr / (1 + (t - 1) * lr_decay) * g / (sqrt(sum) + eps)
// State buffer: sum.
#include "nn/optim/optimizer.h"

namespace tg::nn {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0;
  double weight_decay = 0;
  double eps = 1e-10;
  double initial_accumulator_value = 0;
};

class Adagrad : public Optimizer {
 public:
  Adagrad(std::vector<Tensor> params, AdagradOptions options = {});
  Adagrad(std::vector<ParamGroup> groups, AdagradOptions options = {});
  void step() override;
  const AdagradOptions& options() const { return options_; }

 private:
  AdagradOptions options_;
};

}  // namespace tg::nn
