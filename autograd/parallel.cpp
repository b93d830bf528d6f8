#include "autograd/parallel.h"

#include <cstdlib>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "autograd/blas.h"
#include "autograd/error.h"

namespace tg {
namespace {

int initial_threads() {
  if (const char* e = std::getenv("TAPEGRAD_NUM_THREADS")) {
    int n = std::atoi(e);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

int& threads() {
  static int n = [] {
    int t = initial_threads();
    blas_set_num_threads(t);
    return t;
  }();
  return n;
}

}  // namespace

void set_num_threads(int n) {
  if (n < 1) throw ValueError(fmt::format("set_num_threads: need at least 1 thread, got {}", n));
  threads() = n;
  blas_set_num_threads(n);
}

int num_threads() { return threads(); }

}  // namespace tg
