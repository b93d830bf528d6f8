// Elementwise ops: forward and backward side by side, one OpDef each.
// Unary backward kernels are fused: one pass computes grad_in from grad_out
// and what forward saved, instead of chaining tensor ops. Under create_graph
// (grad_enabled() inside backward) each takes the same formula in tensor ops
// instead, recorded so that it can be differentiated again.
#include "autograd/ops/elementwise.h"

#include <cmath>
#include <numbers>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/profiler.h"

namespace tg {
using detail::broadcast_tangent;
using detail::check_same_dtype;
using detail::scaled_tangent;
using detail::tangent_add;

namespace {

// out = f(a, b) over the broadcast shape; f is generic in the element type.
template <class F>
Tensor binary(const char* op, const Tensor& a, const Tensor& b, F f, bool floating_only = false) {
  check_same_dtype(op, a, b);
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), op), a.dtype());
  if (floating_only) {
    dispatch_float(a.dtype(), op, [&](auto tag) {
      using scalar_t = decltype(tag);
      detail::map2<scalar_t, scalar_t, scalar_t>(out, a, b, f);
    });
  } else {
    TG_DISPATCH_ALL(a.dtype(), op, [&] { detail::map2<scalar_t, scalar_t, scalar_t>(out, a, b, f); });
  }
  return out;
}

template <class F>
Tensor unary(std::string_view op, const Tensor& x, F f) {
  detail::check_defined(op, x, "tensor");
  Tensor out = empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using scalar_t = decltype(tag);
    detail::map1<scalar_t, scalar_t>(out, x, f);
  });
  return out;
}

// grad_in = f(grad_out, s) elementwise, s saved by forward (same shape).
// Written into grad_out's memory when nothing else holds it (Tape::backward
// hands each node's gradient over), so a chain of unary ops backpropagates
// through one buffer instead of allocating one per op.
template <class F>
Tensor fused_grad(const Tensor& g, const Tensor& s, F f) {
  const bool only_reference = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous() &&
                              g.shape() == s.shape();
  Tensor out = only_reference ? g : empty(g.shape(), g.dtype());
  dispatch_float(g.dtype(), "backward", [&](auto tag) {
    using scalar_t = decltype(tag);
    detail::map2<scalar_t, scalar_t, scalar_t>(out, g, s, f);
  });
  return out;
}

// The derivative of a piecewise-linear op (relu, abs, clamp): a step function
// f of a saved tensor s, same shape. It is a constant of the recorded
// backward (its own derivative is zero almost everywhere), so mul(g, slope)
// is the differentiable gradient.
template <class F>
Tensor slope_of(const Tensor& s, F f) {
  return unary("backward", s, f);
}

// --- sample helpers shared by this family's OpDefs
using samples::uniform;
std::vector<OpSample> binary_samples(Tensor (*op)(const Tensor&, const Tensor&), double low, double high) {
  auto fn = [op](const std::vector<Tensor>& x) { return op(x[0], x[1]); };
  return {
      {"same shape (3,4)", {uniform({3, 4}, 1, low, high), uniform({3, 4}, 2, low, high)}, fn},
      {"broadcast (2,1,3) with (4,1)", {uniform({2, 1, 3}, 3, low, high), uniform({4, 1}, 4, low, high)}, fn},
      {"row broadcast (3,4) with (4)", {uniform({3, 4}, 5, low, high), uniform({4}, 6, low, high)}, fn},
      {"scalar () with (5)", {uniform({}, 7, low, high), uniform({5}, 8, low, high)}, fn},
      {"non-contiguous (2,3)", {samples::strided({2, 3}, 9, low, high), uniform({2, 3}, 10, low, high)}, fn},
  };
}
std::vector<OpSample> unary_samples(Tensor (*op)(const Tensor&), double low, double high) {
  auto fn = [op](const std::vector<Tensor>& x) { return op(x[0]); };
  return {
      {"(3,4)", {uniform({3, 4}, 11, low, high)}, fn},
      {"scalar ()", {uniform({}, 12, low, high)}, fn},
      {"non-contiguous (2,3,2)", {samples::strided({2, 3, 2}, 13, low, high)}, fn},
  };
}
std::vector<OpSample> kinked_unary_samples(Tensor (*op)(const Tensor&)) {
  auto fn = [op](const std::vector<Tensor>& x) { return op(x[0]); };
  return {
      {"(3,4) away from 0", {samples::away_from_zero({3, 4}, 14)}, fn},
      {"non-contiguous", {[] {
         Tensor t = samples::strided({2, 3}, 15);
         NoGradGuard ng;
         double* p = static_cast<double*>(t.storage()->data);
         for (int64_t i = 0; i < 12; ++i) p[i] = std::copysign(0.1 + std::abs(p[i]), p[i]);
         return t;
       }()}, fn},
  };
}

}  // namespace

// ============================ add / sub ============================
static void add_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(g, n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(g, n.edges[1].shape);
}
static void add_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(t[0], t[1]), n.out_shape);
}
static const OpDef add_op("add", 2, "add(a, b) -> a + b, broadcasting", "nothing", add_backward, add_tangent,
                          [] { return binary_samples(add, -1, 1); });
Tensor add(const Tensor& a, const Tensor& b) {
  ProfileScope prof(add_op.name);
  Tensor out = binary("add", a, b, [](auto x, auto y) { return x + y; });
  record(add_op, out, a, b);
  return out;
}

