#pragma once
/// \file
/// nn::Dropout.
#include "module.h"

namespace tg::nn {

/// Options of Dropout.
struct DropoutOptions {
  double p = 0.1;                  ///< the probability of zeroing an element, in [0, 1)
  Generator* generator = nullptr;  ///< where masks come from; default_generator() when null
};

/// Zeroes elements with probability p in training and scales the rest by
/// 1/(1-p); the identity in eval() or when p == 0. Masks come from the given
/// generator, so runs are reproducible.
class Dropout : public UnaryModule {
 public:
  /// A dropout layer with the given options.
  explicit Dropout(const DropoutOptions& options = {});
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  DropoutOptions options;  ///< as constructed
};

}  // namespace tg::nn
