#pragma once
/// \file
/// Copying shape ops: join, split, pad, flip and mask tensors (the view ops
/// are in view.h).
#include <vector>

#include "../tensor.h"

namespace tg {

/// The tensors joined along an existing axis (equal sizes elsewhere).
Tensor concat(const std::vector<Tensor>& xs, int64_t axis);
/// The tensors (all of one shape) joined along a new axis.
Tensor stack(const std::vector<Tensor>& xs, int64_t axis);
/// Views of x along axis (slices), of the given sizes.
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis);
/// Views of x along axis (slices), `chunks` of them as torch.chunk.
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis);
/// Constant padding: pads = {before, after} pairs for the last axes, innermost
/// first (torch.nn.functional.pad's order).
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);
Tensor flip(const Tensor& x, const std::vector<int64_t>& axes);  ///< a copy with the order along each axis reversed
/// Upper triangle of the last two axes (zeros below); diagonal as in torch.triu.
Tensor triu(const Tensor& x, int64_t diagonal = 0);
/// Lower triangle of the last two axes (zeros above); diagonal as in torch.tril.
Tensor tril(const Tensor& x, int64_t diagonal = 0);

}  // namespace tg
