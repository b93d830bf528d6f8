#pragma once
// LayerNorm over the last axis (tg::layer_norm, fused forward/backward):
// y = (x - mean) / sqrt(var + eps) * weight + bias, weight = 1, bias = 0 at init.
#include "nn/module.h"

namespace tg::nn {

struct LayerNormOptions {
  int64_t dim = 0;  // C, the size of the last axis
  double eps = 1e-5;
  bool elementwise_affine = true;
};

class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(const LayerNormOptions& options);
  // x (..., C) -> (..., C)
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  LayerNormOptions options;
  Tensor weight;  // (C), undefined without affine
  Tensor bias;    // (C)
};

}  // namespace tg::nn
