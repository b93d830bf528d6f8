#include "nn/gradcheck_module.h"

namespace tg::nn {
namespace {

using Check = GradcheckReport (*)(const TensorFn&, const std::vector<Tensor>&, const GradcheckOptions&);

// Runs `check` over the inputs and every parameter, in float64; the module is
// given back in the dtype it came in.
GradcheckReport check_module(Check check, Module& m, const TensorFn& fn, const std::vector<Tensor>& inputs,
                             GradcheckOptions options) {
  const auto before = m.named_parameters();
  const DType original = before.empty() ? DType::f64 : before.front().second.dtype();
  m.to(DType::f64);
  struct Restore {
    Module& m;
    DType dtype;
    ~Restore() { m.to(dtype); }
  } restore{m, original};
  auto params = m.named_parameters();
  std::vector<Tensor> all = inputs;
  for (auto& [name, p] : params) all.push_back(p);
  const size_t n = inputs.size();
  options.in_place = true;  // the module reads its parameters itself
  TensorFn wrapped = [&](const std::vector<Tensor>& x) {
    return fn(std::vector<Tensor>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n)));
  };
  bool raise = options.raise;
  options.raise = false;
  GradcheckReport report = check(wrapped, all, options);
  for (size_t i = 0; i < report.inputs.size() && i < all.size(); ++i)
    report.inputs[i].name = i < n ? fmt::format("input {}", i) : params[i - n].first;
  if (!report.passed && raise) throw GradcheckError(report);
  return report;
}

}  // namespace

GradcheckReport gradcheck_module(Module& m, const TensorFn& fn, const std::vector<Tensor>& inputs,
                                 GradcheckOptions options) {
  return check_module(gradcheck, m, fn, inputs, options);
}

GradcheckReport gradgradcheck_module(Module& m, const TensorFn& fn, const std::vector<Tensor>& inputs,
                                     GradcheckOptions options) {
  return check_module(gradgradcheck, m, fn, inputs, options);
}

}  // namespace tg::nn