static void sub_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(g, n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(neg(g), n.edges[1].shape);
}
static void sub_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(t[0], t[1].defined() ? neg(t[1]) : Tensor()), n.out_shape);
}
static const OpDef sub_op("sub", 2, "sub(a, b) -> a - b, broadcasting", "nothing", sub_backward, sub_tangent,
                          [] { return binary_samples(sub, -1, 1); });
Tensor sub(const Tensor& a, const Tensor& b) {
  ProfileScope prof(sub_op.name);
  Tensor out = binary("sub", a, b, [](auto x, auto y) { return x - y; });
  record(sub_op, out, a, b);
  return out;
}

// ============================ mul / div ============================
namespace {
// mul, minimum, maximum: both operands.
struct BinarySaved {
  enum : size_t { kA, kB };
};
// div, pow: both operands and the output.
struct BinaryOutputSaved {
  enum : size_t { kA, kB, kOutput };
};
}  // namespace

static void mul_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(mul(g, n.saved_tensor(BinarySaved::kB)), n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(mul(g, n.saved_tensor(BinarySaved::kA)), n.edges[1].shape);
}
static void mul_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(scaled_tangent(t[0], n.saved_tensor(BinarySaved::kB)),
                                         scaled_tangent(t[1], n.saved_tensor(BinarySaved::kA))),
                             n.out_shape);
}
static const OpDef mul_op("mul", 2, "mul(a, b) -> a * b, broadcasting", "a, b", mul_backward, mul_tangent,
                          [] { return binary_samples(mul, -1, 1); });
Tensor mul(const Tensor& a, const Tensor& b) {
  ProfileScope prof(mul_op.name);
  Tensor out = binary("mul", a, b, [](auto x, auto y) { return x * y; });
  if (Node* n = record(mul_op, out, a, b)) {
    n->save(a);  // BinarySaved::kA
    n->save(b);  // kB
  }
  return out;
}

static void div_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor b = n.saved_tensor(BinaryOutputSaved::kB);
  if (n.needs(0)) gin[0] = sum_to(div(g, b), n.edges[0].shape);
  if (n.needs(1))  // -g * out / b
    gin[1] = sum_to(neg(div(mul(g, n.saved_tensor(BinaryOutputSaved::kOutput)), b)), n.edges[1].shape);
}
static void div_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  // (ta - out * tb) / b
  const Tensor tb = t[1].defined() ? neg(mul(n.saved_tensor(BinaryOutputSaved::kOutput), t[1])) : Tensor();
  const Tensor num = tangent_add(t[0], tb);
  out[0] = broadcast_tangent(num.defined() ? div(num, n.saved_tensor(BinaryOutputSaved::kB)) : Tensor(), n.out_shape);
}
static const OpDef div_op("div", 2, "div(a, b) -> a / b, broadcasting", "a, b, output", div_backward, div_tangent,
                          [] { return binary_samples(div, 0.5, 2); });
Tensor div(const Tensor& a, const Tensor& b) {
  ProfileScope prof(div_op.name);
  Tensor out = binary("div", a, b, [](auto x, auto y) { return x / y; });
  if (Node* n = record(div_op, out, a, b)) {
    n->save(a);    // BinaryOutputSaved::kA
    n->save(b);    // kB
    n->save(out);  // kOutput
  }
  return out;
}

// ============================ pow ============================
// The partial derivatives of a ** b, in tensor ops: b a^(b-1), 0 where b == 0
// (a ** 0 is constant, also at a = 0 where b a^(b-1) is 0 * inf); and
// a^b log a, 0 where a == 0 (its limit for b > 0, and torch's value at 0 ** 0,
// where 0 * log 0 would be NaN). log reads a with its zeros replaced by 1, so
// that no NaN reaches the gradient of the derivative either.
static Tensor pow_slope_base(const Node& n) {
  const Tensor a = n.saved_tensor(BinaryOutputSaved::kA), b = n.saved_tensor(BinaryOutputSaved::kB);
  const Tensor zero = zeros({}, b.dtype());
  return where(eq(b, zero), zero, mul(b, pow(a, add(b, -1.0))));
}
static Tensor pow_slope_exponent(const Node& n) {
  const Tensor a = n.saved_tensor(BinaryOutputSaved::kA);
  const Tensor a_zero = eq(a, zeros({}, a.dtype()));
  return mul(n.saved_tensor(BinaryOutputSaved::kOutput), log(where(a_zero, ones({}, a.dtype()), a)));
}
static void pow_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(mul(g, pow_slope_base(n)), n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(mul(g, pow_slope_exponent(n)), n.edges[1].shape);
}
static void pow_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(t[0].defined() ? mul(t[0], pow_slope_base(n)) : Tensor(),
                                         t[1].defined() ? mul(t[1], pow_slope_exponent(n)) : Tensor()),
                             n.out_shape);
}
static const OpDef pow_op("pow", 2, "pow(a, b) -> a ** b, broadcasting (a > 0 for non-integer b)", "a, b, output",
                          pow_backward, pow_tangent, [] {
  std::vector<OpSample> s = binary_samples(pow, 0.5, 2);
  // A learnable exponent over a constant base with a zero: d/db there is 0
  // (0 * log 0 would be NaN). The base is constant: finite differences would
  // step it below 0, where a^b log a is undefined.
  Tensor b = from_vector(std::vector<double>{2.0}, Shape{});
  b.requires_grad_();
  s.push_back({"a (3) with a 0, learnable b () = 2",
               {from_vector(std::vector<double>{0.0, 0.5, 2.0}, {3}), b}, [](auto& x) { return pow(x[0], x[1]); }});
  return s;
});
Tensor pow(const Tensor& a, const Tensor& b) {
  ProfileScope prof(pow_op.name);
  Tensor out = binary("pow", a, b, [](auto x, auto y) { return std::pow(x, y); }, true);
  if (Node* n = record(pow_op, out, a, b)) {
    n->save(a);    // BinaryOutputSaved::kA
    n->save(b);    // kB
    n->save(out);  // kOutput
  }
  return out;
}

