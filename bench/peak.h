#pragma once
// The arithmetic ceiling of one core: 16 independent accumulator registers
// (more than the FMA latency times the issue width), updated in a loop with
// nothing else in it, so no GEMM of that dtype can pass it. bench_gemm's
// BM_core_peak_* rows and lm_train's MFU both run this loop.
#include <cstdint>

namespace tg::bench {

enum class PeakLoop {
  fma_f32,     // float32 FMAs, 512-bit where the build has AVX-512, else 256-bit
  dpbf16_f32,  // VDPBF16PS: bfloat16 pairs multiplied and added into float32
};

// Whether this build (-march=native) has the loop's instructions.
bool peak_loop_available(PeakLoop loop);
// Runs `iters` iterations of the loop (16 instructions each) on the calling
// thread; returns the FLOPs done (0 where the loop is not available).
double run_peak_loop(PeakLoop loop, int64_t iters);
// The loop's rate on the calling thread in FLOP/s: the best of repetitions
// of about 1 ms run for about `seconds` (the first ones also bring the core to
// its vector clock). 0 where the loop is not available.
double measure_core_peak(PeakLoop loop, double seconds = 0.03);

}  // namespace tg::bench
