#pragma once
// One formula for an elementwise computation, written once as a generic
// lambda over `auto` and run the way the engine's mode asks. Plain (grad mode
// off: a backward without create_graph, a forward-AD level whose tangents are
// not differentiated) it is one fused pass, the formula applied to scalars;
// recorded (grad mode on) it is the formula applied to tensors: tensor ops,
// recorded, that differentiate again. So a derivative exists once, not as a
// kernel and again as ops.
//
// One spelling serves both: arithmetic with int literals (1 - y * y) works on
// floats and tensors as it is, lit(s, v) is any other constant v in s's type,
// and each math:: function has a scalar and a Tensor overload. Internal to
// autograd/ops/ (not installed).
#include <cmath>
#include <concepts>
#include <string_view>

#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/nn_kernels.h"

namespace tg::detail {

namespace math {
template <std::floating_point T> T lit(const T&, double v) { return static_cast<T>(v); }
inline double lit(const Tensor&, double v) { return v; }
template <std::floating_point T> T exp(T x) { return vexp(x); }
inline Tensor exp(const Tensor& x) { return tg::exp(x); }
template <std::floating_point T> T erf(T x) { return verf(x); }
inline Tensor erf(const Tensor& x) { return tg::erf(x); }
template <std::floating_point T> T tanh(T x) { return std::tanh(x); }
inline Tensor tanh(const Tensor& x) { return tg::tanh(x); }
template <std::floating_point T> T pow(T x, T e) { return std::pow(x, e); }
inline Tensor pow(const Tensor& x, double e) { return tg::pow(x, e); }
template <std::floating_point T> T sigmoid(T x) {
  // Stable on both sides: never exponentiates a large positive number.
  if (x >= 0) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}
inline Tensor sigmoid(const Tensor& x) { return tg::sigmoid(x); }
// The slope of a piecewise-linear op (relu, abs, clamp) from a predicate p:
// p(s) as a number (0 or 1; sign: -1, 0 or 1). For a tensor it is a constant
// of the recorded backward (its own derivative is zero almost everywhere).
template <std::floating_point T, class P> T step(T s, P p) { return static_cast<T>(p(s)); }
template <class P> Tensor step(const Tensor& s, P p) {
  Tensor out = empty(s.shape(), s.dtype());
  dispatch_float(s.dtype(), "step", [&](auto tag) {
    using T = decltype(tag);
    map1<T, T>(out, s, [p](T v) { return static_cast<T>(p(v)); });
  });
  return out;
}
}  // namespace math

// f(ts...) elementwise, the tensors (one to three, one float dtype) broadcast
// to a common shape: fused, or in tensor ops when recorded (see above).
template <class F, class... Ts>
Tensor pointwise(std::string_view op, F f, const Ts&... ts) {
  static_assert(sizeof...(Ts) >= 1 && sizeof...(Ts) <= 3, "pointwise: one to three tensors");
  if (grad_enabled()) return f(ts...);
  const Tensor* args[] = {&ts...};
  Shape shape = args[0]->shape();
  for (const Tensor* t : args) shape = broadcast_shapes(shape, t->shape(), "pointwise");
  Tensor out = empty(shape, args[0]->dtype());
  dispatch_float(args[0]->dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof...(Ts) == 1)
      map1<T, T>(out, ts..., f);
    else if constexpr (sizeof...(Ts) == 2)
      map2<T, T, T>(out, ts..., f);
    else
      map3<T, T, T, T>(out, ts..., f);
  });
  return out;
}

}  // namespace tg::detail
