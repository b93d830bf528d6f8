#include "autograd/bfloat16.h"

#include <cmath>

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#endif

namespace tg {

namespace {

// Round to nearest even, NaN made quiet: a plain loop that the compiler
// vectorises (AVX-512: 16 values an instruction).
void float_to_bf16_exact(const uint32_t* in, uint16_t* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t u = in[i];
    const uint16_t rounded = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    const uint16_t quiet_nan = static_cast<uint16_t>((u >> 16) | 0x0040u);
    out[i] = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
  }
}

}  // namespace

// Where the CPU has VCVTNE2PS2BF16, 32 values an instruction (about twice
// the loop's rate on data in cache: autocast rounds every activation a GEMM
// reads). It flushes subnormal inputs to zero, and a checkpoint must
// round-trip with PyTorch's conversion bit for bit, so a block of 32 with a
// subnormal in it takes the loop instead: the same bits either way.
void float_to_bf16(const float* src, bfloat16* dst, int64_t n) {
  const auto* in = reinterpret_cast<const uint32_t*>(src);
  auto* out = reinterpret_cast<uint16_t*>(dst);
  int64_t i = 0;
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
  const __m512i exponent = _mm512_set1_epi32(0x7f800000), magnitude = _mm512_set1_epi32(0x7fffffff);
  // A lane is subnormal where its exponent bits are 0 and its magnitude is not.
  auto subnormal = [&](__m512i v) {
    return _mm512_testn_epi32_mask(v, exponent) & _mm512_test_epi32_mask(v, magnitude);
  };
  for (; i + 32 <= n; i += 32) {
    const __m512i lo = _mm512_loadu_si512(in + i), hi = _mm512_loadu_si512(in + i + 16);
    if (subnormal(lo) | subnormal(hi)) {
      float_to_bf16_exact(in + i, out + i, 32);
      continue;
    }
    const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_castsi512_ps(hi), _mm512_castsi512_ps(lo));
    _mm512_storeu_si512(out + i, reinterpret_cast<const __m512i&>(r));
  }
#endif
  float_to_bf16_exact(in + i, out + i, n - i);
}

void bf16_to_float(const bfloat16* src, float* dst, int64_t n) {
  const auto* in = reinterpret_cast<const uint16_t*>(src);
  auto* out = reinterpret_cast<uint32_t*>(dst);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint32_t>(in[i]) << 16;
}

namespace {

uint16_t f16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<uint16_t>((a >> 13) & 0x3ffu);  // NaN, quiet
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (a < 0x38800000u) {
    // Subnormal float16 (or zero): the value in units of 2^-24, rounded to nearest even.
    float mag;
    std::memcpy(&mag, &a, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(mag * 16777216.0f));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 23-bit mantissa to 10.
  const uint32_t r = a + 0xfffu + ((a >> 13) & 1u) - (112u << 23);
  return sign | static_cast<uint16_t>(r >> 13);
}

float f16_value(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0x1f) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(man), -24);  // subnormal or zero: exact in float
    std::memcpy(&u, &mag, 4);
    u |= sign;
  } else {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

void float_to_f16(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_bits(src[i]);
}

void f16_to_float(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_value(src[i]);
}

}  // namespace tg
