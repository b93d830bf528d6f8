#include "nn/linear.h"

#include <cmath>

#include "nn/init.h"

namespace tg::nn {

Linear::Linear(const LinearOptions& o) : UnaryModule("Linear"), options(o) {
  if (o.in <= 0 || o.out <= 0)
    throw ValueError(fmt::format("Linear: in ({}) and out ({}) must be positive", o.in, o.out));
  // torch.nn.Linear: kaiming_uniform(a = sqrt(5)) reduces to U(-1/sqrt(in), 1/sqrt(in)).
  const double k = 1.0 / std::sqrt(static_cast<double>(o.in));
  Tensor w = empty({o.out, o.in});
  init::uniform_(w, -k, k);
  weight = register_parameter("weight", w);
  if (o.bias) {
    Tensor b = empty({o.out});
    init::uniform_(b, -k, k);
    bias = register_parameter("bias", b);
  }
}

Tensor Linear::forward(const Tensor& x) {
  ModulePathScope path(name());
  if (!x.defined()) throw ValueError("Linear: input is undefined");
  if (x.dim() < 1 || x.size(-1) != options.in)
    throw ShapeError(fmt::format("Linear: input {} has {} features, expected {}", x.shape(),
                                 x.dim() < 1 ? 0 : x.size(-1), options.in));
  return linear(x, weight, bias);
}

std::string Linear::extra_repr() const {
  return fmt::format("in={}, out={}, bias={}", options.in, options.out, options.bias);
}

}  // namespace tg::nn
