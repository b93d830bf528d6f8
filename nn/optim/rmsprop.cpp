#include "nn/optim/rmsprop.h"

#include <cmath>

#include "autograd/parallel.h"
#include "nn/optim/kernel.h"

namespace tg::nn {

namespace {

std::vector<std::string> rmsprop_buffers(const RMSpropOptions& o) {
  if (!(o.alpha >= 0) || !(o.eps >= 0) || !(o.momentum >= 0))
    throw ValueError(fmt::format("RMSprop: invalid alpha {}, eps {} or momentum {}", o.alpha, o.eps, o.momentum));
  std::vector<std::string> names = {"square_avg"};
  if (o.momentum > 0) names.push_back("momentum_buffer");
  if (o.centered) names.push_back("grad_avg");
  return names;
}

// One chunk [b, e); c = 1 - a (rounded from double as in torch); buf and ga
// are null when momentum is 0 / the update is not centered (the
// template flags are off), so the loop has no branches (GCC vectorises it
// with -fno-math-errno; with errno, sqrt keeps one).
template <class T, bool WD, bool Momentum, bool Centered>
void rmsprop_range(T* __restrict p, const T* __restrict g, T* __restrict sq,
                                                      T* __restrict buf, T* __restrict ga, int64_t b, int64_t e, T a,
                                                      T c, T eps, T mom, T lr, T wd) {
  for (int64_t k = b; k < e; ++k) {
    T gk = g[k];
    if constexpr (WD) gk += wd * p[k];
    sq[k] = sq[k] * a + c * gk * gk;
    T avg;
    if constexpr (Centered) {
      ga[k] = ga[k] * a + c * gk;
      avg = std::sqrt(sq[k] - ga[k] * ga[k]) + eps;
    } else {
      avg = std::sqrt(sq[k]) + eps;
    }
    if constexpr (Momentum) {
      buf[k] = buf[k] * mom + gk / avg;
      p[k] += -lr * buf[k];
    } else {
      p[k] += -lr * gk / avg;
    }
  }
}

template <class T>
void rmsprop_kernel(T* p, const T* g, T* sq, T* buf, T* ga, int64_t n, const RMSpropOptions& o, double lr,
                    double wd) {
  parallel_for(n, kOptimGrain, [&](int64_t b, int64_t e) {
    auto run = [&]<bool WD, bool M, bool C>() {
      rmsprop_range<T, WD, M, C>(p, g, sq, buf, ga, b, e, o.alpha, 1 - o.alpha, o.eps, o.momentum, lr, wd);
    };
    with_flags(run, wd != 0, buf != nullptr, ga != nullptr);
  });
}

}  // namespace

RMSprop::RMSprop(std::vector<Tensor> params, RMSpropOptions options)
    : RMSprop({ParamGroup{.params = std::move(params)}}, options) {}

RMSprop::RMSprop(std::vector<ParamGroup> groups, RMSpropOptions options)
    : Optimizer("RMSprop", std::move(groups), options.lr, options.weight_decay, rmsprop_buffers(options)),
      options_(options) {}

void RMSprop::step() {
  for_each_update([&](const ParamGroup& group, const Tensor& p, const Tensor& g, ParamState& st) {
    dispatch_float(p.dtype(), "RMSprop.step", [&](auto tag) {
      using scalar_t = decltype(tag);
      size_t k = 1;
      scalar_t* sq = st.buffers[0].data<scalar_t>();
      scalar_t* buf = options_.momentum > 0 ? st.buffers[k++].data<scalar_t>() : nullptr;
      scalar_t* ga = options_.centered ? st.buffers[k++].data<scalar_t>() : nullptr;
      rmsprop_kernel<scalar_t>(p.data<scalar_t>(), g.data<scalar_t>(), sq, buf, ga, p.numel(), options_, group.lr,
                               group.weight_decay);
    });
  });
}

}  // namespace tg::nn