// ============================ minimum / maximum ============================
// Where a == b the gradient is split in half, as PyTorch does.
// The weight of a in the result (1, 0, or 0.5 on ties); b's is 1 - it.
template <bool Max>
static Tensor minmax_weight(const Node& n) {
  const Tensor a = n.saved_tensor(BinarySaved::kA), b = n.saved_tensor(BinarySaved::kB);
  Shape s = broadcast_shapes(a.shape(), b.shape(), Max ? "maximum" : "minimum");
  Tensor wa = empty(s, a.dtype());
  dispatch_float(a.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    detail::map2<scalar_t, scalar_t, scalar_t>(wa, a, b, [](scalar_t x, scalar_t y) {
      return x == y ? scalar_t(0.5) : ((Max ? x > y : x < y) ? scalar_t(1) : scalar_t(0));
    });
  });
  return wa;
}
template <bool Max>
static void minmax_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor wa = minmax_weight<Max>(n);
  if (n.needs(0)) gin[0] = sum_to(mul(g, wa), n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(mul(g, rsub(1.0, wa)), n.edges[1].shape);
}
template <bool Max>
static void minmax_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Tensor wa = minmax_weight<Max>(n);
  out[0] = broadcast_tangent(tangent_add(scaled_tangent(t[0], wa), scaled_tangent(t[1], rsub(1.0, wa))), n.out_shape);
}
static const OpDef minimum_op("minimum", 2, "minimum(a, b), broadcasting", "a, b", minmax_backward<false>,
                              minmax_tangent<false>,
                              [] { return binary_samples(minimum, -1, 1); });
static const OpDef maximum_op("maximum", 2, "maximum(a, b), broadcasting", "a, b", minmax_backward<true>,
                              minmax_tangent<true>,
                              [] { return binary_samples(maximum, -1, 1); });
Tensor minimum(const Tensor& a, const Tensor& b) {
  ProfileScope prof(minimum_op.name);
  Tensor out = binary("minimum", a, b, [](auto x, auto y) { return y < x ? y : x; });
  if (Node* n = record(minimum_op, out, a, b)) n->save(a), n->save(b);  // BinarySaved
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  ProfileScope prof(maximum_op.name);
  Tensor out = binary("maximum", a, b, [](auto x, auto y) { return y > x ? y : x; });
  if (Node* n = record(maximum_op, out, a, b)) n->save(a), n->save(b);  // BinarySaved
  return out;
}

// ============================ with a scalar ============================
static void add_scalar_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = g; }
static void add_scalar_tangent(const Node&, std::span<const Tensor> t, std::span<Tensor> out) { out[0] = t[0]; }
static const OpDef add_scalar_op("add_scalar", 1, "add(a, c) -> a + c", "nothing", add_scalar_backward,
                                 add_scalar_tangent, [] {
  return std::vector<OpSample>{{"(3,4) + 0.5", {uniform({3, 4}, 21)}, [](auto& x) { return add(x[0], 0.5); }}};
});
Tensor add(const Tensor& a, double c) {
  ProfileScope prof(add_scalar_op.name);
  Tensor out;
  TG_DISPATCH_ALL(a.dtype(), "add", [&] {
    out = empty(a.shape(), a.dtype());
    const scalar_t v = static_cast<scalar_t>(c);
    detail::map1<scalar_t, scalar_t>(out, a, [v](scalar_t x) { return x + v; });
  });
  record(add_scalar_op, out, a);
  return out;
}

namespace {
// mul_scalar, pow_scalar: the constant c.
struct ScalarAttrs {
  double c;
};
}  // namespace
static void mul_scalar_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = mul(g, n.attrs<ScalarAttrs>().c);
}
static void mul_scalar_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = mul(t[0], n.attrs<ScalarAttrs>().c);
}
static const OpDef mul_scalar_op("mul_scalar", 1, "mul(a, c) -> a * c", "nothing; attrs: c", mul_scalar_backward,
                                 mul_scalar_tangent, [] {
  return std::vector<OpSample>{{"(3,4) * -1.5", {uniform({3, 4}, 22)}, [](auto& x) { return mul(x[0], -1.5); }}};
});
Tensor mul(const Tensor& a, double c) {
  ProfileScope prof(mul_scalar_op.name);
  Tensor out;
  TG_DISPATCH_ALL(a.dtype(), "mul", [&] {
    out = empty(a.shape(), a.dtype());
    const scalar_t v = static_cast<scalar_t>(c);
    detail::map1<scalar_t, scalar_t>(out, a, [v](scalar_t x) { return x * v; });
  });
  if (Node* n = record(mul_scalar_op, out, a)) n->attrs<ScalarAttrs>() = {.c = c};
  return out;
}

