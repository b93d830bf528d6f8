// The binary elementwise ops, broadcasting (add, sub, mul, div, pow, minimum,
// maximum), and those with a scalar (add, mul, pow, rsub, rdiv): forward and
// backward side by side, one OpDef each.
#include "autograd/ops/elementwise.h"

#include <cmath>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise/common.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/profiler.h"

namespace tg {
using detail::broadcast_tangent;
using detail::check_same_dtype;
using detail::scaled_tangent;
using detail::tangent_add;
using detail::elementwise::times_derivative;
using detail::math::lit;
using detail::elementwise::unary;
using detail::elementwise::UnaryInputSaved;

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
    TG_DISPATCH_ARITH(a.dtype(), op, [&] { detail::map2<scalar_t, scalar_t, scalar_t>(out, a, b, f); });
  }
  return out;
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

}  // namespace

// ============================ add / sub ============================
static void add_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(g, n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(g, n.edges[1].shape);
}
static void add_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(t[0], t[1]), n.out_shape);
}
static const OpDef add_op({.name = "add", .arity = 2, .signature = "add(a, b) -> a + b, broadcasting",
                           .saves = saves_of<NoSaved>(), .backward = add_backward, .tangent = add_tangent,
                           .samples = [] { return binary_samples(add, -1, 1); }});
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
static const OpDef sub_op({.name = "sub", .arity = 2, .signature = "sub(a, b) -> a - b, broadcasting",
                           .saves = saves_of<NoSaved>(), .backward = sub_backward, .tangent = sub_tangent,
                           .samples = [] { return binary_samples(sub, -1, 1); }});
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
  Tensor a, b;
  static constexpr std::tuple fields{saved_field("a", &BinarySaved::a), saved_field("b", &BinarySaved::b)};
};
// div, pow: both operands and the output.
struct BinaryOutputSaved {
  Tensor a, b, output;
  static constexpr std::tuple fields{
      saved_field("a", &BinaryOutputSaved::a), saved_field("b", &BinaryOutputSaved::b),
      saved_field("output", &BinaryOutputSaved::output)};
};
}  // namespace

static void mul_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(mul(g, n.saved_tensor(&BinarySaved::b)), n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(mul(g, n.saved_tensor(&BinarySaved::a)), n.edges[1].shape);
}
// ta b + a tb, broadcast to the output's shape.
static void mul_tangent_recorded(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(scaled_tangent(t[0], n.saved_tensor(&BinarySaved::b)),
                                         scaled_tangent(t[1], n.saved_tensor(&BinarySaved::a))),
                             n.out_shape);
}
// Not recorded, with both tangents: into one buffer of the output's shape,
// without the two products as temporaries (forward over reverse runs this for
// every product of a backward).
static void mul_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  if (t[0].defined() && t[1].defined()) {
    const Tensor a = n.saved_tensor(&BinarySaved::a), b = n.saved_tensor(&BinarySaved::b);
    Tensor r = empty(n.out_shape, n.out_dtype);
    dispatch_float(n.out_dtype, n.op->name, [&](auto tag) {
      using S = decltype(tag);
      detail::map2<S, S, S>(r, t[0], b, [](auto x, auto y) { return x * y; });
      detail::map3<S, S, S, S>(r, r, a, t[1], [](auto acc, auto x, auto y) { return acc + x * y; });
    });
    out[0] = r;
    return;
  }
  mul_tangent_recorded(n, t, out);
}
static const OpDef mul_op({.name = "mul", .arity = 2, .signature = "mul(a, b) -> a * b, broadcasting",
                           .saves = saves_of<BinarySaved>(), .backward = mul_backward, .tangent = mul_tangent,
                           .recorded_tangent = mul_tangent_recorded,
                           .samples = [] { return binary_samples(mul, -1, 1); }});
Tensor mul(const Tensor& a, const Tensor& b) {
  ProfileScope prof(mul_op.name);
  Tensor out = binary("mul", a, b, [](auto x, auto y) { return x * y; });
  if (Node* n = record(mul_op, out, a, b)) {
    n->save(BinarySaved{.a = a, .b = b});
  }
  return out;
}

static void div_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor b = n.saved_tensor(&BinaryOutputSaved::b);
  if (n.needs(0)) gin[0] = sum_to(div(g, b), n.edges[0].shape);
  if (n.needs(1))  // -g * out / b
    gin[1] = sum_to(neg(div(mul(g, n.saved_tensor(&BinaryOutputSaved::output)), b)), n.edges[1].shape);
}
static void div_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  // (ta - out * tb) / b
  const Tensor tb = t[1].defined() ? neg(mul(n.saved_tensor(&BinaryOutputSaved::output), t[1])) : Tensor();
  const Tensor num = tangent_add(t[0], tb);
  out[0] = broadcast_tangent(num.defined() ? div(num, n.saved_tensor(&BinaryOutputSaved::b)) : Tensor(), n.out_shape);
}
static const OpDef div_op({.name = "div", .arity = 2, .signature = "div(a, b) -> a / b, broadcasting",
                           .saves = saves_of<BinaryOutputSaved>(), .backward = div_backward, .tangent = div_tangent,
                           .samples = [] { return binary_samples(div, 0.5, 2); }});
