// gelu and gelu_grad (its backward as an op of its own): forward and backward
// side by side, one OpDef each.
#include "autograd/ops/elementwise.h"

#include <cmath>
#include <numbers>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise/common.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_same_dtype;
using detail::tangent_add;
using detail::tangent_or_zeros;
using detail::elementwise::fused_grad;
using detail::elementwise::unary;
using detail::elementwise::UnaryInputSaved;
using samples::uniform;

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
constexpr double kNormalDensity = 0.5 * std::numbers::inv_sqrtpi * std::numbers::sqrt2;  // phi(0)
// Each written once over `auto` (pointwise.h): on floats in the fused
// kernels, on tensors in the recorded forms.
using detail::math::lit;
constexpr auto gelu_slope_exact = [](auto x) {
  const auto cdf = lit(x, 0.5) * (1 + detail::math::erf(x * lit(x, std::numbers::sqrt2 / 2)));
  return cdf + x * (detail::math::exp(lit(x, -0.5) * x * x) * lit(x, kNormalDensity));
};
constexpr auto gelu_slope_tanh = [](auto x) {
  const auto t = detail::math::tanh(lit(x, kGeluK) * (x + lit(x, kGeluC) * x * x * x));
  return lit(x, 0.5) * (1 + t) + lit(x, 0.5) * x * (1 - t * t) * lit(x, kGeluK) * (1 + lit(x, 3 * kGeluC) * x * x);
};
constexpr auto gelu_curvature_exact = [](auto x) {
  return detail::math::exp(lit(x, -0.5) * x * x) * lit(x, kNormalDensity) * (2 - x * x);
};
constexpr auto gelu_curvature_tanh = [](auto x) {
  const auto t = detail::math::tanh(lit(x, kGeluK) * (x + lit(x, kGeluC) * x * x * x));
  const auto du = lit(x, kGeluK) * (1 + lit(x, 3 * kGeluC) * x * x), ddu = lit(x, 6 * kGeluK * kGeluC) * x;
  return (1 - t * t) * (du + lit(x, 0.5) * x * (ddu - 2 * t * du * du));
};
}  // namespace

// Forward over reverse (OpSpec::backward_with_tangents): the gradient
// g gelu'(x) and its tangent tg gelu'(x) + g gelu''(x) tx in one pass. A
// missing tangent is taken as zeros.
template <bool kTanh, class S>
static void gelu_grad_with_tangent(int64_t n, const S* x, const S* g, const S* tx, const S* tg, S* dx, S* tdx) {
  parallel_for(n, detail::kElementwiseGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const S slope = kTanh ? gelu_slope_tanh(x[i]) : gelu_slope_exact(x[i]);
      const S curvature = kTanh ? gelu_curvature_tanh(x[i]) : gelu_curvature_exact(x[i]);
      dx[i] = g[i] * slope;
      tdx[i] = tg[i] * slope + g[i] * curvature * tx[i];
    }
  });
}
static bool gelu_backward_tangents(const Node& n, const Tensor& g, std::span<Tensor> gin,
                                   std::span<Tensor> gin_tangents) {
  const Tensor x = n.saved_tensor(&UnaryInputSaved::x);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  const Tensor xc = x.contiguous(), gc = g.contiguous(), tx = tangent_or_zeros(x), tg = tangent_or_zeros(g);
  Tensor dx = empty(x.shape(), x.dtype()), tdx = empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), "gelu", [&](auto tag) {
    using S = decltype(tag);
    auto run = tanh_approximation ? gelu_grad_with_tangent<true, S> : gelu_grad_with_tangent<false, S>;
    run(x.numel(), xc.data<S>(), gc.data<S>(), tx.data<S>(), tg.data<S>(), dx.data<S>(), tdx.data<S>());
  });
  gin[0] = dx;
  gin_tangents[0] = tdx;
  return true;
}

