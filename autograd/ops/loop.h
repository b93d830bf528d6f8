#pragma once
// The one mechanism behind every elementwise kernel: iterate N strided,
// broadcast operands over a shape, handing the kernel runs of the innermost
// dimension. Dimensions are coalesced first, so contiguous tensors become one
// long run and the kernel's inner loop (stride 1, or 0 for a broadcast
// operand) vectorises. Large loops are split across threads by element range.
#include <algorithm>
#include <array>
#include <cstdint>

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

// Calls run(offsets, inner_strides, n) for consecutive runs of the innermost
// dimension covering elements [begin, end) of the loop, in row-major order.
// offsets[k] is operand k's element offset (from its data pointer) at the
// start of the run; operands may have different element types.
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

// out = f(a) elementwise; a is broadcast to out's shape.
template <class TO, class TA, class F>
void map1(const Tensor& out, const Tensor& a, F f) {
  auto L = make_loop<2>(out.shape(), {&out, &a});
  TO* po = out.data<TO>();
  const TA* pa = a.data<TA>();
  for_each_run<2>(L, [&](const std::array<int64_t, 2>& off, const std::array<int64_t, 2>& s, int64_t n) TG_KERNEL_LOOP {
    TO* o = po + off[0];
    const TA* x = pa + off[1];
    if (s[0] == 1 && s[1] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i]);
    } else if (s[0] == 1 && s[1] == 0) {
      const TO v = f(x[0]);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]]);
    }
  });
}

// out = f(a, b) elementwise; a and b are broadcast to out's shape. The
// contiguous and scalar-broadcast cases get their own vectorisable loops.
template <class TO, class TA, class TB, class F>
void map2(const Tensor& out, const Tensor& a, const Tensor& b, F f) {
  auto L = make_loop<3>(out.shape(), {&out, &a, &b});
  TO* po = out.data<TO>();
  const TA* pa = a.data<TA>();
  const TB* pb = b.data<TB>();
  for_each_run<3>(L, [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& s, int64_t n) TG_KERNEL_LOOP {
    TO* o = po + off[0];
    const TA* x = pa + off[1];
    const TB* y = pb + off[2];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == 1 && s[1] == 1 && s[2] == 0) {
      const TB v = y[0];
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], v);
    } else if (s[0] == 1 && s[1] == 0 && s[2] == 1) {
      const TA v = x[0];
      for (int64_t i = 0; i < n; ++i) o[i] = f(v, y[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]], y[i * s[2]]);
    }
  });
}

// out = f(a, b, c) elementwise with broadcasting (where, clamp-style ops).
template <class TO, class TA, class TB, class TC, class F>
void map3(const Tensor& out, const Tensor& a, const Tensor& b, const Tensor& c, F f) {
  auto L = make_loop<4>(out.shape(), {&out, &a, &b, &c});
  TO* po = out.data<TO>();
  const TA* pa = a.data<TA>();
  const TB* pb = b.data<TB>();
  const TC* pc = c.data<TC>();
  for_each_run<4>(L, [&](const std::array<int64_t, 4>& off, const std::array<int64_t, 4>& s, int64_t n) TG_KERNEL_LOOP {
    TO* o = po + off[0];
    const TA* x = pa + off[1];
    const TB* y = pb + off[2];
    const TC* z = pc + off[3];
    if (s[0] == 1 && s[1] == 1 && s[2] == 1 && s[3] == 1) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i], z[i]);
    } else {
      for (int64_t i = 0; i < n; ++i) o[i * s[0]] = f(x[i * s[1]], y[i * s[2]], z[i * s[3]]);
    }
  });
}

}  // namespace tg::detail
