#include "nn/optim/adagrad.h"

#include <cmath>

#include "autograd/parallel.h"
#include "nn/optim/kernel.h"

namespace tg::nn {

namespace {

// One chunk [b, e). Scalars by value, __restrict pointers and weight decay
// as a template flag, so the loop has no branches (GCC vectorises it with
// -fno-math-errno; with errno, sqrt keeps one).
template <class T, bool WD>
void adagrad_range(T* __restrict p, const T* __restrict g, T* __restrict sum, int64_t b, int64_t e, T clr, T wd, T eps) {
  for (int64_t k = b; k < e; ++k) {
    T gk = g[k];
    if constexpr (WD) gk += wd * p[k];
    sum[k] += gk * gk;
    p[k] += -clr * gk / (std::sqrt(sum[k]) + eps);
  }
}

template <class T>
void adagrad_kernel(T* p, const T* g, T* sum, int64_t n, double clr, double wd, double eps) {
  parallel_for(n, kOptimGrain, [&](int64_t b, int64_t e) {
    auto run = [&]<bool WD>() { adagrad_range<T, WD>(p, g, sum, b, e, clr, wd, eps); };
    with_flags(run, wd != 0);
  });
}

}  // namespace

Adagrad::Adagrad(std::vector<Tensor> params, AdagradOptions options)
    : Adagrad({ParamGroup{.params = std::move(params)}}, options) {}

Adagrad::Adagrad(std::vector<ParamGroup> groups, AdagradOptions options)
    : Optimizer("Adagrad", std::move(groups), options.lr, options.weight_decay, {"sum"}), options_(options) {
  if (!(options.lr_decay >= 0) || !(options.eps >= 0) || !(options.initial_accumulator_value >= 0))
    throw ValueError(fmt::format("Adagrad: invalid lr_decay {}, eps {} or initial_accumulator_value {}",
                                 options.lr_decay, options.eps, options.initial_accumulator_value));
}

void Adagrad::step() {
  for_each_update([&](const ParamGroup& group, const Tensor& p, const Tensor& g, ParamState& st) {
    const double clr = group.lr / (1 + static_cast<double>(st.step - 1) * options_.lr_decay);
    // The accumulator starts at initial_accumulator_value (buffers start at zero).
    if (st.step == 1) st.buffers[0].fill_(options_.initial_accumulator_value);
    dispatch_float(p.dtype(), "Adagrad.step", [&](auto tag) {
      using scalar_t = decltype(tag);
      adagrad_kernel<scalar_t>(p.data<scalar_t>(), g.data<scalar_t>(), st.buffers[0].data<scalar_t>(), p.numel(), clr,
                               group.weight_decay, options_.eps);
    });
  });
}

}  // namespace tg::nn
