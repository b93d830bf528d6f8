// where and masked_fill, which select elementwise by a mask, and the
// comparisons (eq, ne, lt, le, gt, ge) that make masks: forward and backward
// side by side, one OpDef each (the comparisons have no gradient).
#include "autograd/ops/elementwise.h"

#include <cmath>
#include <optional>

#include "autograd/anomaly.h"
#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_same_dtype;
using samples::uniform;

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
// where, masked_fill: the mask (any dtype, nonzero = true).
struct MaskSaved {
  Tensor mask;
  static constexpr std::tuple fields{saved_field("mask", &MaskSaved::mask)};
};
}  // namespace
static void where_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor mask = n.saved_tensor(&MaskSaved::mask);
  const Tensor zero = zeros({}, g.dtype());
  // The selection is where itself: linear in g, recorded in grad mode.
  if (n.needs(1)) gin[1] = sum_to(where(mask, g, zero), n.edges[1].shape);
  if (n.needs(2)) gin[2] = sum_to(where(mask, zero, g), n.edges[2].shape);
}
static const OpDef where_op({
    .name = "where",
    .arity = 3,
    .signature = "where(mask, a, b) -> mask ? a : b, broadcasting",
    .saves = saves_of<MaskSaved>(),
    .backward = where_backward,
    .samples = [] {
      auto fn = [](const std::vector<Tensor>& x) { return where(x[0], x[1], x[2]); };
      return std::vector<OpSample>{
          {"(3,4) mask", {samples::indices({3, 4}, 2, 41), uniform({3, 4}, 42), uniform({3, 4}, 43)}, fn},
          {"broadcast mask (4) a (3,1) b ()", {samples::indices({4}, 2, 44), uniform({3, 1}, 45), uniform({}, 46)}, fn},
      };
    },
});
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b) {
  ProfileScope prof(where_op.name);
  Tensor out = mask_where(mask, a, b, "where");
  if (Node* n = record(where_op, out, mask, a, b)) n->save(MaskSaved{.mask = mask});
  return out;
}

// Linear, and its Jacobian diagonal (self_adjoint): gradient and tangent are
// both the input's zeroed where the mask is set (the mask broadcasts to x).
static void masked_fill_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = masked_fill(g, n.saved_tensor(&MaskSaved::mask), 0.0);
}
static const OpDef masked_fill_op({
    .name = "masked_fill",
    .arity = 1,
    .signature = "masked_fill(x, mask, value)",
    .saves = saves_of<MaskSaved>(),
    .backward = masked_fill_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{{"(3,4) with mask (4)", {uniform({3, 4}, 47)}, [](auto& x) {
                                      return masked_fill(x[0], samples::indices({4}, 2, 48), -1e9);
                                    }}};
    },
});
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value) {
  ProfileScope prof(masked_fill_op.name);
  if (!(broadcast_shapes(mask.shape(), x.shape(), "masked_fill") == x.shape()))
    throw ShapeError(fmt::format("masked_fill: mask of shape {} does not broadcast to {}", mask.shape(), x.shape()));
  Tensor out = mask_where(mask, full({}, value, x.dtype()), x, "masked_fill");
  std::optional<detail::InfinityAsked> asked;  // an infinite fill (hidden keys) is no anomaly
  if (std::isinf(value)) asked.emplace();
  if (Node* n = record(masked_fill_op, out, x)) n->save(MaskSaved{.mask = mask});
  return out;
}

// ============================ comparisons (no gradient) ============================
#define TG_COMPARE(NAME, EXPR)                                                         \
  Tensor NAME(const Tensor& a, const Tensor& b) {                                      \
    check_same_dtype(#NAME, a, b);                                                     \
    Tensor out = empty(broadcast_shapes(a.shape(), b.shape(), #NAME), DType::i64);     \
    TG_DISPATCH_ALL(a.dtype(), #NAME, [&] {                                            \
      using T = scalar_t;                                                              \
      detail::map2<int64_t, T, T>(out, a, b, [](T x, T y) { return int64_t(EXPR); }); \
    });                                                                                \
    return out;                                                                        \
  }
TG_COMPARE(eq, x == y)
TG_COMPARE(ne, x != y)
TG_COMPARE(lt, x < y)
TG_COMPARE(le, x <= y)
TG_COMPARE(gt, x > y)
TG_COMPARE(ge, x >= y)
#undef TG_COMPARE

}  // namespace tg
