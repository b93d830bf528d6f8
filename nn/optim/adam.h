#pragma once
// Adam and AdamW, exactly as torch.optim (1.13, amsgrad off). Per parameter,
// at its step t:
//   Adam:  g += weight_decay * p                   (L2, into the gradient)
//   AdamW: p *= 1 - lr * weight_decay               (decoupled)
//   m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g^2
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State buffers: exp_avg (m), exp_avg_sq (v).
#include "nn/optim/optimizer.h"

namespace tg::nn {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
};

struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.01;
};

class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions options = {});
  void step() override;
  const AdamOptions& options() const { return options_; }

 private:
  AdamOptions options_;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  AdamW(std::vector<ParamGroup> groups, AdamWOptions options = {});
  void step() override;
  const AdamWOptions& options() const { return options_; }

 private:
  AdamWOptions options_;
};

}  // namespace tg::nn
