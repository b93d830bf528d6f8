// gelu and gelu_grad (its backward as an op of its own): forward and backward
// side by side, one OpDef each.
#include "autograd/ops/elementwise.h"

#include <bit>
#include <numbers>
#include <tuple>

#include "autograd/autocast.h"
#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise/common.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_same_dtype;
using detail::tangent_or_zeros;
using detail::elementwise::fused_grad;
using detail::elementwise::unary;
using samples::uniform;

// ============================ gelu ============================
namespace {
struct GeluAttrs {
  bool tanh_approximation;
};

// gelu(x), gelu'(x) and gelu''(x) of each form, written once over `auto`
// (pointwise.h): on floats in the fused kernels, on tensors in the recorded
// forms. Exact: x Phi(x), Phi the standard normal CDF; gelu' = Phi + x phi,
// gelu'' = phi (2 - x^2), phi its density.
using detail::math::lit;
constexpr double kGeluK = std::numbers::sqrt2 * std::numbers::inv_sqrtpi, kGeluC = 0.044715;  // sqrt(2/pi)
struct GeluExact {
  static auto cdf(auto x) { return lit(x, 0.5) * (1 + detail::math::erf(x * lit(x, std::numbers::sqrt2 / 2))); }
  static auto density(auto x) { return detail::math::exp(lit(x, -0.5) * x * x) * lit(x, kGeluK / 2); }
  static auto value(auto x) { return x * cdf(x); }
  static auto slope(auto x) {
    if constexpr (std::is_same_v<decltype(x), float>) {
      // Phi's erf(x / sqrt2) and phi share exp(-x^2 / 2): one exp, not two.
      const float e = detail::vexp(-0.5f * x * x);
      return 0.5f * (1.0f + detail::verf_given(x * float(std::numbers::sqrt2 / 2), e)) + x * e * float(kGeluK / 2);
    } else {
      return cdf(x) + x * density(x);
    }
  }
  static auto curvature(auto x) { return density(x) * (2 - x * x); }
};
// Tanh, as torch's approximate='tanh': 0.5 x (1 + t), t = tanh(u),
// u = k (x + c x^3); gelu' = (1 + t) / 2 + x (1 - t^2) u' / 2 and
// gelu'' = (1 - t^2) (u' + x (u'' - 2 t u'^2) / 2).
struct GeluTanh {
  static auto t(auto x) { return detail::math::tanh(lit(x, kGeluK) * (x + lit(x, kGeluC) * x * x * x)); }
  static auto du(auto x) { return lit(x, kGeluK) * (1 + lit(x, 3 * kGeluC) * x * x); }
  static auto value(auto x) { return lit(x, 0.5) * x * (1 + t(x)); }
  static auto slope(auto x) {
    const auto tx = t(x);
    return lit(x, 0.5) * (1 + tx) + lit(x, 0.5) * x * (1 - tx * tx) * du(x);
  }
  static auto curvature(auto x) {
    const auto tx = t(x), dux = du(x);
    return (1 - tx * tx) * (dux + lit(x, 0.5) * x * (lit(x, 6 * kGeluK * kGeluC) * x - 2 * tx * dux * dux));
  }
};
template <class F>
auto with_form(bool tanh_approximation, F f) {
  return tanh_approximation ? f(GeluTanh{}) : f(GeluExact{});
}
// gelu(x) unrecorded; a bfloat16 x (the forward's rounded copy) into float32.
Tensor gelu_values(const Tensor& x, bool tanh_approximation) {
  return with_form(tanh_approximation, [&]<class G>(G) {
    if (x.dtype() != DType::bf16) return unary("gelu", x, [](auto v) { return G::value(v); });
    Tensor out = empty(x.shape(), DType::f32);
    detail::map1<float, bfloat16>(out, x, [](bfloat16 v) { return G::value(static_cast<float>(v)); });
    return out;
  });
}
// A contiguous float32 x's bfloat16 copy and gelu of that copy (into
// float32), in one pass: a chunk is rounded and then read back from L1,
// not from memory. The values of bf16_operand(x), then gelu_values.
TG_KERNEL_LOOP std::pair<Tensor, Tensor> gelu_rounding(const Tensor& x, bool tanh_approximation) {
  Tensor rounded = empty(x.shape(), DType::bf16), out = empty(x.shape(), DType::f32);
  const float* px = x.data<float>();
  bfloat16* pr = rounded.data<bfloat16>();
  float* po = out.data<float>();
  with_form(tanh_approximation, [&]<class G>(G) {
    parallel_for(x.numel(), detail::kElementwiseGrain, [&](int64_t b, int64_t e) TG_KERNEL_LOOP {
      constexpr int64_t kChunk = 1024;
      for (int64_t i = b; i < e; i += kChunk) {
        const int64_t n = std::min(kChunk, e - i);
        float_to_bf16(px + i, pr + i, n);
        const uint16_t* bits = &pr[i].bits;
        for (int64_t j = 0; j < n; ++j) po[i + j] = G::value(std::bit_cast<float>(uint32_t{bits[j]} << 16));
      }
    });
  });
  return {rounded, out};
}
// x: a bfloat16 copy where the forward ran under autocast (see gelu).
struct GeluSaved {
  AutocastInput x;
  static constexpr std::tuple fields{saved_field("x", &GeluSaved::x)};
};
struct GeluGradSaved {
  Tensor grad, x;
  static constexpr std::tuple fields{saved_field("grad", &GeluGradSaved::grad), saved_field("x", &GeluGradSaved::x)};
};
}  // namespace

