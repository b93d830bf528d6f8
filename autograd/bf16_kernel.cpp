// tapegrad's own bfloat16 GEMM for small products (attention's per-head
// blocks, 64x64x64 to 128x128x128): C = alpha op(A) op(B) + beta C with
// float32 sums, on AVX512_BF16's pair dot product (vdpbf16ps: 16 lanes, each
// adding a[2i] b[2i] + a[2i+1] b[2i+1]). oneDNN spends about 1 us of fixed
// cost on each such call, a third of a 64x64x64 product; this kernel packs B
// (and a transposed A) on the stack and runs them at 82-92% of the core's
// peak alone (oneDNN: 65-79%), 65-81% inside GPT-M's attention (Zen 4,
// 64x64x64 to 128x64x64, every transpose).
// Large products stay on oneDNN, whose blocking wins.
#include "autograd/bf16_kernel.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
// GCC 12's unpack and shuffle intrinsics start from _mm512_undefined_*(),
// which it then reports as maybe uninitialised where they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define TG_BF16_KERNEL 1
#endif

namespace tg::detail {

#if TG_BF16_KERNEL
namespace {

// Operands are read as 32-bit pairs of bfloat16 along K: pair k of row r
// of a (K x X) operand laid out "pairs by k" is word k * X + r.

// (K,X) rows, ld apart -> K/2 x X pairs: word (k2, x) = (src[2 k2][x], src[2 k2 + 1][x]). X % 32 == 0.
void interleave_rows(const bfloat16* src, int64_t ld, int64_t K, int64_t X, uint32_t* dst) {
  alignas(64) static constexpr uint16_t lo_idx[32] = {0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
                                                      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t k2 = 0; k2 < K / 2; ++k2) {
    const bfloat16* r0 = src + 2 * k2 * ld;
    const bfloat16* r1 = r0 + ld;
    uint32_t* d = dst + k2 * X;
    for (int64_t x = 0; x < X; x += 32) {
      const __m512i a = _mm512_loadu_si512(r0 + x), b = _mm512_loadu_si512(r1 + x);
      _mm512_storeu_si512(d + x, _mm512_permutex2var_epi16(a, lo, b));
      _mm512_storeu_si512(d + x + 16, _mm512_permutex2var_epi16(a, hi, b));
    }
  }
}

// (X, K) rows of K bfloat16, ld apart, whose pairs along K are already
// words -> K/2 x X pairs: a 32-bit transpose in 16x16 tiles. X % 16 == 0, K % 32 == 0.
void transpose_pairs(const bfloat16* src, int64_t ld, int64_t X, int64_t K, uint32_t* dst) {
  for (int64_t x0 = 0; x0 < X; x0 += 16)
    for (int64_t k0 = 0; k0 < K / 2; k0 += 16) {
      __m512i r[16], t[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + (x0 + i) * ld + 2 * k0);
      for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
      }
      for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
      }
      for (int i = 0; i < 16; i += 8)
        for (int j = 0; j < 4; ++j) {
          t[i + j] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0x88);
          t[i + j + 4] = _mm512_shuffle_i32x4(r[i + j], r[i + j + 4], 0xdd);
        }
      for (int j = 0; j < 8; ++j) {
        r[j] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0x88);
        r[j + 8] = _mm512_shuffle_i32x4(t[j], t[j + 8], 0xdd);
      }
      for (int i = 0; i < 16; ++i) _mm512_storeu_si512(dst + (k0 + i) * X + x0, r[i]);
    }
}

