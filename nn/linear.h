#pragma once
/// \file
/// nn::Linear.
#include "module.h"

namespace tg::nn {

/// Options of Linear.
struct LinearOptions {
  int64_t in = 0;     ///< the input width
  int64_t out = 0;    ///< the output width
  bool bias = true;   ///< whether to add a bias
};

/// y = x W^T + b, one GEMM (tg::linear). Initialised as torch.nn.Linear:
/// weight and bias ~ U(-1/sqrt(in), 1/sqrt(in)).
class Linear : public UnaryModule {
 public:
  /// A layer initialised from the default generator.
  explicit Linear(const LinearOptions& options);
  /// x (..., in) -> (..., out)
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  LinearOptions options;  ///< as constructed
  Tensor weight;  ///< (out, in)
  Tensor bias;    ///< (out), undefined without bias
};

}  // namespace tg::nn
