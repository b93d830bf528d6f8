#pragma once
// The library's only door to oneDNN (onednn.cpp is the only file that
// includes <dnnl.hpp>): its matmul primitive as a row-major GEMM with the
// same flags as blas.h's, C(M,N) float32 = alpha * op(A) op(B) + beta * C
// (+ bias (N) on every row, given alpha = 1), on the calling thread. bfloat16 operands accumulate in float32; oneDNN
// picks the kernel for the CPU it finds (AVX512_BF16, AMX, or a conversion
// where the CPU has no bfloat16 instructions: see onednn_has_bf16).
#include <cstdint>
#include <string>

#include "autograd/bfloat16.h"

namespace tg::detail {

// Products of at most this many rows read B packed where it can be kept
// (onednn_gemm's b_generation): a recurrence's per-step h W_hh^T (32 rows)
// otherwise spends much of its time packing W_hh at every step. Larger
// products amortise oneDNN's own packing.
inline constexpr int64_t kPackedRows = 64;

// b_generation nonzero: B's values are named by it (see autocast_cached)
// and stay as they are until it changes; for a product with few rows, B is
// kept packed in oneDNN's layout, a copy a thread, and packed again only when
// B or its generation moves on.
// bias: null, or N floats added to every row of C in the kernel's epilogue
// (alpha must then be 1), which writes C once instead of reading it back.
void onednn_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A,
                 int64_t lda, const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc,
                 const float* bias = nullptr, uint64_t b_generation = 0);
void onednn_gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                 const float* bias = nullptr);
// Whether oneDNN has a bfloat16 matmul on this CPU (it needs AVX-512; with
// ONEDNN_MAX_CPU_ISA=AVX2, or on an AVX2 CPU, it has none).
bool onednn_has_bf16();
// Bytes of the packed copies of B kept for products with few rows: one per
// primitive and thread.
size_t onednn_packed_bytes();
// How many times a B has been packed for products with few rows, in this
// process: once a generation for each B a thread multiplies by in a row.
uint64_t onednn_packs();
// The instruction set oneDNN dispatches to on this CPU ("avx512_core_bf16", ...)
// and the kernel of the last bfloat16 / float32 primitive it made ("" before any).
std::string onednn_isa();
std::string onednn_kernel(bool bf16);

}  // namespace tg::detail
