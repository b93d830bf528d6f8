#include "nn/optim/clip.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "autograd/ops/loop.h"
#include "autograd/tape.h"

namespace tg::nn {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm) {
  if (!(max_norm >= 0)) throw ValueError(fmt::format("clip_grad_norm_: max_norm must be >= 0, got {}", max_norm));
  NoGradGuard no_grad;
  double sum_sq = 0;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    Tensor g = p.grad().contiguous();
    dispatch_float(g.dtype(), "clip_grad_norm_", [&](auto tag) {
      using scalar_t = decltype(tag);
      const scalar_t* d = g.data<scalar_t>();
      double s = 0;
      for (int64_t k = 0, n = g.numel(); k < n; ++k) s += static_cast<double>(d[k]) * static_cast<double>(d[k]);
      sum_sq += s;
    });
  }
  const double total = std::sqrt(sum_sq);
  const double coef = max_norm / (total + 1e-6);
  if (coef < 1 || std::isnan(coef))
    for (const Tensor& p : params)
      if (p.defined() && p.grad().defined()) p.grad().mul_(coef);
  return total;
}

void clip_grad_value_(const std::vector<Tensor>& params, double clip) {
  if (!(clip >= 0)) throw ValueError(fmt::format("clip_grad_value_: clip must be >= 0, got {}", clip));
  NoGradGuard no_grad;
  for (const Tensor& p : params) {
    if (!p.defined() || !p.grad().defined()) continue;
    const Tensor g = p.grad();
    dispatch_float(g.dtype(), "clip_grad_value_", [&](auto tag) {
      using scalar_t = decltype(tag);
      const scalar_t lo = -clip, hi = clip;
      detail::map1<scalar_t, scalar_t>(g, g, [=](scalar_t x) { return std::clamp(x, lo, hi); });
    });
    g.bump_version();
  }
}

}  // namespace tg::nn
