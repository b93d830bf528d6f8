#pragma once
/// \file
/// Reductions over one or several axes (negative axes count from the end; an
/// empty axis list means all axes), with keepdim as in PyTorch.
#include <vector>

#include "../tensor.h"

namespace tg {

/// Axes to reduce over; {} means all.
using Axes = std::vector<int64_t>;

Tensor sum(const Tensor& x, const Axes& axes = {}, bool keepdim = false);   ///< sum over axes
Tensor mean(const Tensor& x, const Axes& axes = {}, bool keepdim = false);  ///< mean over axes
/// Variance over axes: the sum of squared deviations over (n - correction).
/// correction = 1: unbiased (PyTorch's default); 0: population variance.
Tensor var(const Tensor& x, const Axes& axes = {}, int64_t correction = 1, bool keepdim = false);
/// sqrt(var(x, axes, correction, keepdim)).
Tensor std(const Tensor& x, const Axes& axes = {}, int64_t correction = 1, bool keepdim = false);
Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdim = false);  ///< stable
/// Max along one axis; the gradient goes to the first maximal element.
Tensor max(const Tensor& x, int64_t axis, bool keepdim = false);
/// Min along one axis; the gradient goes to the first minimal element.
Tensor min(const Tensor& x, int64_t axis, bool keepdim = false);
Tensor max(const Tensor& x);  ///< over all elements (0-d)
Tensor min(const Tensor& x);  ///< over all elements (0-d)
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim = false);  ///< int64, first maximal index
Tensor argmin(const Tensor& x, int64_t axis, bool keepdim = false);  ///< int64, first minimal index

/// Sums a broadcast gradient back to `shape` (the backward of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

}  // namespace tg
