#pragma once
/// \file
/// Normalisation as one fused op on the tape: the backward reuses the mean and
/// rstd forward saved (written in tensor ops under create_graph, so
/// differentiable twice).
#include "../tensor.h"

namespace tg {

/// Over the last axis: (x - mean) * rstd * weight + bias; weight/bias (C) may
/// be undefined. Saves mean and rstd.
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5);

}  // namespace tg
