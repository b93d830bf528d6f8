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
using detail::tangent_add;
using detail::elementwise::times_derivative;
using detail::math::lit;
using detail::elementwise::UnaryInputSaved;

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

// out = f(a, b) over the broadcast shape, f generic in the element type;
// recorded as op, which saves S (NoSaved, BinarySaved or BinaryOutputSaved).
template <class S, class F>
Tensor binary(const OpDef& op, const Tensor& a, const Tensor& b, F f, bool floating_only = false) {
  ProfileScope prof(op.name);
  detail::check_same_dtype(op.name, a, b);
  Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), op.name.data()), a.dtype());
  auto run = [&]<class T>(T) { detail::map2<T, T, T>(out, a, b, f); };
  if (floating_only)
    dispatch_float(a.dtype(), op.name, run);
  else
    TG_DISPATCH_ARITH(a.dtype(), op.name, [&] { run(scalar_t{}); });
  if (Node* n = record(op, out, a, b)) {
    if constexpr (std::is_same_v<S, BinarySaved>) n->save(S{.a = a, .b = b});
    if constexpr (std::is_same_v<S, BinaryOutputSaved>) n->save(S{.a = a, .b = b, .output = out});
  }
  return out;
}

using samples::uniform;
std::vector<OpSample> binary_samples(Tensor (*op)(const Tensor&, const Tensor&), double low, double high) {
  auto fn = [op](const std::vector<Tensor>& x) { return op(x[0], x[1]); };
  auto u = [=](const Shape& s, uint64_t seed) { return uniform(s, seed, low, high); };
  return {
      {"same shape (3,4)", {u({3, 4}, 1), u({3, 4}, 2)}, fn},
      {"broadcast (2,1,3) with (4,1)", {u({2, 1, 3}, 3), u({4, 1}, 4)}, fn},
      {"row broadcast (3,4) with (4)", {u({3, 4}, 5), u({4}, 6)}, fn},
      {"scalar () with (5)", {u({}, 7), u({5}, 8)}, fn},
      {"non-contiguous (2,3)", {samples::strided({2, 3}, 9, low, high), u({2, 3}, 10)}, fn},
  };
}

// The scalar ops' constant c.
struct ScalarAttrs {
  double c;
};
// f(a, c) elementwise, c in a's dtype, recorded as op with c (errors name
// `name`); S = UnaryInputSaved: a float a only, saved (pow, rdiv).
template <class S, class F>
Tensor with_scalar(const OpDef& op, const char* name, const Tensor& a, double c, F f) {
  ProfileScope prof(op.name);
  Tensor out;
  auto run = [&]<class T>(T) {
    out = empty(a.shape(), a.dtype());
    detail::map1<T, T>(out, a, [v = static_cast<T>(c), f](T x) { return f(x, v); });
  };
  if constexpr (std::is_same_v<S, NoSaved>) {
    TG_DISPATCH_ARITH(a.dtype(), name, [&] { run(scalar_t{}); });
  } else {
    detail::check_defined(name, a, "tensor");
    dispatch_float(a.dtype(), name, run);
  }
  if (Node* n = record(op, out, a)) {
    n->attrs<ScalarAttrs>() = {.c = c};
    if constexpr (!std::is_same_v<S, NoSaved>) n->save(S{.x = a});
  }
  return out;
}
}  // namespace

// Each broadcasting op but pow: OpDef (rules in __VA_ARGS__, samples in
// [LOW, HIGH)) and forward, EXPR of the elements x and y.
#define TG_BINARY_OP(NAME, SIGNATURE, SAVED, LOW, HIGH, EXPR, ...)                                  \
  static const OpDef NAME##_op({.name = #NAME, .arity = 2, .signature = SIGNATURE ", broadcasting", \
                                .saves = saves_of<SAVED>(), __VA_ARGS__,                            \
                                .samples = [] { return binary_samples(NAME, LOW, HIGH); }});        \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                                   \
    return binary<SAVED>(NAME##_op, a, b, [](auto x, auto y) { return EXPR; });                     \
  }