// What the forward computed on, read in a plain backward: x, or under
// autocast its bfloat16 copy, kept, or rounded again where the node kept x
// (a leaf).
static Tensor computed_on(const Node& n) {
  const Tensor x = n.saved_tensor(&GeluSaved::x);
  return n.autocast == DType::bf16 && x.dtype() == DType::f32 ? detail::bf16_operand(x) : x;
}

// Forward over reverse (OpSpec::backward_with_tangents): the gradient
// g gelu'(x) and its tangent tg gelu'(x) + g gelu''(x) tx in one pass. A
// missing tangent is taken as zeros.
template <class G, class S>
static void gelu_grad_with_tangent(int64_t n, const S* x, const S* g, const S* tx, const S* tg, S* dx, S* tdx) {
  parallel_for(n, detail::kElementwiseGrain, [&](int64_t b, int64_t e) {
#pragma omp simd
    for (int64_t i = b; i < e; ++i) {
      const S slope = G::slope(x[i]), curvature = G::curvature(x[i]);
      dx[i] = g[i] * slope;
      tdx[i] = tg[i] * slope + g[i] * curvature * tx[i];
    }
  });
}
static bool gelu_backward_tangents(const Node& n, const Tensor& g, std::span<Tensor> gin,
                                   std::span<Tensor> gin_tangents) {
  const Tensor x = detail::as_float(n.saved_tensor(&GeluSaved::x));  // a kept copy: no tangent went with it
  const Tensor xc = x.contiguous(), gc = g.contiguous(), tx = tangent_or_zeros(x), tg = tangent_or_zeros(g);
  Tensor dx = empty(x.shape(), x.dtype()), tdx = empty(x.shape(), x.dtype());
  with_form(n.attrs<GeluAttrs>().tanh_approximation, [&]<class G>(G) {
    dispatch_float(x.dtype(), "gelu", [&]<class S>(S) {
      gelu_grad_with_tangent<G>(x.numel(), xc.data<S>(), gc.data<S>(), tx.data<S>(), tg.data<S>(), dx.data<S>(),
                                tdx.data<S>());
    });
  });
  gin[0] = dx;
  gin_tangents[0] = tdx;
  return true;
}

