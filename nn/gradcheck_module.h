#pragma once
/// \file
/// Gradient checking of whole layers and models.
#include "../autograd/gradcheck.h"
#include "module.h"

namespace tg::nn {

/// Gradchecks a layer or model: converts the module to float64 (and back to
/// its dtype afterwards) and gradchecks fn (which calls the module on the
/// inputs) with respect to the inputs and every named parameter, reporting
/// each parameter by its dotted name.
///
///     nn::Linear fc({.in = 3, .out = 2});
///     Tensor x = samples::uniform({4, 3}, 1);
///     auto report = nn::gradcheck_module(fc, [&](auto& in) { return fc(in[0]); }, {x});
///
/// inputs: float64 tensors (those requiring grad are checked; int64 ids are
/// passed through). Parameters are perturbed in place and restored.
GradcheckReport gradcheck_module(Module& m, const TensorFn& fn, const std::vector<Tensor>& inputs,
                                 GradcheckOptions options = {});
/// The same for second derivatives (gradgradcheck): the last row of the report
/// is the random output gradient the backward is differentiated along.
GradcheckReport gradgradcheck_module(Module& m, const TensorFn& fn, const std::vector<Tensor>& inputs,
                                     GradcheckOptions options = {});

}  // namespace tg::nn
