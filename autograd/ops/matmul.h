#pragma once
/// \file
/// Matrix products, always through GEMM (blas.h). Transposed views are passed
/// to GEMM as flags, not copied. Backward is two GEMMs (matmul ops under
/// create_graph, so differentiable twice).
#include "../tensor.h"

namespace tg {

/// torch.matmul semantics: 1-D x 1-D dot, 2-D x 2-D, and batched N-D with
/// broadcast batch dims; a 1-D operand is promoted and the added dim removed.
Tensor matmul(const Tensor& a, const Tensor& b);
/// x (..., in) @ weight(out, in)^T + bias(out): one GEMM with the bias folded in.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

}  // namespace tg
