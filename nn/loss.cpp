// Losses, as torch.nn.functional. cross_entropy is the core's fused op
// (log-softmax, label smoothing and ignore_index in one kernel); the others
// are short compositions of stable primitives, so their gradients come free.
#include "nn/loss.h"

#include <limits>

#include <fmt/format.h>

namespace tg::nn {
namespace {

Tensor reduce(const Tensor& loss, Reduction reduction) {
  switch (reduction) {
    case Reduction::none:
      return loss;
    case Reduction::sum:
      return sum(loss);
    case Reduction::mean:
      return mean(loss);
  }
  throw ValueError("loss: unknown reduction");
}

// True when `from` broadcasts to `to` without changing it (right-aligned, dims 1 or equal).
bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  for (int d = 1; d <= from.size(); ++d)
    if (from[from.size() - d] != 1 && from[from.size() - d] != to[to.size() - d]) return false;
  return true;
}

void check_defined(const char* op, const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) throw ValueError(fmt::format("{}: input or target is undefined", op));
}

void check_same(const char* op, const Tensor& input, const Tensor& target) {
  check_defined(op, input, target);
  if (!(input.shape() == target.shape()))
    throw ShapeError(
        fmt::format("{}: input {} and target {} must have the same shape", op, input.shape(), target.shape()));
  if (input.dtype() != target.dtype() || !is_floating(input.dtype()))
    throw DTypeError(fmt::format("{}: input ({}) and target ({}) must be the same floating dtype", op,
                                 dtype_name(input.dtype()), dtype_name(target.dtype())));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, const CrossEntropyOptions& o) {
  return tg::cross_entropy(logits, targets, o.ignore_index, o.label_smoothing, o.reduction);
}

// -log_probs[n, t_n] weighted by -1 (0 where t_n == ignore_index): one gather
// and one multiply on the tape; the mean divides by the non-ignored count as torch.
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, int64_t ignore_index, Reduction reduction) {
  check_defined("nll_loss", log_probs, targets);
  if (targets.dtype() != DType::i64)
    throw DTypeError(fmt::format("nll_loss: targets must be int64, got {}", dtype_name(targets.dtype())));
  if (!is_floating(log_probs.dtype()))
    throw DTypeError(fmt::format("nll_loss: log_probs must be floating, got {}", dtype_name(log_probs.dtype())));
  Shape want;
  if (log_probs.dim() >= 2) {
    want.push_back(log_probs.size(0));
    for (int d = 2; d < log_probs.dim(); ++d) want.push_back(log_probs.size(d));
  }
  if (log_probs.dim() < 2 || !(targets.shape() == want))
    throw ShapeError(
        fmt::format("nll_loss: log_probs {} must be (N,C) or (N,C,d...) with targets (N) / (N,d...), got targets {}",
                    log_probs.shape(), targets.shape()));
  const int64_t C = log_probs.size(1);
  std::vector<int64_t> ids = targets.to_vector<int64_t>();
  std::vector<double> weight(ids.size());
  int64_t count = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    if (ids[k] == ignore_index) {
      ids[k] = 0;
      continue;
    }
    if (ids[k] < 0 || ids[k] >= C)
      throw IndexError(fmt::format("nll_loss: target {} at position {} is out of range for {} classes", ids[k], k, C));
    weight[k] = -1.0;
    ++count;
  }
  Tensor picked = gather(log_probs, 1, from_vector(ids, targets.shape()).unsqueeze(1)).squeeze(1);
  Tensor loss = mul(picked, from_vector(weight, targets.shape()).to(log_probs.dtype()));
  if (reduction != Reduction::mean) return reduce(loss, reduction);
  // Every target ignored: the mean is 0/0 = NaN and its gradient zero, both as
  // torch (whose backward writes nothing for an ignored target). NaN is added,
  // not reached by multiplying by 1/0, which would send inf * 0 = NaN back.
  if (count == 0) return add(mul(sum(loss), 0.0), std::numeric_limits<double>::quiet_NaN());
  return mul(sum(loss), 1.0 / static_cast<double>(count));
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_same("mse_loss", input, target);
  return reduce(pow(sub(input, target), 2.0), reduction);
}

// (1 - y) x + w softplus(-x) with w = 1 + (pos_weight - 1) y (w = 1 without
// pos_weight): equal to max(x, 0) - x y + log(1 + e^-|x|), and softplus is
// evaluated stably, so logits of +-1e4 give finite losses and gradients.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets, Reduction reduction,
                                        const Tensor& pos_weight) {
  check_same("binary_cross_entropy_with_logits", logits, targets);
  Tensor softplus_neg = neg(log_sigmoid(logits));
  Tensor loss = mul(rsub(1.0, targets), logits);
  if (pos_weight.defined()) {
    if (pos_weight.dtype() != logits.dtype())
      throw DTypeError(fmt::format("binary_cross_entropy_with_logits: pos_weight is {}, logits are {}",
                                   dtype_name(pos_weight.dtype()), dtype_name(logits.dtype())));
    if (!broadcasts_to(pos_weight.shape(), logits.shape()))
      throw ShapeError(fmt::format("binary_cross_entropy_with_logits: pos_weight {} does not broadcast to logits {}",
                                   pos_weight.shape(), logits.shape()));
    Tensor w = add(mul(add(pos_weight, -1.0), targets), 1.0);
    loss = add(loss, mul(w, softplus_neg));
  } else {
    loss = add(loss, softplus_neg);
  }
  return reduce(loss, reduction);
}

}  // namespace tg::nn