namespace {
// pow_scalar, gelu, clamp: the input x.
struct UnaryInputSaved {
  enum : size_t { kX };
};
}  // namespace
static void pow_scalar_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const double c = n.attrs<ScalarAttrs>().c;
  // x ** 0 is constant: no gradient, also at x = 0 where c x^(c-1) is 0 * inf
  // (reached by differentiating x ** 2 three times).
  if (c == 0.0) {
    gin[0] = mul(g, 0.0);
    return;
  }
  const Tensor x = n.saved_tensor(UnaryInputSaved::kX);
  if (grad_enabled()) {
    gin[0] = g * (pow(x, c - 1) * c);
    return;
  }
  gin[0] = fused_grad(g, x, [c](auto gy, auto x) {
    using T = decltype(x);
    return gy * static_cast<T>(c) * std::pow(x, static_cast<T>(c - 1));
  });
}
// Elementwise, so the tangent is the gradient formula applied to the tangent.
static void pow_scalar_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const double c = n.attrs<ScalarAttrs>().c;
  out[0] = c == 0.0 ? Tensor() : t[0] * (pow(n.saved_tensor(UnaryInputSaved::kX), c - 1) * c);
}
static const OpDef pow_scalar_op("pow_scalar", 1, "pow(a, c) -> a ** c", "a; attrs: c", pow_scalar_backward,
                                 pow_scalar_tangent, [] {
  return std::vector<OpSample>{
      {"(3,4) ** 3", {uniform({3, 4}, 23)}, [](auto& x) { return pow(x[0], 3.0); }},
      {"(3,4) ** -0.5, positive", {uniform({3, 4}, 24, 0.5, 2)}, [](auto& x) { return pow(x[0], -0.5); }},
  };
});
Tensor pow(const Tensor& a, double c) {
  ProfileScope prof(pow_scalar_op.name);
  Tensor out;
  if (c == 2.0)
    out = unary("pow", a, [](auto x) { return x * x; });
  else
    out = unary("pow", a, [c](auto x) { return std::pow(x, static_cast<decltype(x)>(c)); });
  if (Node* n = record(pow_scalar_op, out, a)) {
    n->attrs<ScalarAttrs>() = {.c = c};
    n->save(a);  // UnaryInputSaved::kX
  }
  return out;
}

static void rsub_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = neg(g); }
static void rsub_tangent(const Node&, std::span<const Tensor> t, std::span<Tensor> out) { out[0] = neg(t[0]); }
static const OpDef rsub_op("rsub", 1, "rsub(c, b) -> c - b", "nothing", rsub_backward, rsub_tangent, [] {
  return std::vector<OpSample>{{"2 - (3,4)", {uniform({3, 4}, 25)}, [](auto& x) { return rsub(2.0, x[0]); }}};
});
Tensor rsub(double c, const Tensor& b) {
  ProfileScope prof(rsub_op.name);
  Tensor out;
  TG_DISPATCH_ALL(b.dtype(), "rsub", [&] {
    out = empty(b.shape(), b.dtype());
    const scalar_t v = static_cast<scalar_t>(c);
    detail::map1<scalar_t, scalar_t>(out, b, [v](scalar_t x) { return v - x; });
  });
  record(rsub_op, out, b);
  return out;
}

namespace {
struct RdivSaved {
  enum : size_t { kB, kOutput };
};
}  // namespace
static void rdiv_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  // d(c/b)/db = -c/b^2 = -out/b
  Tensor ratio = div(n.saved_tensor(RdivSaved::kOutput), n.saved_tensor(RdivSaved::kB));
  if (grad_enabled()) {
    gin[0] = -(g * ratio);
    return;
  }
  gin[0] = fused_grad(g, ratio, [](auto gy, auto r) { return -gy * r; });
}
static void rdiv_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = -(t[0] * div(n.saved_tensor(RdivSaved::kOutput), n.saved_tensor(RdivSaved::kB)));
}
static const OpDef rdiv_op("rdiv", 1, "rdiv(c, b) -> c / b", "b, output", rdiv_backward, rdiv_tangent, [] {
  return std::vector<OpSample>{{"3 / (3,4)", {uniform({3, 4}, 26, 0.5, 2)}, [](auto& x) { return rdiv(3.0, x[0]); }}};
});
Tensor rdiv(double c, const Tensor& b) {
  ProfileScope prof(rdiv_op.name);
  Tensor out = unary("rdiv", b, [c](auto x) { return static_cast<decltype(x)>(c) / x; });
  if (Node* n = record(rdiv_op, out, b)) n->save(b), n->save(out);  // RdivSaved::kB, kOutput
  return out;
}

