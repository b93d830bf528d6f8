#pragma once
/// \file
/// Dropout as one op on the tape; its backward multiplies by the saved mask.
#include "../generator.h"
#include "../tensor.h"

namespace tg {

/// Zeroes elements with probability p and scales the rest by 1/(1-p); the
/// identity when !training or p == 0. Saves the mask.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

}  // namespace tg
