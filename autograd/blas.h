#pragma once
// The library's GEMMs (blas.cpp is the only file that includes <cblas.h>).
// Row-major GEMM: C(M,N) = alpha * op(A) op(B) + beta * C (+ bias), op(A)
// (M,K), op(B) (K,N); transposes are flags, never copies. A bias (N, or
// null) is added to every row of C: where oneDNN runs the GEMM and alpha is
// 1, in its kernel as it writes C (a linear layer's output is then written
// once, not filled with the bias first and read back: 12-21% faster on
// 2048-row products with K <= 256, bfloat16); elsewhere C's rows start as
// the bias. float64 goes to OpenBLAS
// (gradcheck stays exact); float32 goes to OpenBLAS or oneDNN, whichever
// this CPU runs faster for the GEMM's shape class (measured once per
// process, or set by TAPEGRAD_GEMM_F32: see detail::GemmF32Policy below);
// bfloat16 operands (float32 accumulation and result) go to oneDNN
// (onednn.h), small products to tapegrad's own kernel (bf16_kernel.h) where
// it measures faster (detail::GemmBf16Policy). Under autocast (autocast.h) the float32 GEMM rounds its
// operands to bfloat16 (a parameter's copy is kept until it changes) and
// runs the bfloat16 one.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "autograd/bfloat16.h"

namespace tg {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc, const double* bias = nullptr);
void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
          const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias = nullptr);

// Threading: OpenBLAS runs every GEMM on the calling thread (it is set to one
// thread once and for all), and gemm() splits a GEMM worth it (from 2^18
// multiply-adds, 16 rows or columns a part) over the kernels' pool, by rows of
// C, or by columns when C has fewer rows than columns. One pool for all the
// library's work: OpenBLAS's own idle workers would spin for ~2^28 cycles
// after each threaded GEMM and take the cores from the pool's next kernel.
// The parts depend only on the shape and num_threads(); when the pool is busy
// (another thread of the program is using it) they run one after another on
// the calling thread, with the same results.

// While one lives on this thread, gemm() runs each GEMM whole on this thread:
// for GEMMs that already run on the pool's parts (attention's heads, the
// recurrences' batch parts).
class SerialGemm {
 public:
  SerialGemm();
  ~SerialGemm();
  SerialGemm(const SerialGemm&) = delete;
  SerialGemm& operator=(const SerialGemm&) = delete;

 private:
  bool saved_;
};

// OpenBLAS's own threads: 1, but for a measurement of its peak at n threads
// (measure_sgemm_peak_gflops, bench_gemm's raw cblas rows).
void blas_set_num_threads(int n);
int blas_num_threads();

namespace detail {

// Where float32 GEMMs go: TAPEGRAD_GEMM_F32=openblas or onednn sends them all
// to one backend; measure (the default, and what an unset or empty variable
// means) times both on each shape class's first GEMM and keeps the faster.
enum class GemmF32Policy { openblas, onednn, measure };
// tapegrad: the library's own bfloat16 kernel for small products (bf16_kernel.h).
enum class GemmBackend { openblas, onednn, tapegrad };
// value is TAPEGRAD_GEMM_F32's (null when unset); any other value is a ValueError naming both.
GemmF32Policy parse_gemm_f32_policy(const char* value);
// The policy of this process (read from the environment once).
GemmF32Policy gemm_f32_policy();

// One float32 shape class and the backend its GEMMs run on.
struct GemmF32Choice {
  std::string name;      // "tiny", "narrow", "short_k", "large"
  std::string shape;     // the representative M x N x K it was timed at
  GemmBackend backend;
  double openblas_gflops = 0, onednn_gflops = 0;  // 0 where not measured (a forced policy)
  bool cached = false;  // read from the machine's cache (gemm_cache_path), timed by an earlier process
};
// The file where the measured choices are kept for this machine:
// $TAPEGRAD_CACHE_DIR/gemm.tsv, else $XDG_CACHE_HOME/tapegrad/, else
// ~/.cache/tapegrad/; empty (no cache: every process times) when
// TAPEGRAD_CACHE_DIR is set empty or no home is known.
std::string gemm_cache_path();
// Every class's choice, measuring those not measured yet.
std::vector<GemmF32Choice> gemm_f32_choices();
// Where small bfloat16 GEMMs go (at most detail::kSmallBf16Max a side, in
// the multiples bf16_kernel.h takes): TAPEGRAD_GEMM_BF16=onednn or tapegrad
// (its own kernel) sends them all to one; measure (the default) times both
// once per machine, like a float32 class. Larger ones run on oneDNN.
enum class GemmBf16Policy { onednn, tapegrad, measure };
// value is TAPEGRAD_GEMM_BF16's; any other value is a ValueError naming the three.
GemmBf16Policy parse_gemm_bf16_policy(const char* value);
GemmBf16Policy gemm_bf16_policy();
struct GemmBf16Choice {
  std::string shape;  // the representative M x N x K it was timed at
  GemmBackend backend;
  double tapegrad_gflops = 0, onednn_gflops = 0;  // 0 where not measured or not runnable
  bool cached = false;
};
// The small bfloat16 class's choice, measuring it if not measured yet.
GemmBf16Choice gemm_bf16_choice();
// How much faster oneDNN must measure for a class to run on it: within 5%
// the two count as even and OpenBLAS keeps the class, so that on a CPU where
// they are (an Intel core OpenBLAS knows) timing noise does not pick one or
// the other from one machine's first process to the next (float32 results
// differ in their last bits with the backend; the cache then holds the choice).
// Where oneDNN wins it wins by 1.1-1.5x (Zen 4's large and narrow classes),
// 1.6-2x (Zen 5) or 4x (OpenBLAS's SSE3 fallback).
inline constexpr double kOnednnClearWin = 1.05;
// Rows of `cols` floats rounded to bfloat16 into out (dense rows), on the
// pool: row r's index over the leading dims `shape` (row-major) times their
// `strides` is its offset from x. The autocast GEMM's operand rounding
// (shape {rows}, strides {ld}) and a strided view's (bf16_operand).
void round_rows(const float* x, std::span<const int64_t> shape, std::span<const int64_t> strides, int64_t cols,
                bfloat16* out);
// One float32 GEMM, whole, on the calling thread, on the backend named
// (tests compare the two; gemm() picks one by the policy).
void gemm_f32_on(GemmBackend backend, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                 const float* bias = nullptr);

}  // namespace detail

}  // namespace tg
