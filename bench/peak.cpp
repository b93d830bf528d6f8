#include "bench/peak.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <chrono>

namespace tg::bench {
namespace {

template <class Vec, class Step>
double loop(Vec init, Step step, int64_t iters, double flops_per_step) {
  std::array<Vec, 16> acc;
  acc.fill(init);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 16
    for (auto& a : acc) a = step(a);
  }
  asm volatile("" : : "m"(acc) : "memory");  // the sums are used: the loop stays
  return flops_per_step * 16 * static_cast<double>(iters);
}

}  // namespace

bool peak_loop_available(PeakLoop kind) {
  switch (kind) {
    case PeakLoop::fma_f32:
#if defined(__AVX512F__) || defined(__FMA__)
      return true;
#else
      return false;
#endif
    case PeakLoop::dpbf16_f32:
#if defined(__AVX512BF16__)
      return true;
#else
      return false;
#endif
  }
  return false;
}

double run_peak_loop(PeakLoop kind, int64_t iters) {
  switch (kind) {
    case PeakLoop::fma_f32: {
#if defined(__AVX512F__)
      const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
      return loop(_mm512_set1_ps(0.f), [&](__m512 a) { return _mm512_fmadd_ps(a, x, y); }, iters, 32);
#elif defined(__FMA__)
      const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
      return loop(_mm256_set1_ps(0.f), [&](__m256 a) { return _mm256_fmadd_ps(a, x, y); }, iters, 16);
#else
      return 0;
#endif
    }
    case PeakLoop::dpbf16_f32: {
#if defined(__AVX512BF16__)
      // Each VDPBF16PS: 16 lanes, each two bf16 products added into float32.
      const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a80);
      return loop(_mm512_set1_ps(0.f), [&](__m512 a) { return _mm512_dpbf16_ps(a, x, y); }, iters, 64);
#else
      return 0;
#endif
    }
  }
  return 0;
}

double measure_core_peak(PeakLoop kind, double seconds) {
  if (!peak_loop_available(kind)) return 0;
  // 2^18 iterations: 134 MFLOP of 512-bit FMAs, 0.6 ms at 210 GFLOP/s.
  constexpr int64_t kIters = int64_t{1} << 18;
  using clock = std::chrono::steady_clock;
  const auto end = clock::now() + std::chrono::duration<double>(seconds);
  double best = 0;
  do {
    const auto t0 = clock::now();
    const double flops = run_peak_loop(kind, kIters);
    best = std::max(best, flops / std::chrono::duration<double>(clock::now() - t0).count());
  } while (clock::now() < end);
  return best;
}

}  // namespace tg::bench
