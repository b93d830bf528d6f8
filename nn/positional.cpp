#include "nn/positional.h"

#include <cmath>
#include <vector>

#include "nn/init.h"

namespace tg::nn {
namespace {

void check_options(const char* layer, const PositionalOptions& o) {
  if (o.max_len <= 0 || o.dim <= 0)
    throw ValueError(fmt::format("{}: max_len ({}) and dim ({}) must be positive", layer, o.max_len, o.dim));
}

void check_range(const char* layer, int64_t T, int64_t start, int64_t max_len) {
  if (T < 0 || start < 0 || start + T > max_len)
    throw IndexError(fmt::format("{}: positions [{}, {}) outside [0, max_len = {})", layer, start, start + T, max_len));
}

}  // namespace

SinusoidalPositionalEncoding::SinusoidalPositionalEncoding(const PositionalOptions& o)
    : Module("SinusoidalPositionalEncoding"), options(o) {
  check_options("SinusoidalPositionalEncoding", o);
  std::vector<double> v(static_cast<size_t>(o.max_len * o.dim));
  for (int64_t p = 0; p < o.max_len; ++p)
    for (int64_t c = 0; c < o.dim; ++c) {
      const int64_t i2 = c - c % 2;  // 2i, shared by the sin/cos pair
      const double angle = static_cast<double>(p) / std::pow(10000.0, static_cast<double>(i2) / static_cast<double>(o.dim));
      v[p * o.dim + c] = c % 2 == 0 ? std::sin(angle) : std::cos(angle);
    }
  pe = register_buffer("pe", from_vector(v, {o.max_len, o.dim}).to(DType::f32));
}

Tensor SinusoidalPositionalEncoding::forward(int64_t T, int64_t start) {
  ModulePathScope path(name());
  check_range("SinusoidalPositionalEncoding", T, start, options.max_len);
  return pe.narrow(0, start, T);
}

std::string SinusoidalPositionalEncoding::extra_repr() const {
  return fmt::format("max_len={}, dim={}", options.max_len, options.dim);
}

LearnedPositionalEmbedding::LearnedPositionalEmbedding(const PositionalOptions& o)
    : Module("LearnedPositionalEmbedding"), options(o) {
  check_options("LearnedPositionalEmbedding", o);
  Tensor w = empty({o.max_len, o.dim});
  init::normal_(w, 0.0, 0.02);
  weight = register_parameter("weight", w);
}

Tensor LearnedPositionalEmbedding::forward(int64_t T, int64_t start) {
  ModulePathScope path(name());
  check_range("LearnedPositionalEmbedding", T, start, options.max_len);
  return weight.narrow(0, start, T);
}

std::string LearnedPositionalEmbedding::extra_repr() const {
  return fmt::format("max_len={}, dim={}", options.max_len, options.dim);
}

}  // namespace tg::nn
