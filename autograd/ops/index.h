#pragma once
/// \file
/// Indexing with int64 index tensors (never differentiable). Out-of-range
/// indices throw IndexError naming the index, its position and the bound.
#include "../tensor.h"

namespace tg {

/// Rows of x along axis at the positions in index (any shape): the result has
/// x's shape with that axis replaced by index's shape. Backward scatter-adds.
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index);
/// A copy of x with src's rows added at the positions in index along axis
/// (torch.index_add, repeats add up); src has x's shape with that axis
/// replaced by index's shape, as index_select's output. Its adjoint.
Tensor index_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
/// weight (V,C), ids (any shape) -> (..., C). With padding_idx >= 0, that row
/// gets no gradient (as torch.nn.functional.embedding).
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx = -1);
/// out[i][j] = x[i][index[i][j]] along axis (torch.gather); index has x's rank.
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index);
/// A copy of x with src scattered along axis (torch.scatter, overwrite);
/// gradient to x is zero where written, to src is gathered.
Tensor scatter(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
/// A copy of x with src added along axis (torch.scatter_add).
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src);
/// ids (any shape, int64) -> (..., num_classes) of dtype.
Tensor one_hot(const Tensor& ids, int64_t num_classes, DType dtype = DType::f32);

}  // namespace tg
