#pragma once
/// \file
/// Positional encodings, both returning (T, C) rows for positions
/// start .. start+T-1, to be broadcast-added to token embeddings (B,T,C).
#include "module.h"

namespace tg::nn {

/// Options of both positional encodings.
struct PositionalOptions {
  int64_t max_len = 0;  ///< largest position + 1
  int64_t dim = 0;      ///< C
};

/// The fixed encoding of "Attention is all you need":
/// PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C)).
/// A buffer "pe" (max_len, C), not trained.
class SinusoidalPositionalEncoding : public Module {
 public:
  /// Computes the table for positions 0 .. max_len-1.
  explicit SinusoidalPositionalEncoding(const PositionalOptions& options);
  Tensor forward(int64_t T, int64_t start = 0);  ///< -> (T, C); IndexError past max_len
  std::string extra_repr() const override;

  PositionalOptions options;  ///< as constructed
  Tensor pe;  ///< (max_len, C)
};

/// Learned positions (GPT-2): a parameter "weight" (max_len, C) ~ N(0, 0.02).
class LearnedPositionalEmbedding : public Module {
 public:
  /// A table initialised from the default generator.
  explicit LearnedPositionalEmbedding(const PositionalOptions& options);
  Tensor forward(int64_t T, int64_t start = 0);  ///< -> (T, C); IndexError past max_len
  std::string extra_repr() const override;

  PositionalOptions options;  ///< as constructed
  Tensor weight;  ///< (max_len, C)
};

}  // namespace tg::nn
