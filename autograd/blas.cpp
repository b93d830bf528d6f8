#include "autograd/blas.h"

#include <cblas.h>

#include <algorithm>
#include <climits>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "autograd/autocast.h"
#include "autograd/error.h"
#include "autograd/fault.h"
#include "autograd/onednn.h"
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

// OpenBLAS picks its kernels by CPU model, and on a model it does not know
// (a Xeon of a newer generation in a virtual machine) it falls back to
// "Prescott", SSE3: float32 GEMMs 4x slower than the CPU can go. The CPU's
// own flags say what it can run; where it has AVX2 and FMA but OpenBLAS chose
// no core with AVX2 kernels, float32 GEMMs go to oneDNN, which dispatches on
// those flags itself (as fast as OpenBLAS's right kernels: ~100 GFLOP/s a
// core on AVX-512, bench_gemm). float64 GEMMs (gradcheck) stay on OpenBLAS.
bool openblas_core_is_fallback() {
  static const bool fallback = [] {
    const std::string_view core = openblas_get_corename();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    for (std::string_view ok : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
      if (core == ok) return false;
    return avx2;
  }();
  return fallback;
}

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (openblas_core_is_fallback()) return detail::onednn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
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

// A stored (rows, cols) bfloat16 block widened into float32 `out` (leading dimension cols).
const float* widen(const bfloat16* x, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  detail::grow_scratch(out, rows * cols);
  for (int64_t r = 0; r < rows; ++r) bf16_to_float(x + r * ld, out.data() + r * cols, cols);
  return out.data();
}

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
               const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (detail::onednn_has_bf16()) return detail::onednn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // No bfloat16 kernels on this CPU: the same products (exact in float32)
  // and float32 sums, by OpenBLAS on widened copies.
  thread_local std::vector<float> a32, b32;
  const int64_t a_cols = ta ? M : K, b_cols = tb ? K : N;
  const float* a = widen(A, ta ? K : M, a_cols, lda, a32);
  const float* b = widen(B, tb ? N : K, b_cols, ldb, b32);
  blas_gemm(ta, tb, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc);
}

// C (M,N) split into parts of rows (A's rows: op(A) is (M,K), so a row offset
// of A is m*lda, or m when A is stored transposed) or of columns (B's columns:
// n, or n*ldb when B is stored transposed); each part is one OpenBLAS call.
template <class S, class In>
void split_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const In* A, int64_t lda, const In* B,
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

// An operand of an autocast GEMM as bfloat16: a kept parameter's copy (same
// strides), or its stored (rows, cols) block rounded into this thread's
// buffer `scratch` (leading dimension cols).
struct Rounded {
  const bfloat16* p;
  int64_t ld;
};
Rounded round_operand(const float* x, int64_t rows, int64_t cols, int64_t ld, std::vector<bfloat16>& scratch) {
  if (const bfloat16* kept = detail::autocast_cached(x)) return {kept, ld};
  detail::grow_scratch(scratch, rows * cols);
  bfloat16* out = scratch.data();
  parallel_for(rows, std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(cols, 1)), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) float_to_bf16(x + r * ld, out + r * cols, cols);
  });
  return {out, cols};
}

void autocast_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                   const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  thread_local std::vector<bfloat16> a_scratch, b_scratch;
  // Stored as (M,K), or (K,M) when transposed; B likewise.
  const Rounded a = round_operand(A, ta ? K : M, ta ? M : K, lda, a_scratch);
  const Rounded b = round_operand(B, tb ? N : K, tb ? K : N, ldb, b_scratch);
  split_gemm(ta, tb, M, N, K, alpha, a.p, a.ld, b.p, b.ld, beta, C, ldc);
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc) {
  count_flops(M, N, K);
  if (autocast_enabled() && M > 0 && N > 0 && K > 0)
    return autocast_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
          const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
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

std::string gemm_backend_info() {
  std::string bf16 = detail::onednn_has_bf16()
                         ? fmt::format("oneDNN {} {}", detail::onednn_isa(), detail::onednn_kernel(true))
                         : fmt::format("oneDNN {} has no bfloat16 matmul: OpenBLAS on widened operands",
                                       detail::onednn_isa());
  std::string f32 = openblas_core_is_fallback()
                        ? fmt::format("oneDNN {} (OpenBLAS chose {}, a core without the CPU's AVX2)",
                                      detail::onednn_isa(), openblas_get_corename())
                        : fmt::format("OpenBLAS {}", openblas_get_corename());
  return fmt::format("float32: {}; bfloat16: {}", f32, bf16);
}

}  // namespace tg
