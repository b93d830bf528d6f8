#include "examples/study/fit.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

namespace tg::study {

double PowerLaw::at(double x) const { return std::pow(10.0, log10_at(std::log10(x))); }

PowerLaw fit_power_law(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.size() < 2)
    throw std::invalid_argument("fit_power_law: needs as many y as x, and two points at least");
  const size_t n = x.size();
  std::vector<double> lx(n), ly(n);
  for (size_t i = 0; i < n; ++i) {
    if (!(x[i] > 0 && y[i] > 0)) throw std::invalid_argument("fit_power_law: x and y must be positive");
    lx[i] = std::log10(x[i]), ly[i] = std::log10(y[i]);
  }
  PowerLaw p;
  p.n = static_cast<int>(n);
  for (size_t i = 0; i < n; ++i) p.xbar += lx[i] / static_cast<double>(n);
  double sxx = 0, sxy = 0, ybar = 0;
  for (size_t i = 0; i < n; ++i) ybar += ly[i] / static_cast<double>(n);
  for (size_t i = 0; i < n; ++i) sxx += (lx[i] - p.xbar) * (lx[i] - p.xbar), sxy += (lx[i] - p.xbar) * (ly[i] - ybar);
  if (!(sxx > 0)) throw std::invalid_argument("fit_power_law: all x are equal");
  p.b = sxy / sxx;
  p.a = ybar;
  if (n > 2) {
    double rss = 0;
    for (size_t i = 0; i < n; ++i) rss += std::pow(ly[i] - p.log10_at(lx[i]), 2);
    const double s2 = rss / static_cast<double>(n - 2);  // the residual variance
    p.se_b = std::sqrt(s2 / sxx);
    p.se_a = std::sqrt(s2 / static_cast<double>(n));
  }
  return p;
}

std::optional<Meeting> meeting(const PowerLaw& p, const PowerLaw& q) {
  // a_p + b_p (u - xp) = a_q + b_q (u - xq)  =>  u = (a_q - a_p + b_p xp - b_q xq) / (b_p - b_q)
  const double db = p.b - q.b;
  if (std::fabs(db) < 1e-9) return std::nullopt;  // equal exponents, to the digits a fit of rounded data has
  const double num = q.a - p.a + p.b * p.xbar - q.b * q.xbar;
  const double u = num / db;
  // du/da_p = -1/db, du/da_q = 1/db, du/db_p = (xp - u)/db, du/db_q = (u - xq)/db.
  const double var = (p.se_a * p.se_a + q.se_a * q.se_a) / (db * db) +
                     std::pow((p.xbar - u) / db * p.se_b, 2) + std::pow((u - q.xbar) / db * q.se_b, 2);
  return Meeting{u, std::sqrt(var)};
}

Order compare(const std::vector<double>& p, const std::vector<double>& q, bool higher_is_better) {
  if (p.empty() || q.empty()) throw std::invalid_argument("compare: an empty sample");
  const auto [plo, phi] = std::minmax_element(p.begin(), p.end());
  const auto [qlo, qhi] = std::minmax_element(q.begin(), q.end());
  if (*plo > *qhi) return higher_is_better ? Order::better : Order::worse;
  if (*phi < *qlo) return higher_is_better ? Order::worse : Order::better;
  return Order::level;
}

Range range_of(const std::vector<double>& v) {
  if (v.empty()) throw std::invalid_argument("range_of: an empty sample");
  Range r{0, *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
  for (double x : v) r.mean += x / static_cast<double>(v.size());
  return r;
}

std::string format_range(const Range& r, int digits) {
  if (r.lo == r.hi) return fmt::format("{:.{}f}", r.mean, digits);
  return fmt::format("{:.{}f} ({:.{}f} to {:.{}f})", r.mean, digits, r.lo, digits, r.hi, digits);
}

}  // namespace tg::study
