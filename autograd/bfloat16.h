#pragma once
/// \file
/// bfloat16 and float16: the 16-bit floating formats. bfloat16 is float32's
/// upper half (8 exponent bits, 7 mantissa bits): DType::bf16 tensors hold
/// it, and autocast (autocast.h) runs GEMMs on it. float16 (IEEE binary16)
/// is a storage format only: checkpoints read and write it as F16.
/// Conversions from float round to nearest even and keep NaN a (quiet) NaN,
/// as PyTorch's do.
#include <cstdint>
#include <cstring>

namespace tg {

/// One bfloat16 value. Converts implicitly to float (exactly) and from float
/// (rounded to nearest even), so generic element loops (copies, fills,
/// printing) work on it; arithmetic happens in float.
struct bfloat16 {
  uint16_t bits;  ///< the raw 16 bits (trivial type: a vector of them is plain memory)

  bfloat16() = default;
  /// f rounded to nearest even (NaN stays a quiet NaN).
  bfloat16(float f) : bits(round(f)) {}  // NOLINT: implicit like float's own conversions
  /// The value as float (exact).
  operator float() const {
    const uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  /// From raw bits (no rounding).
  static bfloat16 from_bits(uint16_t b) {
    bfloat16 v;
    v.bits = b;
    return v;
  }
  /// The bits of f rounded to nearest even; a NaN becomes a quiet NaN of its sign.
  static uint16_t round(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
};

/// dst[i] = src[i] rounded to bfloat16, n values (AVX512_BF16 where the CPU has it).
void float_to_bf16(const float* src, bfloat16* dst, int64_t n);
/// dst[i] = src[i] widened to float (exact), n values.
void bf16_to_float(const bfloat16* src, float* dst, int64_t n);
/// dst[i] = src[i] rounded to IEEE float16 bits (nearest even; overflow to
/// infinity, subnormals kept), n values.
void float_to_f16(const float* src, uint16_t* dst, int64_t n);
/// dst[i] = the IEEE float16 bits src[i] as float (exact), n values.
void f16_to_float(const uint16_t* src, float* dst, int64_t n);

}  // namespace tg