// ============================ unary ============================
// Each unary op: forward kernel, fused backward kernel (grad_out, saved) ->
// grad_in, the same backward in tensor ops (recorded under create_graph; an
// elementwise Jacobian is diagonal, so applied to a tangent it is also the
// tangent rule), OpDef, samples. It saves one tensor: x, or the output when SAVE_OUTPUT.
namespace {
struct UnarySaved {
  enum : size_t { kXOrOutput };
};
}  // namespace
#define TG_UNARY_OP(NAME, SIGNATURE, SAVES, SAMPLES, FORWARD, SAVE_OUTPUT, BACKWARD, RECORDED_BACKWARD) \
  static void NAME##_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {                  \
    const Tensor s = n.saved_tensor(UnarySaved::kXOrOutput);                                            \
    gin[0] = grad_enabled() ? (RECORDED_BACKWARD)(g, s) : fused_grad(g, s, BACKWARD);                   \
  }                                                                                                     \
  static void NAME##_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {         \
    out[0] = (RECORDED_BACKWARD)(t[0], n.saved_tensor(UnarySaved::kXOrOutput));                         \
  }                                                                                                     \
  static const OpDef NAME##_op(#NAME, 1, SIGNATURE, SAVES, NAME##_backward, NAME##_tangent,             \
                               [] { return SAMPLES; });                                                 \
  Tensor NAME(const Tensor& x) {                                                                        \
    ProfileScope prof(NAME##_op.name);                                                                  \
    Tensor out = unary(NAME##_op.name, x, FORWARD);                                                     \
    if (Node* n = record(NAME##_op, out, x)) n->save(SAVE_OUTPUT ? out : x);                            \
    return out;                                                                                         \
  }

template <class T> T sigmoid_of(T x) {
  // Stable on both sides: never exponentiates a large positive number.
  if (x >= 0) return T(1) / (T(1) + std::exp(-x));
  T e = std::exp(x);
  return e / (T(1) + e);
}
template <class T> T softplus_of(T x) { return std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x))); }

TG_UNARY_OP(neg, "neg(x) -> -x", "nothing (saves x only to keep one mechanism)", unary_samples(neg, -1, 1),
            [](auto x) { return -x; }, false, [](auto gy, auto) { return -gy; },
            [](const Tensor& g, const Tensor&) { return -g; })
TG_UNARY_OP(exp, "exp(x)", "output", unary_samples(exp, -2, 2), [](auto x) { return std::exp(x); }, true,
            [](auto gy, auto y) { return gy * y; }, [](const Tensor& g, const Tensor& y) { return g * y; })
TG_UNARY_OP(log, "log(x), x > 0", "x", unary_samples(log, 0.2, 3), [](auto x) { return std::log(x); }, false,
            [](auto gy, auto x) { return gy / x; }, [](const Tensor& g, const Tensor& x) { return g / x; })
TG_UNARY_OP(sqrt, "sqrt(x), x > 0", "output", unary_samples(sqrt, 0.2, 3), [](auto x) { return std::sqrt(x); },
            true, [](auto gy, auto y) { return gy / (y + y); },
            [](const Tensor& g, const Tensor& y) { return g / (y + y); })
TG_UNARY_OP(rsqrt, "rsqrt(x) -> 1/sqrt(x), x > 0", "output", unary_samples(rsqrt, 0.2, 3),
            [](auto x) { return decltype(x)(1) / std::sqrt(x); }, true,
            [](auto gy, auto y) { return decltype(y)(-0.5) * gy * y * y * y; },
            [](const Tensor& g, const Tensor& y) { return g * -0.5 * y * y * y; })
TG_UNARY_OP(abs, "abs(x)", "x", kinked_unary_samples(abs), [](auto x) { return std::abs(x); }, false,
            [](auto gy, auto x) { return x > 0 ? gy : (x < 0 ? -gy : decltype(gy)(0)); },
            [](const Tensor& g, const Tensor& x) {
              return g * slope_of(x, [](auto v) { return decltype(v)((v > 0) - (v < 0)); });  // sign(x)
            })
TG_UNARY_OP(tanh, "tanh(x)", "output", unary_samples(tanh, -2, 2), [](auto x) { return std::tanh(x); }, true,
            [](auto gy, auto y) { return gy * (decltype(y)(1) - y * y); },
            [](const Tensor& g, const Tensor& y) { return g * (1.0 - y * y); })
TG_UNARY_OP(sigmoid, "sigmoid(x)", "output", unary_samples(sigmoid, -3, 3), [](auto x) { return sigmoid_of(x); },
            true, [](auto gy, auto y) { return gy * y * (decltype(y)(1) - y); },
            [](const Tensor& g, const Tensor& y) { return g * y * (1.0 - y); })
TG_UNARY_OP(relu, "relu(x) -> max(x, 0)", "output", kinked_unary_samples(relu),
            [](auto x) { return x > 0 ? x : decltype(x)(0); }, true,
            [](auto gy, auto y) { return y > 0 ? gy : decltype(gy)(0); },
            [](const Tensor& g, const Tensor& y) {
              return g * slope_of(y, [](auto v) { return v > 0 ? decltype(v)(1) : decltype(v)(0); });
            })
TG_UNARY_OP(softplus, "softplus(x) -> log(1 + exp(x))", "x", unary_samples(softplus, -3, 3),
            [](auto x) { return softplus_of(x); }, false, [](auto gy, auto x) { return gy * sigmoid_of(x); },
            [](const Tensor& g, const Tensor& x) { return g * sigmoid(x); })
TG_UNARY_OP(log_sigmoid, "log_sigmoid(x) -> -softplus(-x)", "x", unary_samples(log_sigmoid, -3, 3),
            [](auto x) { return -softplus_of(-x); }, false, [](auto gy, auto x) { return gy * sigmoid_of(-x); },
            [](const Tensor& g, const Tensor& x) { return g * sigmoid(-x); })
// erf(x), gradient 2/sqrt(pi) exp(-x^2): the normal CDF Phi(x) = (1 + erf(x/sqrt(2))) / 2 in tensor ops.
TG_UNARY_OP(erf, "erf(x)", "x", unary_samples(erf, -2, 2), [](auto x) { return std::erf(x); }, false,
            [](auto gy, auto x) { return gy * decltype(x)(2 * std::numbers::inv_sqrtpi) * std::exp(-x * x); },
            [](const Tensor& g, const Tensor& x) { return g * (2 * std::numbers::inv_sqrtpi) * exp(-(x * x)); })
#undef TG_UNARY_OP

// ============================ gelu ============================
// exact: x * Phi(x), Phi the standard normal CDF; tanh approximation:
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as torch's approximate='tanh'.
namespace {
struct GeluAttrs {
  bool tanh_approximation;
};

// gelu'(x) and gelu''(x), elementwise. exact: Phi + x phi and phi (2 - x^2),
// phi the standard normal density. tanh: with u = k (x + c x^3), t = tanh(u),
// gelu' = (1 + t) / 2 + x (1 - t^2) u' / 2 and
// gelu'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2).
constexpr double kGeluK = std::numbers::sqrt2 * std::numbers::inv_sqrtpi, kGeluC = 0.044715;
template <class T> [[gnu::always_inline]] inline T gelu_slope_exact(T x) {
  const T cdf = T(0.5) * (T(1) + detail::verf(x * T(std::numbers::sqrt2 / 2)));
  return cdf + x * (detail::vexp(T(-0.5) * x * x) * T(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2));
}
template <class T> [[gnu::always_inline]] inline T gelu_slope_tanh(T x) {
  const T k = T(kGeluK), c = T(kGeluC), t = std::tanh(k * (x + c * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * k * (T(1) + T(3) * c * x * x);
}
template <class T> [[gnu::always_inline]] inline T gelu_curvature_exact(T x) {
  return detail::vexp(T(-0.5) * x * x) * T(0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2) * (T(2) - x * x);
}
template <class T> [[gnu::always_inline]] inline T gelu_curvature_tanh(T x) {
  const T k = T(kGeluK), c = T(kGeluC), t = std::tanh(k * (x + c * x * x * x));
  const T du = k * (T(1) + T(3) * c * x * x), ddu = T(6) * k * c * x;
  return (T(1) - t * t) * (du + T(0.5) * x * (ddu - T(2) * t * du * du));
}
}  // namespace

static void gelu_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(UnaryInputSaved::kX);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  if (grad_enabled()) {
    gin[0] = gelu_grad(g, x, tanh_approximation);
  } else if (!tanh_approximation) {
    gin[0] = fused_grad(g, x, [](auto gy, auto x) { return gy * gelu_slope_exact(x); });
  } else {
    gin[0] = fused_grad(g, x, [](auto gy, auto x) { return gy * gelu_slope_tanh(x); });
  }
}
// The output again from the saved input, for ops that save it by reference
// (a transformer MLP's proj then holds no copy of its (B,T,4C) input).
static Tensor gelu_recompute(const Node& n) {
  return gelu(n.saved_tensor(UnaryInputSaved::kX), n.attrs<GeluAttrs>().tanh_approximation);
}
static void gelu_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = gelu_grad(t[0], n.saved_tensor(UnaryInputSaved::kX), n.attrs<GeluAttrs>().tanh_approximation);
}
static const OpDef gelu_op("gelu", 1, "gelu(x, tanh_approximation=false)",
                           "x (the output is recomputed); attrs: tanh_approximation",
                           gelu_backward, gelu_tangent, [] {
  return std::vector<OpSample>{
      {"exact (3,4)", {uniform({3, 4}, 31, -3, 3)}, [](auto& x) { return gelu(x[0]); }},
      {"tanh (3,4)", {uniform({3, 4}, 32, -3, 3)}, [](auto& x) { return gelu(x[0], true); }},
      {"exact non-contiguous", {samples::strided({2, 3}, 33, -3, 3)}, [](auto& x) { return gelu(x[0]); }},
      {"tanh (3,4), squared: mul saves the output by reference", {uniform({3, 4}, 34, -3, 3)}, [](auto& x) {
         Tensor y = gelu(x[0], true);
         return y * y;
       }},
  };
}, gelu_recompute);
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  ProfileScope prof(gelu_op.name);
  Tensor out;
  if (!tanh_approximation) {
    out = unary(gelu_op.name, x, [](auto v) {
      using T = decltype(v);
      return T(0.5) * v * (T(1) + detail::verf(v * T(std::numbers::sqrt2 / 2)));
    });
  } else {
    out = unary(gelu_op.name, x, [](auto v) {
      using T = decltype(v);
      const T k = T(std::numbers::sqrt2 * std::numbers::inv_sqrtpi);
      return T(0.5) * v * (T(1) + std::tanh(k * (v + T(0.044715) * v * v * v)));
    });
  }
  if (Node* n = record(gelu_op, out, x)) {
    n->attrs<GeluAttrs>() = {.tanh_approximation = tanh_approximation};
    n->save(x);  // UnaryInputSaved::kX
  }
  return out;
}