Tensor div(const Tensor& a, const Tensor& b) {
  ProfileScope prof(div_op.name);
  Tensor out = binary("div", a, b, [](auto x, auto y) { return x / y; });
  if (Node* n = record(div_op, out, a, b)) {
    n->save(BinaryOutputSaved{.a = a, .b = b, .output = out});
  }
  return out;
}

// ============================ pow ============================
// The partial derivatives of a ** b, in tensor ops: b a^(b-1), 0 where b == 0
// (a ** 0 is constant, also at a = 0 where b a^(b-1) is 0 * inf); and
// a^b log a, 0 where a == 0 (its limit for b > 0, and torch's value at 0 ** 0,
// where 0 * log 0 would be NaN). log reads a with its zeros replaced by 1, and
// the unused branch of the first reads b with its zeros replaced by 1 (a^0 is
// finite at a = 0, where a^-1 is not), so that the zero gradient where() sends
// into an unused branch meets no infinity: no NaN reaches the gradient of a
// derivative either.
static Tensor pow_slope_base(const Node& n) {
  const Tensor a = n.saved_tensor(&BinaryOutputSaved::a), b = n.saved_tensor(&BinaryOutputSaved::b);
  const Tensor zero = zeros({}, b.dtype()), b_zero = eq(b, zero);
  return where(b_zero, zero, mul(b, pow(a, add(where(b_zero, ones({}, b.dtype()), b), -1.0))));
}
static Tensor pow_slope_exponent(const Node& n) {
  const Tensor a = n.saved_tensor(&BinaryOutputSaved::a);
  const Tensor a_zero = eq(a, zeros({}, a.dtype()));
  return mul(n.saved_tensor(&BinaryOutputSaved::output), log(where(a_zero, ones({}, a.dtype()), a)));
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
static const OpDef pow_op({
    .name = "pow",
    .arity = 2,
    .signature = "pow(a, b) -> a ** b, broadcasting (a > 0 for non-integer b)",
    .saves = saves_of<BinaryOutputSaved>(),
    .backward = pow_backward,
    .tangent = pow_tangent,
    .samples = [] {
      std::vector<OpSample> s = binary_samples(pow, 0.5, 2);
      // A learnable exponent over a constant base with a zero: d/db there is 0
      // (0 * log 0 would be NaN). The base is constant: finite differences would
      // step it below 0, where a^b log a is undefined.
      Tensor b = from_vector(std::vector<double>{2.0}, Shape{});
      b.requires_grad_();
      s.push_back({"a (3) with a 0, learnable b () = 2",
                   {from_vector(std::vector<double>{0.0, 0.5, 2.0}, {3}), b}, [](auto& x) { return pow(x[0], x[1]); }});
      return s;
    },
});
Tensor pow(const Tensor& a, const Tensor& b) {
  ProfileScope prof(pow_op.name);
  Tensor out = binary("pow", a, b, [](auto x, auto y) { return std::pow(x, y); }, true);
  if (Node* n = record(pow_op, out, a, b)) {
    n->save(BinaryOutputSaved{.a = a, .b = b, .output = out});
  }
  return out;
}

// ============================ minimum / maximum ============================
// Where a == b the gradient is split in half, as PyTorch does.
// The weight of a in the result (1, 0, or 0.5 on ties); b's is 1 - it.
template <bool Max>
static Tensor minmax_weight(const Node& n) {
  const Tensor a = n.saved_tensor(&BinarySaved::a), b = n.saved_tensor(&BinarySaved::b);
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
static const OpDef minimum_op({.name = "minimum", .arity = 2, .signature = "minimum(a, b), broadcasting",
                               .saves = saves_of<BinarySaved>(), .backward = minmax_backward<false>,
                               .tangent = minmax_tangent<false>,
                               .samples = [] { return binary_samples(minimum, -1, 1); }});
static const OpDef maximum_op({.name = "maximum", .arity = 2, .signature = "maximum(a, b), broadcasting",
                               .saves = saves_of<BinarySaved>(), .backward = minmax_backward<true>,
                               .tangent = minmax_tangent<true>,
                               .samples = [] { return binary_samples(maximum, -1, 1); }});
Tensor minimum(const Tensor& a, const Tensor& b) {
  ProfileScope prof(minimum_op.name);
  Tensor out = binary("minimum", a, b, [](auto x, auto y) { return y < x ? y : x; });
  if (Node* n = record(minimum_op, out, a, b)) n->save(BinarySaved{.a = a, .b = b});
  return out;
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  ProfileScope prof(maximum_op.name);
  Tensor out = binary("maximum", a, b, [](auto x, auto y) { return y > x ? y : x; });
  if (Node* n = record(maximum_op, out, a, b)) n->save(BinarySaved{.a = a, .b = b});
  return out;
}

// ============================ with a scalar ============================
static void add_scalar_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = g; }
static const OpDef add_scalar_op({
    .name = "add_scalar",
    .arity = 1,
    .signature = "add(a, c) -> a + c",
    .saves = saves_of<NoSaved>(),
    .backward = add_scalar_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{{"(3,4) + 0.5", {uniform({3, 4}, 21)}, [](auto& x) { return add(x[0], 0.5); }}};
    },
});
Tensor add(const Tensor& a, double c) {
  ProfileScope prof(add_scalar_op.name);
  Tensor out;
  TG_DISPATCH_ARITH(a.dtype(), "add", [&] {
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
static const OpDef mul_scalar_op({
    .name = "mul_scalar",
    .arity = 1,
    .signature = "mul(a, c) -> a * c",
    .saves = saves_of<NoSaved>(),
    .backward = mul_scalar_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{{"(3,4) * -1.5", {uniform({3, 4}, 22)}, [](auto& x) { return mul(x[0], -1.5); }}};
    },
});
Tensor mul(const Tensor& a, double c) {
  ProfileScope prof(mul_scalar_op.name);
  Tensor out;
  TG_DISPATCH_ARITH(a.dtype(), "mul", [&] {
    out = empty(a.shape(), a.dtype());
    const scalar_t v = static_cast<scalar_t>(c);
    detail::map1<scalar_t, scalar_t>(out, a, [v](scalar_t x) { return x * v; });
  });
  if (Node* n = record(mul_scalar_op, out, a)) n->attrs<ScalarAttrs>() = {.c = c};
  return out;
}
static void pow_scalar_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const double c = n.attrs<ScalarAttrs>().c;
  // x ** 0 is constant: no gradient, also at x = 0 where c x^(c-1) is 0 * inf
  // (reached by differentiating x ** 2 three times).
  if (c == 0.0) {
    gin[0] = mul(g, 0.0);
    return;
  }
  gin[0] = times_derivative(g, n.saved_tensor(&UnaryInputSaved::x),
                            [c](auto x) { return lit(x, c) * detail::math::pow(x, lit(x, c - 1)); });
}
static const OpDef pow_scalar_op({
    .name = "pow_scalar",
    .arity = 1,
    .signature = "pow(a, c) -> a ** c",
    .saves = saves_of<UnaryInputSaved>(),
    .backward = pow_scalar_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"(3,4) ** 3", {uniform({3, 4}, 23)}, [](auto& x) { return pow(x[0], 3.0); }},
          {"(3,4) ** -0.5, positive", {uniform({3, 4}, 24, 0.5, 2)}, [](auto& x) { return pow(x[0], -0.5); }},
      };
    },
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
    n->save(UnaryInputSaved{.x = a});
  }
  return out;
}