// ============================ add / sub ============================
// Sub: b's gradient and tangent are negated.
template <bool Sub>
static void add_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(g, n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(Sub ? neg(g) : g, n.edges[1].shape);
}
template <bool Sub>
static void add_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = broadcast_tangent(tangent_add(t[0], Sub && t[1].defined() ? neg(t[1]) : t[1]), n.out_shape);
}
TG_BINARY_OP(add, "add(a, b) -> a + b", NoSaved, -1, 1, x + y, .backward = add_backward<false>,
             .tangent = add_tangent<false>)
TG_BINARY_OP(sub, "sub(a, b) -> a - b", NoSaved, -1, 1, x - y, .backward = add_backward<true>,
             .tangent = add_tangent<true>)

// ============================ mul / div ============================
static void mul_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = sum_to(mul(g, n.saved_tensor(&BinarySaved::b)), n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(mul(g, n.saved_tensor(&BinarySaved::a)), n.edges[1].shape);
}
// ta b + a tb, broadcast to the output's shape.
static void mul_tangent_recorded(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Tensor ta = t[0].defined() ? mul(t[0], n.saved_tensor(&BinarySaved::b)) : Tensor();
  out[0] = broadcast_tangent(tangent_add(ta, t[1].defined() ? mul(t[1], n.saved_tensor(&BinarySaved::a)) : Tensor()),
                             n.out_shape);
}
// Not recorded, with both tangents: one pass, no temporaries (forward over
// reverse runs this for every product of a backward).
static void mul_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  if (!t[0].defined() || !t[1].defined()) return mul_tangent_recorded(n, t, out);
  const Tensor a = n.saved_tensor(&BinarySaved::a), b = n.saved_tensor(&BinarySaved::b);
  out[0] = empty(n.out_shape, n.out_dtype);
  dispatch_float(n.out_dtype, n.op->name, [&]<class S>(S) {
    detail::map_n<S, S, S, S, S>(out[0], [](S ta, S y, S x, S tb) { return ta * y + x * tb; }, t[0], b, a, t[1]);
  });
}
TG_BINARY_OP(mul, "mul(a, b) -> a * b", BinarySaved, -1, 1, x * y, .backward = mul_backward,
             .tangent = mul_tangent, .recorded_tangent = mul_tangent_recorded)

// The tangents of div, pow, minimum and maximum: derived from the backward.
static void div_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor b = n.saved_tensor(&BinaryOutputSaved::b);
  if (n.needs(0)) gin[0] = sum_to(div(g, b), n.edges[0].shape);
  if (n.needs(1))  // -g * out / b
    gin[1] = sum_to(neg(div(mul(g, n.saved_tensor(&BinaryOutputSaved::output)), b)), n.edges[1].shape);
}
TG_BINARY_OP(div, "div(a, b) -> a / b", BinaryOutputSaved, 0.5, 2, x / y, .backward = div_backward)

// ============================ pow ============================
// The partials of a ** b, in tensor ops: b a^(b-1), 0 where b == 0 (a ** 0 is
// constant, also at a = 0 where it is 0 * inf); a^b log a, 0 where a == 0 (its
// limit for b > 0, torch's value at 0 ** 0). log reads a, and the unused branch
// of the first b, with zeros replaced by 1, so the zero gradient where() sends
// into an unused branch meets no infinity: no NaN in a higher derivative.
static void pow_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor a = n.saved_tensor(&BinaryOutputSaved::a), b = n.saved_tensor(&BinaryOutputSaved::b);
  const Tensor zero = zeros({}, b.dtype()), one = ones({}, b.dtype()), b_zero = eq(b, zero), a_zero = eq(a, zero);
  if (n.needs(0))
    gin[0] = sum_to(mul(g, where(b_zero, zero, mul(b, pow(a, add(where(b_zero, one, b), -1.0))))), n.edges[0].shape);
  if (n.needs(1))
    gin[1] = sum_to(mul(g, mul(n.saved_tensor(&BinaryOutputSaved::output), log(where(a_zero, one, a)))),
                    n.edges[1].shape);
}
static const OpDef pow_op({
    .name = "pow",
    .arity = 2,
    .signature = "pow(a, b) -> a ** b, broadcasting (a > 0 for non-integer b)",
    .saves = saves_of<BinaryOutputSaved>(),
    .backward = pow_backward,
    .samples = [] {
      std::vector<OpSample> s = binary_samples(pow, 0.5, 2);
      // A learnable exponent over a constant base with a zero: d/db there is 0, not
      // NaN; a varying base would step below 0, where a^b log a is undefined.
      Tensor b = from_vector(std::vector<double>{2.0}, Shape{});
      b.requires_grad_();
      s.push_back({"a (3) with a 0, learnable b () = 2",
                   {from_vector(std::vector<double>{0.0, 0.5, 2.0}, {3}), b}, [](auto& x) { return pow(x[0], x[1]); }});
      return s;
    },
});
Tensor pow(const Tensor& a, const Tensor& b) {
  return binary<BinaryOutputSaved>(pow_op, a, b, [](auto x, auto y) { return std::pow(x, y); }, true);
}