// ============================ gelu_grad ============================
// g * gelu'(x): gelu's backward as an op of its own, so that a recorded
// backward through gelu is one node, not a dozen, and differentiates again
// through gelu''(x). Its own recorded backward takes gelu''(x) in tensor ops.
namespace {
struct GeluGradSaved {
  enum : size_t { kGrad, kX };
};
}  // namespace
// gelu''(x) in tensor ops (see gelu_curvature_exact / _tanh).
static Tensor gelu_curvature(const Tensor& x, bool tanh_approximation) {
  if (!tanh_approximation)
    return exp(x * x * -0.5) * (0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2) * (2.0 - x * x);
  const Tensor t = tanh((x + x * x * x * kGeluC) * kGeluK);
  const Tensor du = (x * x * (3 * kGeluC) + 1.0) * kGeluK;
  return (1.0 - t * t) * (du + x * 0.5 * (x * (6 * kGeluK * kGeluC) - t * du * du * 2.0));
}
static void gelu_grad_backward(const Node& n, const Tensor& gg, std::span<Tensor> gin) {
  const Tensor g = n.saved_tensor(GeluGradSaved::kGrad), x = n.saved_tensor(GeluGradSaved::kX);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  if (n.needs(0)) gin[0] = gelu_grad(gg, x, tanh_approximation);
  if (!n.needs(1)) return;
  if (!grad_enabled()) {
    const Tensor p = gg * g;
    gin[1] = tanh_approximation ? fused_grad(p, x, [](auto v, auto x) { return v * gelu_curvature_tanh(x); })
                                : fused_grad(p, x, [](auto v, auto x) { return v * gelu_curvature_exact(x); });
    return;
  }
  gin[1] = gg * g * gelu_curvature(x, tanh_approximation);
}
// d/d(g, x) of g * gelu'(x) along (tg, tx): gelu'(x) tg + g gelu''(x) tx.
static void gelu_grad_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Tensor x = n.saved_tensor(GeluGradSaved::kX);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  out[0] = tangent_add(
      t[0].defined() ? gelu_grad(t[0], x, tanh_approximation) : Tensor(),
      t[1].defined() ? t[1] * n.saved_tensor(GeluGradSaved::kGrad) * gelu_curvature(x, tanh_approximation) : Tensor());
}
static const OpDef gelu_grad_op("gelu_grad", 2, "gelu_grad(g, x, tanh_approximation=false) -> g * gelu'(x)",
                                "g, x; attrs: tanh_approximation", gelu_grad_backward, gelu_grad_tangent, [] {
  return std::vector<OpSample>{
      {"exact (3,4)", {uniform({3, 4}, 35), uniform({3, 4}, 36, -3, 3)},
       [](auto& x) { return gelu_grad(x[0], x[1]); }},
      {"tanh (3,4)", {uniform({3, 4}, 37), uniform({3, 4}, 38, -3, 3)},
       [](auto& x) { return gelu_grad(x[0], x[1], true); }},
      {"exact non-contiguous x", {uniform({2, 3}, 39), samples::strided({2, 3}, 40, -3, 3)},
       [](auto& x) { return gelu_grad(x[0], x[1]); }},
  };
});
Tensor gelu_grad(const Tensor& g, const Tensor& x, bool tanh_approximation) {
  ProfileScope prof(gelu_grad_op.name);
  detail::check_defined(gelu_grad_op.name, g, "g");
  detail::check_defined(gelu_grad_op.name, x, "x");
  if (!(g.shape() == x.shape()))
    throw ShapeError(fmt::format("gelu_grad: g {} and x {} must have the same shape", g.shape(), x.shape()));
  check_same_dtype(gelu_grad_op.name, g, x);
  Tensor out = empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), gelu_grad_op.name, [&](auto tag) {
    using scalar_t = decltype(tag);
    if (tanh_approximation)
      detail::map2<scalar_t, scalar_t, scalar_t>(out, g, x, [](auto gy, auto v) { return gy * gelu_slope_tanh(v); });
    else
      detail::map2<scalar_t, scalar_t, scalar_t>(out, g, x, [](auto gy, auto v) { return gy * gelu_slope_exact(v); });
  });
  if (Node* n = record(gelu_grad_op, out, g, x)) {
    n->attrs<GeluAttrs>() = {.tanh_approximation = tanh_approximation};
    n->save(g);  // GeluGradSaved::kGrad
    n->save(x);  // kX
  }
  return out;
}

