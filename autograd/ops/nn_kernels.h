#pragma once
// Row kernels shared by the fused ops (softmax.cpp, norm.cpp, attention.cpp,
// the recurrences in rnn/) and the exp, erf, sigmoid and tanh of the
// elementwise ops. Sums use
// `omp simd` reductions, so float rows vectorise without -ffast-math; exp in
// float is a polynomial that vectorises.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common.h"

namespace tg::detail {

// exp that the compiler can vectorise: 2^k * p(r) with |r| <= ln2/2 and the
// Cephes minimax polynomial (about 1 ulp). Valid for x <= 88 (callers pass
// x - max <= 0); inputs below -87, where float exp underflows, give exactly
// 0. float64 keeps std::exp for gradcheck accuracy.
inline float vexp(float x) {
  const bool under = x < -87.0f;
  x = under ? -87.0f : x;
  const float t = x * 1.44269504088896341f + 12582912.0f;  // round(x / ln2) via the 1.5*2^23 trick
  const uint32_t k = std::bit_cast<uint32_t>(t) - 0x4B400000u;  // unsigned: garbage lanes never overflow
  const float kf = t - 12582912.0f;
  const float r = x - kf * 0.693359375f + kf * 2.12194440e-4f;
  const float p = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r + 4.1665795894e-2f) * r +
                   1.6666665459e-1f) * r + 5.0000001201e-1f;
  const float e = p * (r * r) + r + 1.0f;
  return under ? 0.0f : e * std::bit_cast<float>((k + 127u) << 23);
}
inline double vexp(double x) { return std::exp(x); }

// erf that vectorises (Abramowitz & Stegun 7.1.26: |error| < 1.5e-7, below
// float32's resolution near 1); float64 keeps std::erf for gradcheck accuracy.
// verf_given takes exp(-x^2) from a caller that has it (gelu's slope, whose
// density is the same exponential).
inline float verf_given(float x, float exp_minus_x2) {
  const float t = 1.0f / (1.0f + 0.3275911f * std::abs(x));
  const float p = ((((1.061405429f * t - 1.453152027f) * t + 1.421413741f) * t - 0.284496736f) * t + 0.254829592f) * t;
  return std::copysign(1.0f - p * exp_minus_x2, x);
}
inline float verf(float x) { return verf_given(x, vexp(-x * x)); }
inline double verf(double x) { return std::erf(x); }

// exp over the whole float range: vexp; above 88 (where vexp's 2^k would
// need exponent bits 255) the square of exp(x/2), within 3 ulp; +inf where
// float exp overflows. Results below float's smallest normal are 0, as vexp's.
inline float vexp_full(float x) {
  const float h = vexp(x > 88.0f ? 0.5f * x : x);
  return x > 88.72283f ? std::numeric_limits<float>::infinity() : x > 88.0f ? h * h : h;
}
inline double vexp_full(double x) { return std::exp(x); }

// sigmoid and tanh on vexp, so loops over them vectorise (within 3 ulp of
// libm: sigmoid 2.5, tanh 2.7); float64 keeps libm. sigmoid never
// exponentiates a large positive number.
inline float vsigmoid(float x) { return 1.0f / (1.0f + vexp(std::min(-x, 88.0f))); }
inline double vsigmoid(double x) {
  if (x >= 0) return 1.0 / (1.0 + std::exp(-x));
  const double e = std::exp(x);
  return e / (1.0 + e);
}
inline float vtanh(float x) {
  // (1 - e^-2|x|) / (1 + e^-2|x|) cancels for small |x|: there, the Taylor series to x^11.
  const float a = std::abs(x), e = vexp(-2.0f * a), x2 = x * x;
  const float series =
      x * (1.0f +
           x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835 + x2 * (-1382.0f / 155925))))));
  return a < 0.3f ? series : std::copysign((1.0f - e) / (1.0f + e), x);
}
inline double vtanh(double x) { return std::tanh(x); }

// Max of a row, in 2 x 512 bits of independent lanes: the `a > b ? a : b`
// pattern maps to vmaxps (GCC does not vectorise a floating-point max
// reduction itself, because of NaN and signed-zero rules). The tail is one
// more full vector ending at the last element (max does not mind seeing an
// element twice), and the lanes combine as a tree, so no long serial chain.
template <class T> inline T row_max(const T* x, int64_t n) {
  constexpr int L = 2 * 64 / sizeof(T);
  T acc[L];
  std::fill(acc, acc + L, -std::numeric_limits<T>::infinity());
  int64_t i = 0;
  for (; i + L <= n; i += L)
    for (int k = 0; k < L; ++k) acc[k] = acc[k] > x[i + k] ? acc[k] : x[i + k];
  if (i < n && n >= L) {
    for (int k = 0; k < L; ++k) acc[k] = acc[k] > x[n - L + k] ? acc[k] : x[n - L + k];
  } else {
    for (int k = 0; i < n; ++i, ++k) acc[k] = acc[k] > x[i] ? acc[k] : x[i];
  }
  for (int w = L / 2; w > 0; w /= 2)
    for (int k = 0; k < w; ++k) acc[k] = acc[k] > acc[k + w] ? acc[k] : acc[k + w];
  return acc[0];
}
template <class T> inline T row_sum(const T* x, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i];
  return s;
}
template <class T> inline T row_dot(const T* x, const T* y, int64_t n) {
  T s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}
// The softmax's Jacobian at probabilities p applied to a row x of n:
// out = p (x - <x, p>), out may alias x. J = diag(p) - p p^T is symmetric, so
// this one product is softmax's backward (x a gradient) and its tangent (x a
// tangent) alike; softmax_jvp is the op.
template <class T> inline void softmax_jacobian_row(const T* p, const T* x, T* out, int64_t n) {
  const T d = row_dot(x, p, n);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = p[i] * (x[i] - d);
}
// e[i] = exp(x[i] - m); returns the sum. e may alias x. Short rows (a V = 85
// vocabulary) are mostly tail, so the tail is one more full vector ending at
// the last element: computed first (e may overwrite x), summed only over the
// lanes the main loop does not cover, stored last (the overlap rewrites equal
// values).
template <class T> inline T exp_shifted(const T* x, T m, T* e, int64_t n) {
  constexpr int L = 64 / sizeof(T);
  const int64_t full = n - n % L;
  const bool overlap = full < n && n >= L;
  T tail[L], s = 0;
  if (overlap) {
    const int64_t skip = L - (n - full);
#pragma omp simd reduction(+ : s)
    for (int k = 0; k < L; ++k) {
      tail[k] = vexp(x[n - L + k] - m);
      s += k >= skip ? tail[k] : T(0);
    }
  }
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < full; ++i) {
    const T v = vexp(x[i] - m);
    e[i] = v;
    s += v;
  }
  if (overlap) {
    std::copy(tail, tail + L, e + n - L);
  } else {
    for (int64_t i = full; i < n; ++i) s += e[i] = vexp(x[i] - m);
  }
  return s;
}

}  // namespace tg::detail
