#pragma once
// Shape ops. reshape/view/transpose/permute/slice/narrow/select/expand/
// squeeze/unsqueeze return views (no copy) where strides allow.
#include <vector>

#include "autograd/tensor.h"

namespace tg {

Tensor reshape(const Tensor& x, const Shape& shape);  // one dim may be -1
Tensor view(const Tensor& x, const Shape& shape);     // ShapeError if not expressible as a view
Tensor flatten(const Tensor& x, int64_t start = 0, int64_t end = -1);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
Tensor permute(const Tensor& x, const Shape& order);
// Python slicing x[start:stop:step] along axis (negative/out-of-range bounds clamp); step > 0.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step = 1);
Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length);
Tensor select(const Tensor& x, int64_t axis, int64_t index);
Tensor expand(const Tensor& x, const Shape& shape);   // -1 keeps a dim; new dims on the left
Tensor squeeze(const Tensor& x, int64_t axis);        // axis must have size 1
Tensor unsqueeze(const Tensor& x, int64_t axis);
Tensor clone(const Tensor& x);                         // contiguous copy
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
Tensor stack(const std::vector<Tensor>& xs, int64_t axis);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis);  // as torch.chunk
// Constant padding: pads = {before, after} pairs for the last axes, innermost
// first (torch.nn.functional.pad's order).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes);
// Upper/lower triangle of the last two axes; diagonal as in torch.triu/tril.
Tensor triu(const Tensor& x, int64_t diagonal = 0);
Tensor tril(const Tensor& x, int64_t diagonal = 0);

}  // namespace tg
