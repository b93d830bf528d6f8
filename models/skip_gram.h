#pragma once
// Skip-gram with negative sampling (SGNS) as a differentiable module: two
// embedding tables, `center` (word2vec's syn0, the vectors that are saved) and
// `context` (syn1neg). Its loss is built from library ops so it can be
// gradchecked; models/word2vec.h trains the same tables with a sparse fast path.
#include <cstdint>

#include "../autograd/tensor.h"
#include "../nn/module.h"

namespace tg::models {

class SkipGram : public nn::Module {
 public:
  // Center vectors uniform(-0.5, 0.5)/C and context vectors zero, as word2vec.
  SkipGram(int64_t vocab_size, int64_t dim, Generator* gen = nullptr);

  // inputs (B), outputs (B), negatives (B,K) int64 -> scalar: the negative log
  // likelihood summed (not averaged) over the batch, so one SGD step with rate
  // alpha is word2vec's update for those pairs:
  //   -sum_b [log s(u_out . v_in) + sum_k log s(-u_neg_k . v_in)]
  // with v from `center` and u from `context`.
  Tensor loss(const Tensor& inputs, const Tensor& outputs, const Tensor& negatives) const;

  int64_t vocab_size() const { return center.size(0); }
  int64_t dim() const { return center.size(1); }

  Tensor center;   // (V,C)
  Tensor context;  // (V,C)
};

}  // namespace tg::models