// ============================ clamp ============================
namespace {
struct ClampAttrs {
  double low, high;
};
}  // namespace
static void clamp_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const double lo = n.attrs<ClampAttrs>().low, hi = n.attrs<ClampAttrs>().high;
  const Tensor x = n.saved_tensor(UnaryInputSaved::kX);
  // torch passes the gradient at the bounds
  if (grad_enabled()) {
    gin[0] = g * slope_of(x, [lo, hi](auto v) { return decltype(v)(v >= lo && v <= hi); });
    return;
  }
  gin[0] = fused_grad(g, x, [lo, hi](auto gy, auto x) { return (x >= lo && x <= hi) ? gy : decltype(gy)(0); });
}
// The slope is 1 inside [low, high], 0 outside: tangent and gradient alike.
static void clamp_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const double lo = n.attrs<ClampAttrs>().low, hi = n.attrs<ClampAttrs>().high;
  out[0] = t[0] * slope_of(n.saved_tensor(UnaryInputSaved::kX), [lo, hi](auto v) { return decltype(v)(v >= lo && v <= hi); });
}
static const OpDef clamp_op("clamp", 1, "clamp(x, low, high)", "x; attrs: low, high", clamp_backward, clamp_tangent, [] {
  return std::vector<OpSample>{{"(4,5) to [-0.55, 0.45]", {uniform({4, 5}, 34)},
                                [](auto& x) { return clamp(x[0], -0.55, 0.45); }}};
});
Tensor clamp(const Tensor& x, double low, double high) {
  ProfileScope prof(clamp_op.name);
  if (low > high) throw ValueError(fmt::format("{}: low {} is above high {}", clamp_op.name, low, high));
  Tensor out = unary(clamp_op.name, x, [low, high](auto v) {
    using T = decltype(v);
    return std::min(std::max(v, T(low)), T(high));
  });
  if (Node* n = record(clamp_op, out, x)) {
    n->attrs<ClampAttrs>() = {.low = low, .high = high};
    n->save(x);  // UnaryInputSaved::kX
  }
  return out;
}

