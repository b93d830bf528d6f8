#pragma once
// Threads for the library's own kernels and OpenBLAS, set in one place.
// set_num_threads(n) sets both; TAPEGRAD_NUM_THREADS sets the start value
// (default: the number of cores). Kernels split work only above a grain size,
// so small ops never pay for waking threads.
#include <cstdint>

namespace tg {

void set_num_threads(int n);
int num_threads();

// Calls f(begin, end) on disjoint chunks covering [0, n). Runs inline when n
// is below `grain` (items worth less than ~a few microseconds each) or with 1 thread.
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f);

}  // namespace tg

#include <algorithm>

#include <omp.h>

namespace tg {
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  int threads = num_threads();
  if (threads <= 1 || n < 2 * grain) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
  int64_t chunks = std::min<int64_t>(threads, n / grain);
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    f(b, e);
  }
}
}  // namespace tg
