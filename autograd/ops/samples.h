#pragma once
/// \file
/// Sample inputs for the op table's gradchecks: float64 leaves that require
/// grad, contiguous or deliberately not. Values are deterministic per seed.
#include "../tensor.h"

namespace tg::samples {

/// Uniform in [low, high), float64, requires grad.
Tensor uniform(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0);
/// Same, but a non-contiguous leaf: every element sits two places apart in a
/// larger buffer, so kernels see stride != 1.
Tensor strided(const Shape& shape, uint64_t seed, double low = -1.0, double high = 1.0);
/// Uniform values kept at least `gap` away from zero (for relu, abs, ... kinks).
Tensor away_from_zero(const Shape& shape, uint64_t seed, double gap = 0.1);
/// Integer indices in [0, high), no grad.
Tensor indices(const Shape& shape, int64_t high, uint64_t seed);

}  // namespace tg::samples
