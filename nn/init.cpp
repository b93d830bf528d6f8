// Parameter initialisers (torch.nn.init). Values are drawn in float64 from
// the generator and written into the tensor with copy_, outside the tape, so
// a parameter keeps its handle, dtype and requires_grad.
#include "nn/init.h"

#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "autograd/tape.h"

namespace tg::nn::init {
namespace {

void check_defined(const Tensor& t, const char* fn) {
  if (!t.defined()) throw ValueError(fmt::format("init::{}: tensor is undefined", fn));
  if (!is_floating(t.dtype()))
    throw DTypeError(fmt::format("init::{}: tensor {} is {}, expected a floating dtype", fn, t.shape(),
                                 dtype_name(t.dtype())));
}

// Writes src (any float dtype, t's shape) into t without recording it.
void assign(const Tensor& t, const Tensor& src) {
  NoGradGuard ng;
  t.copy_(src.to(t.dtype()));
}

int64_t fan(const Tensor& t, FanMode mode) {
  auto [in, out] = fans(t);
  return mode == FanMode::fan_in ? in : out;
}

}  // namespace

double calculate_gain(Nonlinearity nl, double param) {
  switch (nl) {
    case Nonlinearity::linear:
    case Nonlinearity::sigmoid: return 1.0;
    case Nonlinearity::tanh: return 5.0 / 3.0;
    case Nonlinearity::relu: return std::sqrt(2.0);
    case Nonlinearity::leaky_relu: return std::sqrt(2.0 / (1.0 + param * param));
  }
  throw ValueError("init::calculate_gain: unknown nonlinearity");
}

std::pair<int64_t, int64_t> fans(const Tensor& t) {
  if (!t.defined() || t.dim() < 2)
    throw ValueError(fmt::format("init::fans: tensor {} needs at least 2 dims to have fans",
                                 t.defined() ? t.shape().str() : std::string("(undefined)")));
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

void uniform_(const Tensor& t, double low, double high, Generator* gen) {
  check_defined(t, "uniform_");
  if (!(low <= high)) throw ValueError(fmt::format("init::uniform_: low {} > high {}", low, high));
  assign(t, rand(t.shape(), DType::f64, gen, low, high));
}

void normal_(const Tensor& t, double mean, double std, Generator* gen) {
  check_defined(t, "normal_");
  if (!(std >= 0)) throw ValueError(fmt::format("init::normal_: std {} must be >= 0", std));
  assign(t, randn(t.shape(), DType::f64, gen, mean, std));
}

void constant_(const Tensor& t, double value) {
  check_defined(t, "constant_");
  NoGradGuard ng;
  t.fill_(value);
}

void zeros_(const Tensor& t) { constant_(t, 0.0); }
void ones_(const Tensor& t) { constant_(t, 1.0); }

void xavier_uniform_(const Tensor& t, double gain, Generator* gen) {
  auto [in, out] = fans(t);
  const double a = gain * std::sqrt(6.0 / static_cast<double>(in + out));
  uniform_(t, -a, a, gen);
}

void xavier_normal_(const Tensor& t, double gain, Generator* gen) {
  auto [in, out] = fans(t);
  normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(in + out)), gen);
}

void kaiming_uniform_(const Tensor& t, double a, FanMode mode, Nonlinearity nl, Generator* gen) {
  const double bound = calculate_gain(nl, a) * std::sqrt(3.0 / static_cast<double>(fan(t, mode)));
  uniform_(t, -bound, bound, gen);
}

void kaiming_normal_(const Tensor& t, double a, FanMode mode, Nonlinearity nl, Generator* gen) {
  normal_(t, 0.0, calculate_gain(nl, a) / std::sqrt(static_cast<double>(fan(t, mode))), gen);
}

// As torch: QR of a Gaussian (rows, cols) matrix, transposed first when it is
// wide so Q has orthonormal columns. Modified Gram-Schmidt, run twice for
// accuracy, yields R with a positive diagonal: exactly torch's Q * sign(diag R).
void orthogonal_(const Tensor& t, double gain, Generator* gen) {
  check_defined(t, "orthogonal_");
  if (t.dim() < 2)
    throw ValueError(fmt::format("init::orthogonal_: tensor {} needs at least 2 dims", t.shape()));
  const int64_t rows = t.size(0), cols = t.numel() / rows;
  if (cols == 0) return;
  const bool wide = rows < cols;
  const int64_t m = wide ? cols : rows, n = wide ? rows : cols;  // A is (m, n), m >= n
  std::vector<double> g = randn({rows, cols}, DType::f64, gen).contiguous().to_vector<double>();
  // Column j of A, stored contiguously: a[j*m + i].
  std::vector<double> a(static_cast<size_t>(m * n));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = wide ? c : r, j = wide ? r : c;
      a[j * m + i] = g[r * cols + c];
    }
  for (int64_t j = 0; j < n; ++j) {
    double* qj = &a[j * m];
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < j; ++k) {
        const double* qk = &a[k * m];
        double dot = 0;
        for (int64_t i = 0; i < m; ++i) dot += qk[i] * qj[i];
        for (int64_t i = 0; i < m; ++i) qj[i] -= dot * qk[i];
      }
    double norm = 0;
    for (int64_t i = 0; i < m; ++i) norm += qj[i] * qj[i];
    norm = std::sqrt(norm);
    for (int64_t i = 0; i < m; ++i) qj[i] /= norm;
  }
  std::vector<double> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = wide ? c : r, j = wide ? r : c;
      out[r * cols + c] = gain * a[j * m + i];
    }
  assign(t, from_vector(out, t.shape()));
}

}  // namespace tg::nn::init
