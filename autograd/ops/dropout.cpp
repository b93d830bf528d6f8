// dropout: one node on the tape; the mask it saves makes backward one multiply.
#include "autograd/ops/dropout.h"

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/samples.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_floating;

// Element i is dropped when the generator's counter-based uniform for it is
// below p, so the mask depends only on the generator state, not on threads.
namespace {
struct DropoutSaved {
  Tensor mask;  // 0 or 1/(1-p), of x's shape and dtype
  static constexpr std::tuple fields{saved_field("mask", &DropoutSaved::mask)};
};
}  // namespace

// Linear in x with a diagonal Jacobian (the mask, a constant): gradient and
// tangent are both the input's times the mask (self_adjoint).
static void dropout_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = mul(g, n.saved_tensor(&DropoutSaved::mask));
}
static const OpDef dropout_op({
    .name = "dropout",
    .arity = 1,
    .signature = "dropout(x, p, training, generator) -> x * mask / (1 - p)",
    .saves = saves_of<DropoutSaved>(),
    .backward = dropout_backward,
    .self_adjoint = true,
    .samples = [] {
      // A fresh generator per call: every gradcheck evaluation sees the same mask.
      auto drop = [](double p, uint64_t seed) {
        return [p, seed](auto& x) {
          Generator gen(seed);
          return dropout(x[0], p, true, &gen);
        };
      };
      return std::vector<OpSample>{
          {"(4,5) p 0.3 training", {samples::uniform({4, 5}, 341)}, drop(0.3, 7)},
          {"(2,3,4) p 0.5 training", {samples::uniform({2, 3, 4}, 342)}, drop(0.5, 8)},
          {"non-contiguous (3,4) p 0.2", {samples::strided({3, 4}, 343)}, drop(0.2, 9)},
      };
    },
});

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  const std::string_view op = dropout_op.name;
  ProfileScope prof(op);
  check_floating(op, x, "input");
  if (!(p >= 0.0 && p < 1.0))
    throw ValueError(fmt::format("{}: probability p must be in [0, 1), got {} (input {})", op, p, x.shape()));
  if (!training || p == 0.0) return x;
  Generator& g = gen ? *gen : default_generator();
  const uint64_t first = g.reserve(static_cast<uint64_t>(x.numel()));
  // Dropped iff the 53-bit uniform draw u satisfies u < p * 2^53.
  const uint64_t threshold = static_cast<uint64_t>(p * 0x1.0p53);
  Tensor mask = empty_like(x), out = empty_like(x);
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T keep = static_cast<T>(1.0 / (1.0 - p));
    T* m = mask.data<T>();
    parallel_for(x.numel(), detail::kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) m[i] = (g.bits(first + i) >> 11) < threshold ? T(0) : keep;
    });
    detail::map2<T, T, T>(out, x, mask, [](T a, T k) { return a * k; });
  });
  if (Node* n = record(dropout_op, out, x)) n->save(DropoutSaved{.mask = mask});
  return out;
}

}  // namespace tg
