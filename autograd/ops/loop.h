#pragma once
// The one mechanism behind every elementwise kernel: iterate N strided,
// broadcast operands over a shape, handing the kernel runs of the innermost
// dimension. Dimensions are coalesced first, so contiguous tensors become one
// long run and the kernel's inner loop (stride 1, or 0 for a broadcast
// operand) vectorises. Large loops are split across threads by element range.
#include <algorithm>
#include <array>
#include <cstdint>
#include <tuple>
#include <utility>

#include "../parallel.h"
#include "../tensor.h"

namespace tg::detail {

template <int N>
struct StridedLoop {
  int ndim = 0;                        // after coalescing; outer -> inner
  int64_t size[kMaxDims] = {};
  int64_t stride[N][kMaxDims] = {};    // element strides, 0 where broadcast
  int64_t numel = 1;
};

// Operand k is viewed with `shape` by broadcasting (right-aligned; size-1 or
// missing dims get stride 0). The caller has checked broadcastability.
template <int N>
StridedLoop<N> make_loop(const Shape& shape, const std::array<const Tensor*, N>& ops) {
  StridedLoop<N> L;
  int full = shape.size();
  int64_t st[N][kMaxDims];
  for (int k = 0; k < N; ++k) {
    const Shape& os = ops[k]->shape();
    const Shape& ostr = ops[k]->strides();
    int off = full - os.size();
    for (int d = 0; d < full; ++d) {
      int od = d - off;
      st[k][d] = (od < 0 || os[od] == 1) ? 0 : ostr[od];
    }
  }
  L.numel = shape.numel();
  // Drop size-1 dims, then merge an outer dim into the next inner one when
  // every operand steps through them as one.
  for (int d = 0; d < full; ++d) {
    if (shape[d] == 1) continue;
    if (L.ndim > 0) {
      int j = L.ndim - 1;
      bool merge = true;
      for (int k = 0; k < N; ++k) merge &= L.stride[k][j] == st[k][d] * shape[d];
      if (merge) {
        L.size[j] *= shape[d];
        for (int k = 0; k < N; ++k) L.stride[k][j] = st[k][d];
        continue;
      }
    }
    L.size[L.ndim] = shape[d];
    for (int k = 0; k < N; ++k) L.stride[k][L.ndim] = st[k][d];
    ++L.ndim;
  }
  return L;
}

// Calls run(offsets, inner_strides, n) for the runs of the innermost dimension
// covering elements [begin, end) in row-major order; offsets[k] is operand k's
// element offset (from its data pointer, whatever its type) at a run's start.
template <int N, class F>
void run_range(const StridedLoop<N>& L, int64_t begin, int64_t end, F& run) {
  std::array<int64_t, N> off{};
  std::array<int64_t, N> inner{};
  if (L.ndim == 0) {  // a single element
    if (begin < end) run(off, inner, int64_t{1});
    return;
  }
  const int last = L.ndim - 1;
  int64_t idx[kMaxDims];
  int64_t rem = begin;
  for (int d = last; d >= 0; --d) {
    idx[d] = rem % L.size[d];
    rem /= L.size[d];
  }
  for (int k = 0; k < N; ++k) {
    for (int d = 0; d <= last; ++d) off[k] += idx[d] * L.stride[k][d];
    inner[k] = L.stride[k][last];
  }
  int64_t pos = begin;
  while (pos < end) {
    int64_t n = std::min(L.size[last] - idx[last], end - pos);
    run(off, inner, n);
    pos += n;
    if (pos >= end) break;
    // Step to the next run: move along the inner dim, then carry outwards.
    for (int k = 0; k < N; ++k) off[k] += n * inner[k];
    idx[last] += n;
    for (int d = last; d > 0 && idx[d] == L.size[d]; --d) {
      idx[d] = 0;
      idx[d - 1]++;
      for (int k = 0; k < N; ++k) off[k] += L.stride[k][d - 1] - L.size[d] * L.stride[k][d];
    }
  }
}

// On the lambda that holds a map's inner loops: f, and whatever f calls, are
// inlined there, so that the loops vectorise whatever else the calling file
// holds (left to its heuristics, GCC's inliner keeps f out of line once the
// file reaches its unit-growth limit; gelu's backward ran 6x slower so).
#define TG_KERNEL_LOOP __attribute__((flatten))

// Elements per thread below which a loop stays on one thread.
inline constexpr int64_t kElementwiseGrain = 32768;

template <int N, class F>
void for_each_run(const StridedLoop<N>& L, F run, int64_t grain = kElementwiseGrain) {
  parallel_for(L.numel, grain, [&](int64_t b, int64_t e) { run_range<N>(L, b, e, run); });
}

// A run's operand at i: p[i], or v, a broadcast scalar hoisted out of the loop.
template <bool Hoisted, class V, class P>
inline auto operand(V v, P p, int64_t i) {
  if constexpr (Hoisted) return v;
  else return p[i];
}
template <class>
using TensorArg = const Tensor&;

// out = f(in...) elementwise, each input (of element type TI) broadcast to
// out's shape. Contiguous runs, and runs with one input a broadcast scalar
// (held in a register) and the rest contiguous, get loops that vectorise.
template <class TO, class... TI, class F>
void map_n(const Tensor& out, F f, TensorArg<TI>... in) {
  constexpr int N = 1 + sizeof...(TI);
  auto L = make_loop<N>(out.shape(), {&out, &in...});
  TO* const po = out.data<TO>();
  const std::tuple<const TI*...> pin{in.template data<TI>()...};
  for_each_run<N>(L, [&](const std::array<int64_t, N>& off, const std::array<int64_t, N>& s, int64_t n) TG_KERNEL_LOOP {
    [&]<size_t... K>(std::index_sequence<K...>) {
      TO* o = po + off[0];
      const std::tuple<const TI*...> p{std::get<K>(pin) + off[K + 1]...};
      auto scalar_input = [&]<size_t J>(std::integral_constant<size_t, J>) {
        if (s[0] != 1 || s[J + 1] != 0 || !((K == J || s[K + 1] == 1) && ...)) return false;
        const auto v = std::get<J>(p)[0];
        for (int64_t i = 0; i < n; ++i) o[i] = f(operand<K == J>(v, std::get<K>(p), i)...);
        return true;
      };
      if (s[0] == 1 && ((s[K + 1] == 1) && ...)) {
        for (int64_t i = 0; i < n; ++i) o[i] = f(std::get<K>(p)[i]...);
      } else if (!(scalar_input(std::integral_constant<size_t, K>{}) || ...)) {
        for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(std::get<K>(p)[i * s[K + 1]]...);
      }
    }(std::index_sequence_for<TI...>{});
  });
}
// The fixed arities the kernels call: out = f(a), f(a, b), f(a, b, c).
template <class TO, class TA, class F>
void map1(const Tensor& out, const Tensor& a, F f) { map_n<TO, TA>(out, f, a); }
template <class TO, class TA, class TB, class F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) { map_n<TO, TA, TB>(out, f, a, b); }
template <class TO, class TA, class TB, class TC, class F>
void map3(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  map_n<TO, TA, TB, TC>(out, f, a, b, c);
}

}  // namespace tg::detail
