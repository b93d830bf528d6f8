#pragma once
/// \file
/// nn::LayerNorm.
#include "module.h"

namespace tg::nn {

/// Options of LayerNorm.
struct LayerNormOptions {
  int64_t dim = 0;  ///< C, the size of the last axis
  double eps = 1e-5;  ///< added to the variance
  bool elementwise_affine = true;  ///< whether to learn weight and bias
};

/// LayerNorm over the last axis (tg::layer_norm, fused forward/backward):
/// y = (x - mean) / sqrt(var + eps) * weight + bias, weight = 1, bias = 0 at init.
class LayerNorm : public UnaryModule {
 public:
  /// A layer with weight 1 and bias 0.
  explicit LayerNorm(const LayerNormOptions& options);
  /// x (..., C) -> (..., C)
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  LayerNormOptions options;  ///< as constructed
  Tensor weight;  ///< (C), undefined without affine
  Tensor bias;    ///< (C)
};

}  // namespace tg::nn
