#pragma once
// What the ops' tangent rules (OpDef::tangent) share. An undefined tangent is
// a zero one: the helpers skip it instead of materialising zeros. Internal to
// autograd/ops/*.cpp (not installed).
#include "../forward_ad.h"
#include "../tensor.h"
#include "elementwise.h"
#include "view.h"

namespace tg::detail {

// a + b, either undefined (zero).
inline Tensor tangent_add(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return add(a, b);
}
// t broadcast to shape (a view), for an input tangent that an op broadcasts.
inline Tensor broadcast_tangent(const Tensor& t, const Shape& shape) {
  if (!t.defined() || t.shape() == shape) return t;
  return expand(t, shape);
}
// x's tangent at the open forward-AD level, dense, or zeros where it has
// none: what a backward reads when it gives its gradients' tangents too
// (OpSpec::backward_with_tangents).
inline Tensor tangent_or_zeros(const Tensor& x) {
  const Tensor t = tangent(x);
  return t.defined() ? t.contiguous() : zeros(x.shape(), x.dtype());
}

}  // namespace tg::detail