// Plain: into g's buffer where nothing else holds it (fused_grad), which the
// public op gelu_grad cannot do; recorded: gelu_grad, which differentiates again.
static void gelu_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = with_form(n.attrs<GeluAttrs>().tanh_approximation, [&]<class G>(G) {
    return fused_grad(g, computed_on(n), [](auto gy, auto v) { return gy * G::slope(v); });
  });
}
static void gelu_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = gelu_grad(g, n.saved_tensor(&GeluSaved::x), n.attrs<GeluAttrs>().tanh_approximation);
}
// The output again from the saved input, for ops that save it by reference
// (a transformer MLP's proj then holds no copy of its (B,T,4C) input).
static Tensor gelu_recompute(const Node& n) {
  return gelu_values(computed_on(n), n.attrs<GeluAttrs>().tanh_approximation);
}
static const OpDef gelu_op({
    .name = "gelu",
    .arity = 1,
    .signature = "gelu(x, tanh_approximation=false)",
    .saves = saves_of<GeluSaved>(),
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
// Under autocast gelu computes on its float32 input's bfloat16 copy, as
// torch.autocast does on the bfloat16 output of the GEMM before it (a
// transformer MLP's first Linear), and its node keeps that copy (half the
// memory; an AutocastInput: a leaf keeps x) for the backward and for
// rebuilding the output for an op that saves it by reference (the next
// GEMM keeps its own bfloat16 copy of the output instead).
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  ProfileScope prof(gelu_op.name);
  detail::check_defined(gelu_op.name, x, "tensor");
  Tensor rounded, out;
  if (!autocast_enabled() || x.dtype() != DType::f32) {
    out = gelu_values(x, tanh_approximation);
  } else if (x.is_contiguous()) {
    std::tie(rounded, out) = gelu_rounding(x, tanh_approximation);
  } else {
    rounded = detail::bf16_operand(x);
    out = gelu_values(rounded, tanh_approximation);
  }
  if (Node* n = record(gelu_op, out, x)) {
    n->attrs<GeluAttrs>() = {.tanh_approximation = tanh_approximation};
    n->save(GeluSaved{.x = {x, rounded}});
  }
  return out;
}

// ============================ gelu_grad ============================
// g * gelu'(x): gelu's backward as an op of its own, so that a recorded
// backward through gelu is one node, not a dozen, and differentiates again
// through gelu''(x); its tangent is derived (forward over reverse runs gelu's fused rule).
static void gelu_grad_backward(const Node& n, const Tensor& gg, std::span<Tensor> gin) {
  const Tensor g = n.saved_tensor(&GeluGradSaved::grad), x = n.saved_tensor(&GeluGradSaved::x);
  const bool tanh_approximation = n.attrs<GeluAttrs>().tanh_approximation;
  if (n.needs(0)) gin[0] = gelu_grad(gg, x, tanh_approximation);
  if (n.needs(1))
    gin[1] = with_form(tanh_approximation, [&]<class G>(G) {
      return detail::pointwise(n.op->name, [](auto a, auto b, auto v) { return a * b * G::curvature(v); }, gg, g, x);
    });
}
static const OpDef gelu_grad_op({
    .name = "gelu_grad",
    .arity = 2,
    .signature = "gelu_grad(g, x, tanh_approximation=false) -> g * gelu'(x)",
    .saves = saves_of<GeluGradSaved>(),
    .backward = gelu_grad_backward,
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
  with_form(tanh_approximation, [&]<class G>(G) {
    dispatch_float(x.dtype(), gelu_grad_op.name, [&]<class S>(S) {
      detail::map2<S, S, S>(out, g, x, [](auto gy, auto v) { return gy * G::slope(v); });
    });
  });
  if (Node* n = record(gelu_grad_op, out, g, x)) {
    n->attrs<GeluAttrs>() = {.tanh_approximation = tanh_approximation};
    n->save(GeluGradSaved{.grad = g, .x = x});
  }
  return out;
}

}  // namespace tg