static void rsub_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = neg(g); }
static const OpDef rsub_op({
    .name = "rsub",
    .arity = 1,
    .signature = "rsub(c, b) -> c - b",
    .saves = saves_of<NoSaved>(),
    .backward = rsub_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{{"2 - (3,4)", {uniform({3, 4}, 25)}, [](auto& x) { return rsub(2.0, x[0]); }}};
    },
});
Tensor rsub(double c, const Tensor& b) {
  ProfileScope prof(rsub_op.name);
  Tensor out;
  TG_DISPATCH_ARITH(b.dtype(), "rsub", [&] {
    out = empty(b.shape(), b.dtype());
    const scalar_t v = static_cast<scalar_t>(c);
    detail::map1<scalar_t, scalar_t>(out, b, [v](scalar_t x) { return v - x; });
  });
  record(rsub_op, out, b);
  return out;
}

namespace {
struct RdivSaved {
  Tensor b, output;
  static constexpr std::tuple fields{saved_field("b", &RdivSaved::b), saved_field("output", &RdivSaved::output)};
};
}  // namespace
static void rdiv_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  // d(c/b)/db = -c/b^2 = -out/b
  const Tensor ratio = div(n.saved_tensor(&RdivSaved::output), n.saved_tensor(&RdivSaved::b));
  gin[0] = times_derivative(g, ratio, [](auto r) { return -r; });
}
static const OpDef rdiv_op({
    .name = "rdiv",
    .arity = 1,
    .signature = "rdiv(c, b) -> c / b",
    .saves = saves_of<RdivSaved>(),
    .backward = rdiv_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{{"3 / (3,4)", {uniform({3, 4}, 26, 0.5, 2)}, [](auto& x) { return rdiv(3.0, x[0]); }}};
    },
});
Tensor rdiv(double c, const Tensor& b) {
  ProfileScope prof(rdiv_op.name);
  Tensor out = unary("rdiv", b, [c](auto x) { return static_cast<decltype(x)>(c) / x; });
  if (Node* n = record(rdiv_op, out, b)) n->save(RdivSaved{.b = b, .output = out});
  return out;
}

}  // namespace tg
