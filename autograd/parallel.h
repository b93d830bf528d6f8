#pragma once
/// \file
/// Threads for the library's kernels, GEMMs included, set in one place:
/// set_num_threads(n); TAPEGRAD_NUM_THREADS sets the start value (default:
/// the number of cores). Kernels split work only above a grain size, so small
/// ops never pay for waking threads. OpenBLAS itself stays at one thread: the
/// library splits large GEMMs over this pool (autograd/blas.h).
//
// The kernels run on a small pool of our own rather than OpenMP's: libgomp's
// idle threads spin for a long time after each parallel region, and on a
// machine with as many threads as cores that spinning takes the cores from
// the OpenBLAS threads of the next GEMM. An RNN step alternates a GEMM and a
// pointwise kernel 64 times per sequence, and ran 6x slower at 2 threads that
// way. Our workers spin only for a few microseconds, then sleep on a futex.
#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tg {

/// Sets the threads of the library's kernels and GEMMs (n >= 1).
void set_num_threads(int n);
/// The threads the kernels use now.
int num_threads();

/// Calls f(begin, end) on disjoint chunks covering [0, n), in parallel. Runs
/// inline when n is below 2 * `grain` (items worth less than ~a few
/// microseconds each), with 1 thread, inside another parallel_for, or while
/// another thread of the program is using the pool.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f);

/// Calls f(part, step) for every step in [0, steps) and part in [0, parts),
/// every part of a step before any part of the next: on `parts` threads at
/// once with a barrier after each step, or, while the pool is busy (or from
/// inside it), part after part here. Each part sees the same calls in the same
/// order either way. For sequential work too fine-grained to wake the pool at
/// every step (a recurrence's steps, tens of microseconds each). When a call
/// throws, no part starts another step, and the first exception reaches the
/// caller once every part has stopped.
template <class F>
void parallel_steps(int64_t parts, int64_t steps, F&& f);

namespace detail {
// Runs body(ctx, c) for every c in [0, chunks) on the pool and the calling
// thread; returns when all are done, rethrowing the first exception. Returns
// false (running nothing) when the pool is busy or this is a pool thread.
bool run_chunks(int64_t chunks, void (*body)(void*, int64_t), void* ctx);
// run_chunks for parallel_steps: every chunk runs body(ctx, part, step) for each
// step, waiting at a barrier after each. Same return value; a throw stops every
// part at the next barrier and is rethrown.
bool run_steps(int64_t parts, int64_t steps, void (*body)(void*, int64_t, int64_t), void* ctx);
// Jobs the pool has run on more than one thread since the process started
// (tests check that a workload they run at 2 threads is split at all).
int64_t pool_jobs();
}  // namespace detail

template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  const int threads = num_threads();
  if (threads <= 1 || n < 2 * grain) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
  const int64_t chunks = std::min<int64_t>(threads, n / grain);
  auto chunk = [&](int64_t c) { f(n * c / chunks, n * (c + 1) / chunks); };
  auto body = [](void* ctx, int64_t c) { (*static_cast<decltype(chunk)*>(ctx))(c); };
  if (!detail::run_chunks(chunks, body, &chunk)) f(int64_t{0}, n);
}

template <class F>
void parallel_steps(int64_t parts, int64_t steps, F&& f) {
  using Fn = std::remove_cvref_t<F>;
  auto body = [](void* ctx, int64_t part, int64_t step) { (*static_cast<Fn*>(ctx))(part, step); };
  if (parts > 1 && detail::run_steps(parts, steps, body, const_cast<Fn*>(&f))) return;
  for (int64_t s = 0; s < steps; ++s)
    for (int64_t p = 0; p < parts; ++p) f(p, s);
}

}  // namespace tg
