// tapegrad's own bfloat16 GEMM kernel for small products (bf16_kernel.cpp),
// beside oneDNN's. blas.cpp decides which of the two runs a product.
#pragma once

#include <cstdint>

#include "autograd/bfloat16.h"

namespace tg::detail {

// The largest M, N and K the kernel takes (its packed operands live on the stack).
inline constexpr int64_t kSmallBf16Max = 128;

// Whether small_bf16_gemm runs this product: built for AVX512_BF16, every
// side at most kSmallBf16Max, and the multiples its packing works in.
bool small_bf16_gemm_fits(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb);

// C (M,N) = alpha op(A) op(B) + beta C, row-major, on the calling thread;
// only where small_bf16_gemm_fits.
void small_bf16_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A,
                     int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc);

}  // namespace tg::detail
