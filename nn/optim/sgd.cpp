#include "nn/optim/sgd.h"

#include "autograd/parallel.h"
#include "nn/optim/kernel.h"

namespace tg::nn {

namespace {

std::vector<std::string> sgd_buffers(const SGDOptions& o) {
  if (o.momentum < 0 || o.dampening < 0 || o.momentum != o.momentum)
    throw ValueError(fmt::format("SGD: invalid momentum {} or dampening {}", o.momentum, o.dampening));
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    throw ValueError(fmt::format("SGD: Nesterov momentum requires momentum > 0 and dampening 0, got {} and {}",
                                 o.momentum, o.dampening));
  if (o.momentum == 0) return {};
  return {"momentum_buffer"};
}

// One chunk [b, e). Scalars by value, __restrict pointers and the options as
// template flags, so the loop vectorises. The buffer update is
// buf = bm * buf + bd * d: (0, 1) on the first step (buffers start at zero),
// (momentum, 1 - dampening) after.
template <class T, bool WD, bool Momentum, bool Nesterov>
void sgd_range(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t b, int64_t e, T lr, T wd, T mom,
               T bm, T bd) {
  for (int64_t k = b; k < e; ++k) {
    T d = g[k];
    if constexpr (WD) d += wd * p[k];
    if constexpr (Momentum) {
      const T bk = buf[k] * bm + bd * d;
      buf[k] = bk;
      if constexpr (Nesterov)
        d += mom * bk;
      else
        d = bk;
    }
    p[k] -= lr * d;
  }
}

template <class T>
void sgd_kernel(T* p, const T* g, T* buf, int64_t n, bool first, const SGDOptions& o, double lr, double wd) {
  const double bm = first ? 0.0 : o.momentum, bd = first ? 1.0 : 1 - o.dampening;
  parallel_for(n, kOptimGrain, [&](int64_t b, int64_t e) {
    auto run = [&]<bool WD, bool Momentum, bool Nesterov>() {
      sgd_range<T, WD, Momentum, Nesterov>(p, g, buf, b, e, lr, wd, o.momentum, bm, bd);
    };
    with_flags(run, wd != 0, buf != nullptr, o.nesterov);
  });
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD({ParamGroup{.params = std::move(params)}}, options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer("SGD", std::move(groups), options.lr, options.weight_decay, sgd_buffers(options)), options_(options) {}

void SGD::step() {
  for_each_update([&](const ParamGroup& group, const Tensor& p, const Tensor& g, ParamState& st) {
    dispatch_float(p.dtype(), "SGD.step", [&](auto tag) {
      using scalar_t = decltype(tag);
      scalar_t* buf = st.buffers.empty() ? nullptr : st.buffers[0].data<scalar_t>();
      sgd_kernel<scalar_t>(p.data<scalar_t>(), g.data<scalar_t>(), buf, p.numel(), st.step == 1, options_, group.lr,
                           group.weight_decay);
    });
  });
}

}  // namespace tg::nn