// ============================ minimum / maximum ============================
// Where a == b the gradient is split in half, as PyTorch does: a's weight in
// the result is 1, 0, or 0.5 on ties; b's is 1 - it.
template <bool Max>
static void minmax_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor a = n.saved_tensor(&BinarySaved::a), b = n.saved_tensor(&BinarySaved::b);
  Tensor wa = empty(broadcast_shapes(a.shape(), b.shape(), n.op->name.data()), a.dtype());
  dispatch_float(a.dtype(), n.op->name, [&]<class T>(T) {
    detail::map2<T, T, T>(wa, a, b, [](T x, T y) { return x == y ? T(0.5) : T(Max ? x > y : x < y); });
  });
  if (n.needs(0)) gin[0] = sum_to(mul(g, wa), n.edges[0].shape);
  if (n.needs(1)) gin[1] = sum_to(mul(g, rsub(1.0, wa)), n.edges[1].shape);
}
TG_BINARY_OP(minimum, "minimum(a, b)", BinarySaved, -1, 1, y < x ? y : x, .backward = minmax_backward<false>)
TG_BINARY_OP(maximum, "maximum(a, b)", BinarySaved, -1, 1, y > x ? y : x, .backward = minmax_backward<true>)
#undef TG_BINARY_OP

// ============================ with a scalar ============================
// The ops of a tensor and a constant: one input, a diagonal Jacobian (self_adjoint).
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
  return with_scalar<NoSaved>(add_scalar_op, "add", a, c, [](auto x, auto v) { return x + v; });
}

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
  return with_scalar<NoSaved>(mul_scalar_op, "mul", a, c, [](auto x, auto v) { return x * v; });
}

static void pow_scalar_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const double c = n.attrs<ScalarAttrs>().c;
  // x ** 0 is constant: no gradient, also at x = 0 where c x^(c-1) is 0 * inf
  // (reached by differentiating x ** 2 three times).
  gin[0] = c == 0.0 ? mul(g, 0.0)
                    : times_derivative(g, n.saved_tensor(&UnaryInputSaved::x),
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
  if (c == 2.0) return with_scalar<UnaryInputSaved>(pow_scalar_op, "pow", a, c, [](auto x, auto) { return x * x; });
  return with_scalar<UnaryInputSaved>(pow_scalar_op, "pow", a, c, [](auto x, auto v) { return std::pow(x, v); });
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
  return with_scalar<NoSaved>(rsub_op, "rsub", b, c, [](auto x, auto v) { return v - x; });
}

static void rdiv_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const double c = n.attrs<ScalarAttrs>().c;  // d(c/x)/dx = -c/x^2
  gin[0] = times_derivative(g, n.saved_tensor(&UnaryInputSaved::x), [c](auto x) { return lit(x, -c) / (x * x); });
}
static const OpDef rdiv_op({
    .name = "rdiv",
    .arity = 1,
    .signature = "rdiv(c, b) -> c / b",
    .saves = saves_of<UnaryInputSaved>(),
    .backward = rdiv_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"3 / (3,4)", {uniform({3, 4}, 26, 0.5, 2)}, [](auto& x) { return rdiv(3.0, x[0]); }}};
    },
});
Tensor rdiv(double c, const Tensor& b) {
  return with_scalar<UnaryInputSaved>(rdiv_op, "rdiv", b, c, [](auto x, auto v) { return v / x; });
}

}  // namespace tg
