#pragma once
// What autograd/ops/elementwise/*.cpp share: a unary op's forward loop, and
// its gradient and tangent from its derivative written once
// (times_derivative). Internal (not installed).
#include <string_view>

#include "autograd/dtype.h"
#include "autograd/ops/common.h"
#include "autograd/ops/pointwise.h"
#include "autograd/tensor.h"

namespace tg::detail::elementwise {

template <class F>
Tensor unary(std::string_view op, const Tensor& x, F f) {
  check_defined(op, x, "tensor");
  Tensor out = empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), op, [&]<class T>(T) { map1<T, T>(out, x, f); });
  return out;
}

// grad_in = f(grad_out, s) elementwise, s saved by forward (same shape).
// Written into grad_out's memory when nothing else holds it (Tape::backward
// hands each node's gradient over), so a chain of unary ops backpropagates
// through one buffer instead of allocating one per op. A bfloat16 s (an
// AutocastInput's copy, g float32) is read as float32.
template <class F>
Tensor fused_grad(const Tensor& g, const Tensor& s, F f) {
  const bool only_reference = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
                              g.shape() == s.shape();
  Tensor out = only_reference ? g : empty(g.shape(), g.dtype());
  if (s.dtype() == DType::bf16 && g.dtype() == DType::f32)
    map2<float, float, bfloat16>(out, g, s, [f](float gy, bfloat16 v) { return f(gy, static_cast<float>(v)); });
  else
    dispatch_float(g.dtype(), "backward", [&]<class T>(T) { map2<T, T, T>(out, g, s, f); });
  return out;
}

// g * d(s) elementwise, d a unary op's derivative written once (pointwise.h):
// a gradient (g the output's gradient) or a tangent (g the input's tangent)
// alike, an elementwise Jacobian being diagonal. Plain, the fused pass of
// fused_grad (into g's buffer where it can), about 3x the tensor ops' speed
// (measured beside pointwise() in pointwise.h); recorded, d in tensor ops.
template <class D>
Tensor times_derivative(const Tensor& g, const Tensor& s, D d) {
  if (grad_enabled()) return g * d(s);
  return fused_grad(g, s, [d](auto gy, auto sv) { return gy * d(sv); });
}

// pow_scalar, gelu, clamp and the unary ops whose backward reads x: the input x.
struct UnaryInputSaved {
  Tensor x;
  static constexpr std::tuple fields{saved_field("x", &UnaryInputSaved::x)};
};
// The unary ops whose backward reads their output y.
struct UnaryOutputSaved {
  Tensor y;
  static constexpr std::tuple fields{saved_field("output", &UnaryOutputSaved::y)};
};

}  // namespace tg::detail::elementwise
