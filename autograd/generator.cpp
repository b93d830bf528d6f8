#include "autograd/generator.h"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "autograd/error.h"

namespace tg {

double Generator::normal() {
  uint64_t c = reserve(2);
  double u1 = 1.0 - uniform_at(c), u2 = uniform_at(c + 1);  // u1 in (0,1]: log is finite
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

int64_t Generator::randint(int64_t low, int64_t high) {
  if (high <= low) throw ValueError(fmt::format("randint: empty range [{}, {})", low, high));
  uint64_t span = static_cast<uint64_t>(high - low);
  return low + static_cast<int64_t>(next_u64() % span);
}

Generator& default_generator() {
  thread_local Generator g;
  return g;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace tg
