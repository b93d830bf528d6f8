#pragma once
// Shared by the optimizers' fused update loops (one pass over a parameter,
// its gradient and its state per step).
#include <cstdint>

namespace tg::nn {

// Elements per thread chunk: an update is a few flops per element, so only
// large parameters (embeddings, big projections) are split across threads.
inline constexpr int64_t kOptimGrain = 1 << 15;

// Calls f.template operator()<b0, b1, ...>() with the runtime flags as
// template arguments. The update loops test options with `if constexpr`: a
// branch around a float operation stops GCC from vectorising (-ftrapping-math).
template <bool... Done, class F>
void with_flags(F& f) {
  f.template operator()<Done...>();
}
template <bool... Done, class F, class... Bools>
void with_flags(F& f, bool b, Bools... rest) {
  if (b)
    with_flags<Done..., true>(f, rest...);
  else
    with_flags<Done..., false>(f, rest...);
}

}  // namespace tg::nn
