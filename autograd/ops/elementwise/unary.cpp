// The unary elementwise ops, each of one saved tensor a line of TG_UNARY_OP,
// then neg, clamp and cast: forward and backward side by side, one OpDef
// each. gelu is in gelu.cpp.
#include "autograd/ops/elementwise.h"

#include <cmath>
#include <numbers>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise/common.h"
#include "autograd/ops/samples.h"
#include "autograd/profiler.h"

namespace tg {
using detail::elementwise::times_derivative;
namespace math = detail::math;
using detail::elementwise::unary;
using detail::elementwise::UnaryInputSaved;
using detail::elementwise::UnaryOutputSaved;

namespace {

using samples::uniform;
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
         t.copy_(samples::away_from_zero({2, 3}, 15));
         return t;
       }()}, fn},
  };
}

struct ClampAttrs {
  double low, high;
};
}  // namespace

// ============================ unary ============================
// Each unary op: OpDef, samples, forward FORWARD (of the element x) and its
// derivative d = DERIVATIVE (of S, saved by SAVED: x or the output y) written
// once (common.h: fused on a plain backward, tensor ops when recorded). The
// gradient g d and tangent t d alike: the Jacobian is diagonal (self_adjoint).
#define TG_UNARY_OP(NAME, SIGNATURE, SAVED, S, SAMPLES, FORWARD, DERIVATIVE)                      \
  static void NAME##_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {            \
    gin[0] = times_derivative(g, n.saved_tensor(&SAVED::S), [](auto S) { return DERIVATIVE; }); \
  }                                                                                               \
  static const OpDef NAME##_op({.name = #NAME, .arity = 1, .signature = SIGNATURE,                \
                                .saves = saves_of<SAVED>(), .backward = NAME##_backward,          \
                                .self_adjoint = true, .samples = [] { return SAMPLES; }});        \
  Tensor NAME(const Tensor& x) {                                                                  \
    ProfileScope prof(NAME##_op.name);                                                            \
    Tensor y = unary(NAME##_op.name, x, [](auto x) { return FORWARD; });                          \
    if (Node* n = record(NAME##_op, y, x)) n->save(SAVED{.S = S});                                \
    return y;                                                                                     \
  }

template <class T> T softplus_of(T x) { return std::max(x, T(0)) + std::log1p(std::exp(-std::abs(x))); }
using math::lit;

TG_UNARY_OP(exp, "exp(x)", UnaryOutputSaved, y, unary_samples(exp, -2, 2), math::exp(x), y)
TG_UNARY_OP(log, "log(x), x > 0", UnaryInputSaved, x, unary_samples(log, 0.2, 3), std::log(x), 1 / x)
TG_UNARY_OP(sqrt, "sqrt(x), x > 0", UnaryOutputSaved, y, unary_samples(sqrt, 0.2, 3), std::sqrt(x), 1 / (y + y))
TG_UNARY_OP(rsqrt, "rsqrt(x) -> 1/sqrt(x), x > 0", UnaryOutputSaved, y, unary_samples(rsqrt, 0.2, 3),
            decltype(x)(1) / std::sqrt(x), lit(y, -0.5) * y * y * y)
TG_UNARY_OP(abs, "abs(x)", UnaryInputSaved, x, kinked_unary_samples(abs), std::abs(x),
            math::step(x, [](auto v) { return (v > 0) - (v < 0); }))  // sign(x)
TG_UNARY_OP(tanh, "tanh(x)", UnaryOutputSaved, y, unary_samples(tanh, -2, 2), math::tanh(x), 1 - y * y)
TG_UNARY_OP(sigmoid, "sigmoid(x)", UnaryOutputSaved, y, unary_samples(sigmoid, -3, 3), math::sigmoid(x), y * (1 - y))
TG_UNARY_OP(relu, "relu(x) -> max(x, 0)", UnaryOutputSaved, y, kinked_unary_samples(relu), x > 0 ? x : decltype(x)(0),
            math::step(y, [](auto v) { return v > 0; }))
TG_UNARY_OP(softplus, "softplus(x) -> log(1 + exp(x))", UnaryInputSaved, x, unary_samples(softplus, -3, 3),
            softplus_of(x), math::sigmoid(x))
TG_UNARY_OP(log_sigmoid, "log_sigmoid(x) -> -softplus(-x)", UnaryInputSaved, x, unary_samples(log_sigmoid, -3, 3),
            -softplus_of(-x), math::sigmoid(-x))
// erf(x), derivative 2/sqrt(pi) exp(-x^2).
TG_UNARY_OP(erf, "erf(x)", UnaryInputSaved, x, unary_samples(erf, -2, 2), std::erf(x),
            lit(x, 2 * std::numbers::inv_sqrtpi) * math::exp(-(x * x)))
#undef TG_UNARY_OP

// neg saves nothing: its derivative is the constant -1.
static void neg_backward(const Node&, const Tensor& g, std::span<Tensor> gin) { gin[0] = neg(g); }
static const OpDef neg_op({.name = "neg", .arity = 1, .signature = "neg(x) -> -x", .saves = saves_of<NoSaved>(),
                           .backward = neg_backward, .self_adjoint = true,
                           .samples = [] { return unary_samples(neg, -1, 1); }});
Tensor neg(const Tensor& x) {
  ProfileScope prof(neg_op.name);
  Tensor out = unary(neg_op.name, x, [](auto v) { return -v; });
  record(neg_op, out, x);
  return out;
}
// ============================ clamp ============================
// The slope is 1 inside [low, high] (torch passes the gradient at the
// bounds), 0 outside: gradient and tangent alike.
static void clamp_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const auto inside = [a = n.attrs<ClampAttrs>()](auto v) { return v >= a.low && v <= a.high; };
  gin[0] = times_derivative(g, n.saved_tensor(&UnaryInputSaved::x), [inside](auto x) { return math::step(x, inside); });
}
static const OpDef clamp_op({
    .name = "clamp",
    .arity = 1,
    .signature = "clamp(x, low, high)",
    .saves = saves_of<UnaryInputSaved>(),
    .backward = clamp_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"(4,5) to [-0.55, 0.45]", {uniform({4, 5}, 34)}, [](auto& x) { return clamp(x[0], -0.55, 0.45); }}};
    },
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
    n->save(UnaryInputSaved{.x = x});
  }
  return out;
}

// ============================ cast ============================
static void cast_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = cast(g, n.edges[0].dtype); }
static void cast_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = cast(t[0], n.out_dtype);
}
static const OpDef cast_op({
    .name = "cast",
    .arity = 1,
    .signature = "cast(x, dtype) / x.to(dtype)",
    .saves = saves_of<NoSaved>(),
    .backward = cast_backward,
    .tangent = cast_tangent,
    .samples = [] {
      return std::vector<OpSample>{
          {"float64 -> float64 copy", {uniform({3}, 35)}, [](auto& x) { return cast(x[0], DType::f64); }}};
    },
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

}  // namespace tg
