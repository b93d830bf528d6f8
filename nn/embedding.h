#pragma once
/// \file
/// nn::Embedding.
#include "module.h"

namespace tg::nn {

/// Options of Embedding.
struct EmbeddingOptions {
  int64_t num_embeddings = 0;  ///< V
  int64_t dim = 0;             ///< C
  int64_t padding_idx = -1;    ///< -1: none
};

/// A lookup table of V vectors of size C (tg::embedding, scatter-add
/// backward). weight ~ N(0, 1) as torch.nn.Embedding; the padding row is zero
/// and gets no gradient. An id outside [0, V) is an IndexError naming the id
/// and V.
class Embedding : public UnaryModule {
 public:
  /// A table initialised from the default generator.
  explicit Embedding(const EmbeddingOptions& options);
  /// ids (...) int64 -> (..., C)
  Tensor forward(const Tensor& ids) override;
  std::string extra_repr() const override;

  EmbeddingOptions options;  ///< as constructed
  Tensor weight;  ///< (V, C)
};

}  // namespace tg::nn
