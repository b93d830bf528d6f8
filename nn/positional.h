#pragma once
// Positional encodings, both returning (T, C) rows for positions
// start .. start+T-1, to be broadcast-added to token embeddings (B,T,C).
#include "nn/module.h"

namespace tg::nn {

struct PositionalOptions {
  int64_t max_len = 0;  // largest position + 1
  int64_t dim = 0;      // C
};

// The fixed encoding of "Attention is all you need" (seeds 001, 004):
// PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C)).
// A buffer "pe" (max_len, C), not trained.
class SinusoidalPositionalEncoding : public Module {
 public:
  explicit SinusoidalPositionalEncoding(const PositionalOptions& options);
  Tensor forward(int64_t T, int64_t start = 0);  // -> (T, C); IndexError past max_len
  std::string extra_repr() const override;

  PositionalOptions options;
  Tensor pe;  // (max_len, C)
};

// Learned positions (GPT-2): a parameter "weight" (max_len, C) ~ N(0, 0.02).
class LearnedPositionalEmbedding : public Module {
 public:
  explicit LearnedPositionalEmbedding(const PositionalOptions& options);
  Tensor forward(int64_t T, int64_t start = 0);  // -> (T, C); IndexError past max_len
  std::string extra_repr() const override;

  PositionalOptions options;
  Tensor weight;  // (max_len, C)
};

}  // namespace tg::nn
