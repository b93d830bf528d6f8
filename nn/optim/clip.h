#pragma once
/// \file
/// Gradient clipping, as torch.nn.utils (1.13). Parameters without .grad are
/// skipped; gradients are changed in place.
#include <vector>

#include "../../autograd/tensor.h"

namespace tg::nn {

/// Scales every gradient by min(1, max_norm / (total + 1e-6)), total being the
/// L2 norm of all the gradients together (accumulated in double). Returns
/// total, the norm before clipping (inf or nan if a gradient is non-finite).
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm);

/// Clamps every gradient element into [-clip, clip].
void clip_grad_value_(const std::vector<Tensor>& params, double clip);

}  // namespace tg::nn
