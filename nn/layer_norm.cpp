#include "nn/layer_norm.h"

namespace tg::nn {

LayerNorm::LayerNorm(const LayerNormOptions& o) : UnaryModule("LayerNorm"), options(o) {
  if (o.dim <= 0) throw ValueError(fmt::format("LayerNorm: dim ({}) must be positive", o.dim));
  if (!(o.eps > 0)) throw ValueError(fmt::format("LayerNorm: eps ({}) must be positive", o.eps));
  if (o.elementwise_affine) {
    weight = register_parameter("weight", ones({o.dim}));
    bias = register_parameter("bias", zeros({o.dim}));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  ModulePathScope path(name());
  if (!x.defined()) throw ValueError("LayerNorm: input is undefined");
  if (x.dim() < 1 || x.size(-1) != options.dim)
    throw ShapeError(fmt::format("LayerNorm: input {} has last axis {}, expected {}", x.shape(),
                                 x.dim() < 1 ? 0 : x.size(-1), options.dim));
  return layer_norm(x, weight, bias, options.eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("dim={}, eps={}, elementwise_affine={}", options.dim, options.eps, options.elementwise_affine);
}

}  // namespace tg::nn