uint32_t pair_at(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// C rows [0,MR) x columns [0,16 NV) over K2 pairs: a's pair k of row r at
// byte r * a_row + k * a_k, b's K2 x (16 NV) words ldb apart. 16 NV x MR
// accumulators (up to 16 of the 32 registers) hide vdpbf16ps's latency.
template <int MR, int NV>
void tile(int64_t K2, const char* a, int64_t a_row, int64_t a_k, const uint32_t* b, int64_t ldb, float* c,
          int64_t ldc, float alpha, float beta) {
  __m512 acc[MR][NV];
#pragma GCC unroll 4
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K2; ++k) {
    __m512bh bv[NV];
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(b + k * ldb + 16 * v);
    for (int r = 0; r < MR; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair_at(a + r * a_row + k * a_k)));
      for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], av, bv[v]);
    }
  }
  // Two whole loops, not a test per store: with the branch inside, GCC
  // keeps the accumulators in memory (16 stores before the loop and 16
  // after it, about a tenth of a 64-deep tile).
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  if (beta == 0.f) {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(c + r * ldc + 16 * v, _mm512_mul_ps(acc[r][v], va));
  } else {
#pragma GCC unroll 4
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* p = c + r * ldc + 16 * v;
        _mm512_storeu_ps(p, _mm512_fmadd_ps(_mm512_loadu_ps(p), vb, _mm512_mul_ps(acc[r][v], va)));
      }
  }
}

// All M rows of one column block of 16 NV, four rows at a time. Kept out of
// line: inlined into gemm's dispatch, GCC spills the accumulators.
template <int NV>
[[gnu::noinline]] void column_block(int64_t M, int64_t K2, const char* a, int64_t a_row, int64_t a_k,
                                    const uint32_t* b, int64_t ldb, float* c, int64_t ldc, float alpha, float beta) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<4, NV>(K2, a + m * a_row, a_row, a_k, b, ldb, c + m * ldc, ldc, alpha, beta);
  for (; m < M; ++m) tile<1, NV>(K2, a + m * a_row, a_row, a_k, b, ldb, c + m * ldc, ldc, alpha, beta);
}

}  // namespace

bool small_bf16_gemm_fits(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb) {
  if (M <= 0 || N <= 0 || K <= 0 || M > kSmallBf16Max || N > kSmallBf16Max || K > kSmallBf16Max) return false;
  if (N % (tb ? 16 : 32) != 0 || K % (tb ? 32 : 2) != 0) return false;
  if (ta && M % 32 != 0) return false;
  // Pairs along K are words where K is the contiguous axis.
  if ((!ta && lda % 2 != 0) || (tb && ldb % 2 != 0)) return false;
  return true;
}

void small_bf16_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                     const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  alignas(64) uint32_t b_pairs[kSmallBf16Max / 2 * kSmallBf16Max];
  alignas(64) uint32_t a_pairs[kSmallBf16Max / 2 * kSmallBf16Max];
  const int64_t K2 = K / 2;
  if (tb)
    transpose_pairs(B, ldb, N, K, b_pairs);
  else
    interleave_rows(B, ldb, K, N, b_pairs);
  const char* a = reinterpret_cast<const char*>(A);
  int64_t a_row = static_cast<int64_t>(sizeof(bfloat16)) * lda, a_k = 2 * sizeof(bfloat16);
  if (ta) {
    interleave_rows(A, lda, K, M, a_pairs);
    a = reinterpret_cast<const char*>(a_pairs);
    a_row = sizeof(uint32_t);
    a_k = static_cast<int64_t>(sizeof(uint32_t)) * M;
  }
  for (int64_t n = 0; n < N; n += 64) {
    const uint32_t* b = b_pairs + n;
    float* c = C + n;
    switch (std::min<int64_t>(64, N - n) / 16) {
      case 4: column_block<4>(M, K2, a, a_row, a_k, b, N, c, ldc, alpha, beta); break;
      case 3: column_block<3>(M, K2, a, a_row, a_k, b, N, c, ldc, alpha, beta); break;
      case 2: column_block<2>(M, K2, a, a_row, a_k, b, N, c, ldc, alpha, beta); break;
      default: column_block<1>(M, K2, a, a_row, a_k, b, N, c, ldc, alpha, beta); break;
    }
  }
}

#else  // no AVX512_BF16 in this build: oneDNN (or widened float32) runs every product

bool small_bf16_gemm_fits(bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t) { return false; }
void small_bf16_gemm(bool, bool, int64_t, int64_t, int64_t, float, const bfloat16*, int64_t, const bfloat16*, int64_t,
                     float, float*, int64_t) {
  throw std::logic_error("small_bf16_gemm: this build has no AVX512_BF16 kernel (small_bf16_gemm_fits is false)");
}

#endif

}  // namespace tg::detail
