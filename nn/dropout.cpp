#include "nn/dropout.h"

namespace tg::nn {

Dropout::Dropout(const DropoutOptions& o) : UnaryModule("Dropout"), options(o) {
  if (!(o.p >= 0 && o.p < 1)) throw ValueError(fmt::format("Dropout: p = {} must be in [0, 1)", o.p));
}

Tensor Dropout::forward(const Tensor& x) {
  ModulePathScope path(name());
  if (!x.defined()) throw ValueError("Dropout: input is undefined");
  return dropout(x, options.p, is_training(), options.generator);
}

std::string Dropout::extra_repr() const { return fmt::format("p={}", options.p); }

}  // namespace tg::nn
