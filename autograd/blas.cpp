#include "autograd/blas.h"

#include <cblas.h>

#include <algorithm>
#include <climits>

#include <fmt/format.h>

#include "autograd/error.h"
#include "autograd/parallel.h"
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

thread_local bool serial = false;  // a SerialGemm lives on this thread

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blasint(M, "M"),
              to_blasint(N, "N"), to_blasint(K, "K"), alpha, A, to_blasint(lda, "lda"), B, to_blasint(ldb, "ldb"),
              beta, C, to_blasint(ldc, "ldc"));
}
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
               const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blasint(M, "M"),
              to_blasint(N, "N"), to_blasint(K, "K"), alpha, A, to_blasint(lda, "lda"), B, to_blasint(ldb, "ldb"),
              beta, C, to_blasint(ldc, "ldc"));
}

// C (M,N) split into parts of rows (A's rows: op(A) is (M,K), so a row offset
// of A is m*lda, or m when A is stored transposed) or of columns (B's columns:
// n, or n*ldb when B is stored transposed); each part is one OpenBLAS call.
template <class S>
void split_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const S* A, int64_t lda, const S* B,
                int64_t ldb, S beta, S* C, int64_t ldc) {
  constexpr int64_t kMinWork = int64_t{1} << 18, kMinSide = 16;
  const bool by_rows = M >= N;
  const int64_t side = by_rows ? M : N;
  const int threads = num_threads();  // first: its first call also sets OpenBLAS to one thread
  const int64_t parts = serial || M * N * K < kMinWork ? 1 : std::min<int64_t>(threads, side / kMinSide);
  if (parts <= 1) return blas_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  auto part = [&](int64_t p) {
    const int64_t i0 = side * p / parts, i1 = side * (p + 1) / parts;
    if (by_rows)
      blas_gemm(ta, tb, i1 - i0, N, K, alpha, A + (ta ? i0 : i0 * lda), lda, B, ldb, beta, C + i0 * ldc, ldc);
    else
      blas_gemm(ta, tb, M, i1 - i0, K, alpha, A, lda, B + (tb ? i0 * ldb : i0), ldb, beta, C + i0, ldc);
  };
  auto run = [](void* ctx, int64_t p) { (*static_cast<decltype(part)*>(ctx))(p); };
  if (!detail::run_chunks(parts, run, &part))
    for (int64_t p = 0; p < parts; ++p) part(p);
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  count_flops(M, N, K);
  split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc) {
  count_flops(M, N, K);
  split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

SerialGemm::SerialGemm() : saved_(serial) { serial = true; }
SerialGemm::~SerialGemm() { serial = saved_; }

void blas_set_num_threads(int n) { openblas_set_num_threads(n); }
int blas_num_threads() { return openblas_get_num_threads(); }

}  // namespace tg
