#pragma once
// The transformer's position-wise MLP: fc (C -> hidden_mult*C), activation,
// proj (back to C), dropout. Submodules "fc" and "proj".
#include <memory>

#include "nn/dropout.h"
#include "nn/linear.h"

namespace tg::nn {

enum class Activation { relu, gelu, gelu_tanh };
Tensor activate(const Tensor& x, Activation a);

struct FeedForwardOptions {
  int64_t dim = 0;           // C
  int64_t hidden_mult = 4;   // hidden = hidden_mult * C
  Activation activation = Activation::gelu;
  bool bias = true;
  double dropout = 0.0;
};

class FeedForward : public UnaryModule {
 public:
  explicit FeedForward(const FeedForwardOptions& options);
  // x (..., C) -> (..., C)
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  FeedForwardOptions options;
  std::shared_ptr<Linear> fc, proj;
  std::shared_ptr<Dropout> drop;
};

}  // namespace tg::nn
