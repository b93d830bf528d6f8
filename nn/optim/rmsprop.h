#pragma once
// RMSprop, exactly as torch.optim.RMSprop (1.13). Per parameter:
//   g += weight_decay * p
//   sq = alpha * sq + (1 - alpha) * g^2
//   centered: ga = alpha * ga + (1 - alpha) * g;  avg = sqrt(sq - ga^2) + eps
//   else:     avg = sqrt(sq) + eps
//   momentum > 0: buf = momentum * buf + g / avg;  p -= lr * buf
//   else:         p -= lr * g / avg
// State buffers: square_avg, then momentum_buffer (momentum > 0), then grad_avg (centered).
#include "nn/optim/optimizer.h"

namespace tg::nn {

struct RMSpropOptions {
  double lr = 1e-2;
  double alpha = 0.99;
  double eps = 1e-8;
  double weight_decay = 0;
  double momentum = 0;
  bool centered = false;
};

class RMSprop : public Optimizer {
 public:
  RMSprop(std::vector<Tensor> params, RMSpropOptions options = {});
  RMSprop(std::vector<ParamGroup> groups, RMSpropOptions options = {});
  void step() override;
  const RMSpropOptions& options() const { return options_; }

 private:
  RMSpropOptions options_;
};

}  // namespace tg::nn