// Plain: into the incoming gradient's buffer where nothing else holds it
// (fused_grad), which the op gelu_grad, a public op, cannot do; recorded:
// gelu_grad, which differentiates again.
static void gelu_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(&UnaryInputSaved::x);
  gin[0] = n.attrs<GeluAttrs>().tanh_approximation
               ? fused_grad(g, x, [](auto gy, auto v) { return gy * gelu_slope_tanh(v); })
               : fused_grad(g, x, [](auto gy, auto v) { return gy * gelu_slope_exact(v); });
}
static void gelu_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = gelu_grad(g, n.saved_tensor(&UnaryInputSaved::x), n.attrs<GeluAttrs>().tanh_approximation);
}
// The output again from the saved input, for ops that save it by reference
// (a transformer MLP's proj then holds no copy of its (B,T,4C) input).
static Tensor gelu_recompute(const Node& n) {
  return gelu(n.saved_tensor(&UnaryInputSaved::x), n.attrs<GeluAttrs>().tanh_approximation);
}
static const OpDef gelu_op({
    .name = "gelu",
    .arity = 1,
    .signature = "gelu(x, tanh_approximation=false)",
    .saves = saves_of<UnaryInputSaved>(),
    .backward = gelu_backward,
    .recorded_backward = gelu_backward_recorded,
    .backward_with_tangents = gelu_backward_tangents,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"exact (3,4)", {uniform({3, 4}, 31, -3, 3)}, [](auto& x) { return gelu(x[0]); }},
          {"tanh (3,4)", {uniform({3, 4}, 32, -3, 3)}, [](auto& x) { return gelu(x[0], true); }},
          {"exact non-contiguous", {samples::strided({2, 3}, 33, -3, 3)}, [](auto& x) { return gelu(x[0]); }},
          {"tanh (3,4), squared: mul saves the output by reference", {uniform({3, 4}, 34, -3, 3)}, [](auto& x) {
             Tensor y = gelu(x[0], true);
             return y * y;
           }},
      };
    },
    .recompute = gelu_recompute,
});
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
    n->save(UnaryInputSaved{.x = x});
  }
  return out;
}

// ============================ gelu_grad ============================
// g * gelu'(x): gelu's backward as an op of its own, so that a recorded
// backward through gelu is one node, not a dozen, and differentiates again
// through gelu''(x). Its own recorded backward takes gelu''(x) in tensor ops.
namespace {
struct GeluGradSaved {
  Tensor grad, x;
  static constexpr std::tuple fields{saved_field("grad", &GeluGradSaved::grad), saved_field("x", &GeluGradSaved::x)};
};
}  // namespace
static void gelu_grad_backward(const Node& n, const Tensor& gg, std::span<Tensor> gin) {
  const Tensor g = n.saved_tensor(&GeluGradSaved::grad), x = n.saved_tensor(&GeluGradSaved::x);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  if (n.needs(0)) gin[0] = gelu_grad(gg, x, tanh_approximation);
  if (!n.needs(1)) return;
  auto times_curvature = [&](auto curvature) {
    return detail::pointwise(n.op->name, [curvature](auto a, auto b, auto v) { return a * b * curvature(v); }, gg, g, x);
  };
  gin[1] = tanh_approximation ? times_curvature(gelu_curvature_tanh) : times_curvature(gelu_curvature_exact);
}
// d/d(g, x) of g * gelu'(x) along (tg, tx): gelu'(x) tg + g gelu''(x) tx,
// one buffer and two passes, the second adding in place. Recorded, the
// engine derives the tangent from the backward.
static void gelu_grad_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Tensor x = n.saved_tensor(&GeluGradSaved::x);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  if (!t[1].defined()) {
    if (t[0].defined()) out[0] = gelu_grad(t[0], x, tanh_approximation);
    return;
  }
  const Tensor g = n.saved_tensor(&GeluGradSaved::grad);
  Tensor r = empty(x.shape(), x.dtype());
  auto add_terms = [&](auto slope, auto curvature) {
    dispatch_float(x.dtype(), n.op->name, [&](auto tag) {
      using S = decltype(tag);
      detail::map3<S, S, S, S>(r, t[1], g, x, [curvature](S tx, S gy, S v) { return tx * gy * curvature(v); });
      if (t[0].defined())
        detail::map3<S, S, S, S>(r, r, t[0], x, [slope](S acc, S tg, S v) { return acc + tg * slope(v); });
    });
  };
  if (tanh_approximation)
    add_terms(gelu_slope_tanh, gelu_curvature_tanh);
  else
    add_terms(gelu_slope_exact, gelu_curvature_exact);
  out[0] = r;
}
static const OpDef gelu_grad_op({
    .name = "gelu_grad",
    .arity = 2,
    .signature = "gelu_grad(g, x, tanh_approximation=false) -> g * gelu'(x)",
    .saves = saves_of<GeluGradSaved>(),
    .backward = gelu_grad_backward,
    .tangent = gelu_grad_tangent,
    .tangent_once_differentiable = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"exact (3,4)", {uniform({3, 4}, 35), uniform({3, 4}, 36, -3, 3)},
           [](auto& x) { return gelu_grad(x[0], x[1]); }},
          {"tanh (3,4)", {uniform({3, 4}, 37), uniform({3, 4}, 38, -3, 3)},
           [](auto& x) { return gelu_grad(x[0], x[1], true); }},
          {"exact non-contiguous x", {uniform({2, 3}, 39), samples::strided({2, 3}, 40, -3, 3)},
           [](auto& x) { return gelu_grad(x[0], x[1]); }},
      };
    },
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
    n->save(GeluGradSaved{.grad = g, .x = x});
  }
  return out;
}

}  // namespace tg
