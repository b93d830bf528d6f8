#pragma once
/// \file
/// nn::FeedForward, the transformer's position-wise MLP, and its activations.
#include <memory>

#include "dropout.h"
#include "linear.h"

namespace tg::nn {

/// The activation between FeedForward's two layers.
enum class Activation {
  relu,      ///< max(x, 0)
  gelu,      ///< x Phi(x), with the exact erf
  gelu_tanh  ///< GELU's tanh approximation (GPT-2's)
};
/// Applies the activation a to x.
Tensor activate(const Tensor& x, Activation a);

/// Options of FeedForward.
struct FeedForwardOptions {
  int64_t dim = 0;           ///< C
  int64_t hidden_mult = 4;   ///< hidden = hidden_mult * C
  Activation activation = Activation::gelu;  ///< between fc and proj
  bool bias = true;          ///< whether fc and proj have biases
  double dropout = 0.0;      ///< on the output
};

/// The transformer's position-wise MLP: fc (C -> hidden_mult*C), activation,
/// proj (back to C), dropout. Submodules "fc" and "proj".
class FeedForward : public UnaryModule {
 public:
  /// An MLP with the given options.
  explicit FeedForward(const FeedForwardOptions& options);
  /// x (..., C) -> (..., C)
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  FeedForwardOptions options;  ///< as constructed
  ///@{
  /// C -> hidden, hidden -> C
  std::shared_ptr<Linear> fc, proj;
  ///@}
  std::shared_ptr<Dropout> drop;     ///< on the output
};

}  // namespace tg::nn
