#pragma once
// Linear: y = x W^T + b, one GEMM (tg::linear). Initialised as torch.nn.Linear:
// weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
#include "nn/module.h"

namespace tg::nn {

struct LinearOptions {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = true;
};

class Linear : public UnaryModule {
 public:
  explicit Linear(const LinearOptions& options);
  // x (..., in) -> (..., out)
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  LinearOptions options;
  Tensor weight;  // (out, in)
  Tensor bias;    // (out), undefined without bias
};

}  // namespace tg::nn
