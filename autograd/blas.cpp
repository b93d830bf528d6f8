#include "autograd/blas.h"

#include <cblas.h>

#include <climits>

#include <fmt/format.h>

#include "autograd/error.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

blasint to_blasint(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw ShapeError(fmt::format("gemm: {} = {} does not fit OpenBLAS's integer", what, v));
  return static_cast<blasint>(v);
}

// Every GEMM reports its work to the op being profiled (matmul, linear,
// attention, the fused recurrences alike), so GFLOP/s and MFU count them all.
void count_flops(int64_t M, int64_t N, int64_t K) {
  if (profiler_enabled()) profiler_add_flops(2.0 * static_cast<double>(M) * N * K);
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  count_flops(M, N, K);
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blasint(M, "M"),
              to_blasint(N, "N"), to_blasint(K, "K"), alpha, A, to_blasint(lda, "lda"), B, to_blasint(ldb, "ldb"),
              beta, C, to_blasint(ldc, "ldc"));
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  count_flops(M, N, K);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blasint(M, "M"),
              to_blasint(N, "N"), to_blasint(K, "K"), alpha, A, to_blasint(lda, "lda"), B, to_blasint(ldb, "ldb"),
              beta, C, to_blasint(ldc, "ldc"));
}

void blas_set_num_threads(int n) { openblas_set_num_threads(n); }
int blas_num_threads() { return openblas_get_num_threads(); }

}  // namespace tg
