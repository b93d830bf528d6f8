#include "nn/gradcheck_module.h"

namespace tg::nn {

GradcheckReport gradcheck_module(Module& m, const TensorFn& fn, const std::vector<Tensor>& inputs,
                                 GradcheckOptions options) {
  m.to(DType::f64);
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
  GradcheckReport report = gradcheck(wrapped, all, options);
  for (size_t i = 0; i < report.inputs.size(); ++i)
    report.inputs[i].name = i < n ? fmt::format("input {}", i) : params[i - n].first;
  if (!report.passed && raise) throw GradcheckError(report);
  return report;
}

}  // namespace tg::nn