// ============================ cast ============================
static void cast_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = cast(g, n.edges[0].dtype); }
static void cast_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = cast(t[0], n.out_dtype);
}
static const OpDef cast_op("cast", 1, "cast(x, dtype) / x.to(dtype)", "nothing", cast_backward, cast_tangent, [] {
  return std::vector<OpSample>{{"float64 -> float64 copy", {uniform({3}, 35)},
                                [](auto& x) { return cast(x[0], DType::f64); }}};
});
Tensor cast(const Tensor& x, DType dtype) {
  ProfileScope prof(cast_op.name);
  Tensor out = empty(x.shape(), dtype);
  TG_DISPATCH_ALL(dtype, "cast", [&] {
    using TO = scalar_t;
    TG_DISPATCH_ALL(x.dtype(), "cast", [&] {
      detail::map1<TO, scalar_t>(out, x, [](scalar_t v) { return static_cast<TO>(v); });
    });
  });
  if (is_floating(dtype) && is_floating(x.dtype())) record(cast_op, out, x);
  return out;
}

// ============================ where / masked_fill ============================
namespace {
Tensor mask_where(const Tensor& mask, const Tensor& a, const Tensor& b, const char* op) {
  check_same_dtype(op, a, b);
  Shape s = broadcast_shapes(broadcast_shapes(mask.shape(), a.shape(), op), b.shape(), op);
  Tensor out = empty(s, a.dtype());
  TG_DISPATCH_ALL(a.dtype(), op, [&] {
    using T = scalar_t;
    TG_DISPATCH_ALL(mask.dtype(), op, [&] {
      detail::map3<T, scalar_t, T, T>(out, mask, a, b, [](scalar_t m, T x, T y) { return m != 0 ? x : y; });
    });
  });
  return out;
}
}  // namespace

namespace {
// where, masked_fill: the mask (any dtype, nonzero = true).
struct MaskSaved {
  enum : size_t { kMask };
};
}  // namespace
static void where_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor mask = n.saved_tensor(MaskSaved::kMask);
  const Tensor zero = zeros({}, g.dtype());
  // Recorded, the selection is where itself: differentiable in g.
  auto select = [&](const Tensor& a, const Tensor& b) {
    return grad_enabled() ? where(mask, a, b) : mask_where(mask, a, b, "where");
  };
  if (n.needs(1)) gin[1] = sum_to(select(g, zero), n.edges[1].shape);
  if (n.needs(2)) gin[2] = sum_to(select(zero, g), n.edges[2].shape);
}
static void where_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  if (!t[1].defined() && !t[2].defined()) return;
  const Tensor zero = zeros({}, n.out_dtype);
  out[0] = broadcast_tangent(where(n.saved_tensor(MaskSaved::kMask), t[1].defined() ? t[1] : zero,
                                   t[2].defined() ? t[2] : zero),
                             n.out_shape);
}
static const OpDef where_op("where", 3, "where(mask, a, b) -> mask ? a : b, broadcasting", "mask", where_backward,
                            where_tangent, [] {
  auto fn = [](const std::vector<Tensor>& x) { return where(x[0], x[1], x[2]); };
  return std::vector<OpSample>{
      {"(3,4) mask", {samples::indices({3, 4}, 2, 41), uniform({3, 4}, 42), uniform({3, 4}, 43)}, fn},
      {"broadcast mask (4) a (3,1) b ()", {samples::indices({4}, 2, 44), uniform({3, 1}, 45), uniform({}, 46)}, fn},
  };
});
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  ProfileScope prof(where_op.name);
  Tensor out = mask_where(mask, a, b, "where");
  if (Node* n = record(where_op, out, mask, a, b)) n->save(mask);  // MaskSaved::kMask
  return out;
}

static void masked_fill_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  // g has x's shape (the mask broadcasts to it)
  const Tensor mask = n.saved_tensor(MaskSaved::kMask);
  gin[0] = grad_enabled() ? masked_fill(g, mask, 0.0) : mask_where(mask, zeros({}, g.dtype()), g, "masked_fill");
}
static void masked_fill_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = masked_fill(t[0], n.saved_tensor(MaskSaved::kMask), 0.0);
}
static const OpDef masked_fill_op("masked_fill", 1, "masked_fill(x, mask, value)", "mask", masked_fill_backward,
                                  masked_fill_tangent, [] {
  return std::vector<OpSample>{{"(3,4) with mask (4)", {uniform({3, 4}, 47)}, [](auto& x) {
                                  return masked_fill(x[0], samples::indices({4}, 2, 48), -1e9);
                                }}};
});
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  ProfileScope prof(masked_fill_op.name);
  if (!(broadcast_shapes(mask.shape(), x.shape(), "masked_fill") == x.shape()))
    throw ShapeError(fmt::format("masked_fill: mask of shape {} does not broadcast to {}", mask.shape(), x.shape()));
  Tensor out = mask_where(mask, full({}, value, x.dtype()), x, "masked_fill");
  if (Node* n = record(masked_fill_op, out, x)) n->save(mask);  // MaskSaved::kMask
  return out;
}

// ============================ comparisons (no gradient) ============================
#define TG_COMPARE(NAME, EXPR)                                                                       \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                                    \
    check_same_dtype(#NAME, a, b);                                                                   \
    Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), #NAME), DType::i64);                   \
    TG_DISPATCH_ALL(a.dtype(), #NAME, [&] {                                                          \
      detail::map2<int64_t, scalar_t, scalar_t>(out, a, b,                                           \
                                                [](scalar_t x, scalar_t y) { return int64_t(EXPR); }); \
    });                                                                                              \
    return out;                                                                                      \
  }
TG_COMPARE(eq, x == y)
TG_COMPARE(ne, x != y)
TG_COMPARE(lt, x < y)
TG_COMPARE(le, x <= y)
TG_COMPARE(gt, x > y)
TG_COMPARE(ge, x >= y)
#undef TG_COMPARE

}  // namespace tg
