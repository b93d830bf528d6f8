#include "nn/optim/adam.h"

#include <cmath>

#include "autograd/parallel.h"
#include "nn/optim/kernel.h"

namespace tg::nn {

namespace {

struct AdamStep {
  double beta1, beta2, eps, l2, decay;  // l2: Adam's weight decay; decay: AdamW's factor (1 - lr * wd)
  double step_size, bias_correction2_sqrt;
};

AdamStep adam_step(double lr, double beta1, double beta2, double eps, double l2, double decay,
                   int64_t t) {
  const double bc1 = 1 - std::pow(beta1, static_cast<double>(t)), bc2 = 1 - std::pow(beta2, static_cast<double>(t));
  return {beta1, beta2, eps, l2, decay, lr / bc1, std::sqrt(bc2)};
}

void check_betas(const char* name, double beta1, double beta2, double eps) {
  if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1))
    throw ValueError(fmt::format("{}: betas must lie in [0, 1), got ({}, {})", name, beta1, beta2));
  if (!(eps >= 0)) throw ValueError(fmt::format("{}: invalid eps {}", name, eps));
}

// One chunk [b, e); c1 = 1 - b1 and c2 = 1 - b2 are rounded from double as in
// torch. Scalars by value, __restrict pointers and flags, so the loop has no
// branches (GCC vectorises it with -fno-math-errno; with errno, sqrt keeps one).
template <class T, bool L2, bool Decay>
void adam_range(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t b, int64_t e, T b1,
                T b2, T c1, T c2, T eps, T l2, T decay, T step_size, T bc2_sqrt) {
  for (int64_t k = b; k < e; ++k) {
    T pk = p[k], gk = g[k];
    if constexpr (Decay) pk *= decay;
    if constexpr (L2) gk += l2 * pk;
    m[k] = m[k] * b1 + c1 * gk;
    v[k] = v[k] * b2 + c2 * gk * gk;
    p[k] = pk + -step_size * m[k] / (std::sqrt(v[k]) / bc2_sqrt + eps);
  }
}

template <class T>
void adam_kernel(T* p, const T* g, T* m, T* v, int64_t n, const AdamStep& s) {
  parallel_for(n, kOptimGrain, [&](int64_t b, int64_t e) {
    auto run = [&]<bool L2, bool Decay>() {
      adam_range<T, L2, Decay>(p, g, m, v, b, e, s.beta1, s.beta2, 1 - s.beta1, 1 - s.beta2, s.eps, s.l2, s.decay,
                               s.step_size, s.bias_correction2_sqrt);
    };
    with_flags(run, s.l2 != 0, s.decay != 1);
  });
}

template <class Options>
void adam_update(const char* name, const Options& o, bool decoupled, const ParamGroup& group, const Tensor& p,
                 const Tensor& g, std::vector<Tensor>& buffers, int64_t t) {
  const double l2 = decoupled ? 0.0 : group.weight_decay;
  const double decay = decoupled ? 1 - group.lr * group.weight_decay : 1.0;
  AdamStep s = adam_step(group.lr, o.beta1, o.beta2, o.eps, l2, decay, t);
  dispatch_float(p.dtype(), name, [&](auto tag) {
    using scalar_t = decltype(tag);
    adam_kernel<scalar_t>(p.data<scalar_t>(), g.data<scalar_t>(), buffers[0].data<scalar_t>(),
                          buffers[1].data<scalar_t>(), p.numel(), s);
  });
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions options) : Adam({ParamGroup{.params = std::move(params)}}, options) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options)
    : Optimizer("Adam", std::move(groups), options.lr, options.weight_decay, {"exp_avg", "exp_avg_sq"}),
      options_(options) {
  check_betas("Adam", options.beta1, options.beta2, options.eps);
}

void Adam::step() {
  for_each_update([&](const ParamGroup& group, const Tensor& p, const Tensor& g, ParamState& st) {
    adam_update("Adam.step", options_, false, group, p, g, st.buffers, st.step);
  });
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamW({ParamGroup{.params = std::move(params)}}, options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamWOptions options)
    : Optimizer("AdamW", std::move(groups), options.lr, options.weight_decay, {"exp_avg", "exp_avg_sq"}),
      options_(options) {
  check_betas("AdamW", options.beta1, options.beta2, options.eps);
}

void AdamW::step() {
  for_each_update([&](const ParamGroup& group, const Tensor& p, const Tensor& g, ParamState& st) {
    adam_update("AdamW.step", options_, true, group, p, g, st.buffers, st.step);
  });
}

}  // namespace tg::nn
