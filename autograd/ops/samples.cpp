#include "autograd/ops/samples.h"

#include <cmath>

namespace tg::samples {

Tensor uniform(const Shape& shape, uint64_t seed, double low, double high) {
  Generator g(seed);
  Tensor t = rand(shape, DType::f64, &g, low, high);
  t.requires_grad_();
  return t;
}

Tensor strided(const Shape& shape, uint64_t seed, double low, double high) {
  Generator g(seed);
  Tensor base = rand(Shape{std::max<int64_t>(1, 2 * shape.numel())}, DType::f64, &g, low, high);
  Shape strides = contiguous_strides(shape);
  for (int64_t& s : strides) s *= 2;
  Tensor t = make_view(base, shape, strides, 0);
  t.requires_grad_();
  return t;
}

Tensor away_from_zero(const Shape& shape, uint64_t seed, double gap) {
  Tensor t = uniform(shape, seed);
  double* p = t.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::copysign(gap + std::abs(p[i]), p[i]);
  return t;
}

Tensor indices(const Shape& shape, int64_t high, uint64_t seed) {
  Generator g(seed);
  return randint(0, high, shape, &g);
}

}  // namespace tg::samples
