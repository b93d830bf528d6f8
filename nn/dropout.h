#pragma once
// Dropout: zeroes elements with probability p in training and scales the rest
// by 1/(1-p); the identity in eval() or when p == 0. Masks come from the given
// generator (default_generator() when none), so runs are reproducible.
#include "nn/module.h"

namespace tg::nn {

struct DropoutOptions {
  double p = 0.1;
  Generator* generator = nullptr;
};

class Dropout : public UnaryModule {
 public:
  explicit Dropout(const DropoutOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  DropoutOptions options;
};

}  // namespace tg::nn
