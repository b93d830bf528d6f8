#pragma once
// One formula for an elementwise computation, written once as a generic
// lambda over `auto` and run the way the engine's mode asks: plain (grad mode
// off: a backward without create_graph, a forward-AD level whose tangents are
// not differentiated), one fused pass over scalars; recorded (grad mode on),
// tensor ops that differentiate again. So a derivative exists once, not as a
// kernel and again as ops. Int literals (1 - y * y) work on both as they are,
// lit(s, v) is any other constant v in s's type, and each math:: function has
// a scalar and a Tensor overload. Internal to autograd/ops/ (not installed).
#include <cmath>
#include <concepts>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/nn_kernels.h"

namespace tg::detail {

namespace math {
template <std::floating_point T> T lit(const T&, double v) { return static_cast<T>(v); }
inline double lit(const Tensor&, double v) { return v; }
using tg::exp, tg::erf, tg::tanh, tg::pow, tg::sigmoid;  // the Tensor overloads
template <std::floating_point T> T exp(T x) { return vexp_full(x); }
template <std::floating_point T> T erf(T x) { return verf(x); }
template <std::floating_point T> T tanh(T x) { return vtanh(x); }
template <std::floating_point T> T pow(T x, T e) { return std::pow(x, e); }
template <std::floating_point T> T sigmoid(T x) { return vsigmoid(x); }
// The slope of a piecewise-linear op (relu, abs, clamp) from a predicate p:
// p(s) as a number (0 or 1; sign: -1, 0 or 1). For a tensor it is a constant
// of the recorded backward (its own derivative is zero almost everywhere).
template <std::floating_point T, class P> T step(T s, P p) { return static_cast<T>(p(s)); }
template <class P> Tensor step(const Tensor& s, P p) {
  Tensor out = empty(s.shape(), s.dtype());
  dispatch_float(s.dtype(), "step", [&]<class T>(T) { map1<T, T>(out, s, [p](T v) { return step(v, p); }); });
  return out;
}
}  // namespace math

// f(ts...) elementwise, the tensors (of one float dtype) broadcast to a
// common shape: fused, or in tensor ops when recorded (see above). The mode
// test stays because the fused pass is what makes a plain backward fast:
// tanh's backward on (2048,512) float32 at one thread took 157 us through the
// engine, fused, against 451 us for g * (1 - y*y) as no-grad tensor ops.
template <class F, class... Ts>
Tensor pointwise(std::string_view op, F f, const Ts&... ts) {
  if (grad_enabled()) return f(ts...);
  const Tensor& t0 = std::get<0>(std::tie(ts...));
  Shape shape = t0.shape();
  ((shape = broadcast_shapes(shape, ts.shape(), "pointwise")), ...);
  Tensor out = empty(shape, t0.dtype());
  dispatch_float(t0.dtype(), op, [&]<class T>(T) { map_n<T, std::conditional_t<true, T, Ts>...>(out, f, ts...); });
  return out;
}

}  // namespace tg::detail
