#include "models/skip_gram.h"

#include <fmt/format.h>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/reduce.h"

namespace tg::models {

SkipGram::SkipGram(int64_t vocab_size, int64_t dim, Generator* gen) : Module("SkipGram") {
  if (vocab_size < 1 || dim < 1)
    throw ValueError(fmt::format("SkipGram: vocab_size {} and dim {} must be positive", vocab_size, dim));
  const double half = 0.5 / static_cast<double>(dim);
  center = register_parameter("center", rand({vocab_size, dim}, DType::f32, gen, -half, half));
  context = register_parameter("context", zeros({vocab_size, dim}));
}

Tensor SkipGram::loss(const Tensor& inputs, const Tensor& outputs, const Tensor& negatives) const {
  if (inputs.dim() != 1 || outputs.shape() != inputs.shape() || negatives.dim() != 2 ||
      negatives.size(0) != inputs.size(0))
    throw ShapeError(fmt::format("SkipGram::loss: inputs {}, outputs {}, negatives {}; expected (B), (B), (B,K)",
                                 inputs.shape().str(), outputs.shape().str(), negatives.shape().str()));
  Tensor v = embedding(center, inputs);    // (B,C)
  Tensor u = embedding(context, outputs);  // (B,C)
  Tensor pos = sum(mul(v, u), {1});        // (B)
  Tensor nll = neg(sum(log_sigmoid(pos)));
  // K is 0 when every negative drawn for a pair was its own output word.
  if (negatives.size(1) == 0) return nll;
  Tensor un = embedding(context, negatives);           // (B,K,C)
  Tensor neg_dot = sum(mul(un, v.unsqueeze(1)), {2});  // (B,K)
  return sub(nll, sum(log_sigmoid(neg(neg_dot))));
}

}  // namespace tg::models
