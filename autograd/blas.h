#pragma once
// The library's only door to OpenBLAS (blas.cpp is the only file that
// includes <cblas.h>). Row-major GEMM: C(M,N) = alpha * op(A) op(B) + beta * C,
// op(A) (M,K), op(B) (K,N); transposes are flags, never copies.
#include <cstdint>

namespace tg {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc);

void blas_set_num_threads(int n);
int blas_num_threads();

}  // namespace tg
