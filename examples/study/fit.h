#pragma once
// Power-law fits for the scale part, and where two fitted laws cross: plain
// arithmetic on (x, y) pairs, kept apart from the models so that the tests
// can check it on synthetic data.
#include <optional>
#include <string>
#include <vector>

namespace tg::study {

// y = 10^a * (x / 10^xbar)^b, fitted by least squares on (log10 x, log10 y):
// log10 y = a + b (log10 x - xbar), xbar the mean of log10 x (so a and b are
// uncorrelated and a is the fitted log10 y at the geometric mean of x).
// se_a, se_b: their standard errors from the residuals (n - 2 degrees of
// freedom; 0 when n == 2, where the line passes through both points).
struct PowerLaw {
  double a = 0, b = 0, se_a = 0, se_b = 0, xbar = 0;
  int n = 0;
  double log10_at(double log10x) const { return a + b * (log10x - xbar); }
  double at(double x) const;
};

// Needs at least two distinct x and every x, y > 0; otherwise std::invalid_argument.
PowerLaw fit_power_law(const std::vector<double>& x, const std::vector<double>& y);

// Where two fitted laws meet: log10 x* with its standard error, propagated
// to first order from the four independent parameters (the two fits share no
// data). nullopt when the exponents are equal (to 1e-9).
struct Meeting {
  double log10x = 0, se = 0;
};
std::optional<Meeting> meeting(const PowerLaw& p, const PowerLaw& q);

// The seed spread of two models' results, as the verdicts judge it: p's
// values are `better` than q's when every one of them beats every one of q's
// (their min-max ranges do not meet), `worse` when every one loses, `level`
// otherwise — a difference that the seeds' spread covers.
enum class Order { better, worse, level };
Order compare(const std::vector<double>& p, const std::vector<double>& q, bool higher_is_better);

// Mean, minimum and maximum of a non-empty sample.
struct Range {
  double mean = 0, lo = 0, hi = 0;
};
Range range_of(const std::vector<double>& v);
// "1.627 (1.610 to 1.640)" with `digits` decimals; the mean alone for one value.
std::string format_range(const Range& r, int digits);

}  // namespace tg::study
