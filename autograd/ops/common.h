#pragma once
// What every op family's kernels share: argument checks that name the op,
// the (outer, n, inner) view of an axis and the row grain of parallel loops.
// The float dispatcher is tg::dispatch_float in ../dtype.h. Internal to
// autograd/ops/*.cpp (not installed).
#include <algorithm>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "loop.h"
#include "../tape.h"
#include "../tensor.h"

namespace tg::detail {

// ---- argument checks: each error names the op, the argument and its shape

// ValueError "op: what is undefined".
inline void check_defined(std::string_view op, const Tensor& x, std::string_view what) {
  if (!x.defined()) throw ValueError(fmt::format("{}: {} is undefined", op, what));
}
// Defined and float32/float64, else ValueError / DTypeError.
inline void check_floating(std::string_view op, const Tensor& x, std::string_view what) {
  check_defined(op, x, what);
  if (x.dtype() == DType::bf16) throw_bf16_compute(op);
  if (!is_floating(x.dtype()))
    throw DTypeError(fmt::format("{}: {} must be float32 or float64, got {} {}", op, what, x.shape(),
                                 dtype_name(x.dtype())));
}
// Both defined and of one dtype (binary ops never convert), else ValueError / DTypeError.
inline void check_same_dtype(std::string_view op, const Tensor& a, const Tensor& b) {
  check_defined(op, a, "tensor");
  check_defined(op, b, "tensor");
  if (a.dtype() != b.dtype())
    throw DTypeError(fmt::format("{}: dtypes differ: {} {} and {} {} (convert one with .to())", op, a.shape(),
                                 dtype_name(a.dtype()), b.shape(), dtype_name(b.dtype())));
}

// A contiguous, untracked handle on x's data for the kernels to read.
inline Tensor dense(const Tensor& x) {
  NoGradGuard ng;
  return x.contiguous();
}

// A float32 x as a contiguous bfloat16 tensor, rounded to nearest even as
// autocast's GEMMs round their operands (rows are read in place where x's
// last dim is dense: no float32 copy first); a bfloat16 x as it is. For
// an operand that several GEMMs read, or that a node keeps (AutocastInput).
Tensor bf16_operand(const Tensor& x);
// A saved tensor as float32 where its node kept it in bfloat16 under autocast
// (an AutocastInput's copy, the LSTM's gates), for the rules that compute on
// it in float32 (tangents, forward over reverse); anything else as it is.
inline Tensor as_float(const Tensor& t) { return t.defined() && t.dtype() == DType::bf16 ? t.to(DType::f32) : t; }

// ---- layout

// A contiguous shape seen as (outer, n, inner) around the axes first..last:
// n spans those axes, outer the ones before, inner the ones after. Softmax
// over an axis, index_select's rows and a reduction's block all walk this.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
inline AxisView axis_view(const Shape& s, int first, int last) {
  AxisView v;
  for (int d = 0; d < s.size(); ++d) (d < first ? v.outer : d <= last ? v.n : v.inner) *= s[d];
  return v;
}
inline AxisView axis_view(const Shape& s, int axis) { return axis_view(s, axis, axis); }

// Rows of row_len elements per parallel chunk, so that a chunk holds about
// `chunk` elements (at least one row).
inline int64_t row_grain(int64_t row_len, int64_t chunk = kElementwiseGrain) {
  return std::max<int64_t>(1, chunk / std::max<int64_t>(row_len, 1));
}

}  // namespace tg::detail
