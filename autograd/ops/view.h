#pragma once
/// \file
/// View ops: the output shares the input's storage (no copy) where strides
/// allow; only shape, strides and offset change. clone makes the copy.
#include "../tensor.h"

namespace tg {

Tensor reshape(const Tensor& x, const Shape& shape);  ///< one dim may be -1
Tensor view(const Tensor& x, const Shape& shape);     ///< ShapeError if not expressible as a view
Tensor flatten(const Tensor& x, int64_t start = 0, int64_t end = -1);  ///< axes start..end (inclusive) merged into one
Tensor transpose(const Tensor& x, int64_t a, int64_t b);  ///< axes a and b swapped
Tensor permute(const Tensor& x, const Shape& order);  ///< axis i of the result is axis order[i] of x
/// Python slicing x[start:stop:step] along axis (negative/out-of-range bounds clamp); step > 0.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length);  ///< slice(x, axis, start, start + length)
Tensor select(const Tensor& x, int64_t axis, int64_t index);  ///< the index-th entry along axis; removes the axis
Tensor expand(const Tensor& x, const Shape& shape);   ///< -1 keeps a dim; new dims on the left
Tensor squeeze(const Tensor& x, int64_t axis);        ///< axis must have size 1
Tensor unsqueeze(const Tensor& x, int64_t axis);      ///< inserts an axis of size 1 before axis
Tensor clone(const Tensor& x);                         ///< contiguous copy

namespace detail {
/// Undoes permute(x, order): y permuted by the inverse of order.
Tensor unpermute(const Tensor& y, const Shape& order);
}  // namespace detail

}  // namespace tg
