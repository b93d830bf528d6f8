// What the parts share besides models and training: the text, CSV files read
// back by the verdicts, small formatting helpers.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <fmt/format.h>

#include "data/corpus.h"
#include "examples/study/study.h"

namespace tg::study {

const std::vector<std::string>& part_names() {
  static const std::vector<std::string> names = {"tuning", "cost", "recall", "gradients", "parallel", "scale",
                                                     "verdicts"};
  return names;
}

const Text& Study::text() {
  if (!text_) {
    data::Corpus corpus = data::load_corpus(c.data, c.brown_dir, 0.1, c.seed);
    text_ = Text{corpus.source, data::join_text(corpus.train), data::join_text(corpus.val)};
  }
  return *text_;
}

Csv::Csv(const std::string& path) : path_(path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error(fmt::format("cannot read {}", path));
  std::string line;
  auto split = [](const std::string& l) {
    std::vector<std::string> cells;
    std::stringstream ss(l);
    for (std::string cell; std::getline(ss, cell, ',');) cells.push_back(cell);
    return cells;
  };
  if (!std::getline(f, line)) throw std::runtime_error(fmt::format("{} is empty", path));
  header_ = split(line);
  for (size_t n = 2; std::getline(f, line); ++n) {
    if (line.empty()) continue;
    rows_.push_back(split(line));
    if (rows_.back().size() != header_.size())
      throw std::runtime_error(fmt::format("{} line {}: {} cells, the header has {}", path, n, rows_.back().size(),
                                           header_.size()));
  }
}

bool Csv::exists(const std::string& path) { return std::ifstream(path).good(); }

bool Csv::has(const std::string& column) const {
  return std::find(header_.begin(), header_.end(), column) != header_.end();
}

size_t Csv::col(const std::string& column) const {
  for (size_t i = 0; i < header_.size(); ++i)
    if (header_[i] == column) return i;
  throw std::runtime_error(fmt::format("{} has no column '{}'", path_, column));
}

const std::string& Csv::str(size_t row, const std::string& column) const { return rows_.at(row)[col(column)]; }

double Csv::num(size_t row, const std::string& column) const {
  const std::string& s = str(row, column);
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    if (used == s.size()) return v;
  } catch (const std::exception&) {
  }
  throw std::runtime_error(fmt::format("{} row {} column '{}': '{}' is not a number", path_, row + 1, column, s));
}

uint64_t run_seed(const Config& c, int64_t i) { return c.seed + 1000 * static_cast<uint64_t>(i); }

std::string model_file(const std::string& kind, int64_t i) { return fmt::format("{}.seed{}.safetensors", kind, i); }

DType gemm_precision(const Config& c) { return c.bf16 ? DType::bf16 : DType::f32; }

std::string part_dtype(const Config& c, const std::string& part) {
  if (part == "scale") return "mixed";  // its smallest size runs in both precisions (scale.cpp)
  return c.bf16 && part != "gradients" && part != "verdicts" ? "bf16" : "f32";
}

std::string from_tuning(const Study& s, const std::string& name) {
  const std::string p = s.path(name);
  if (!Csv::exists(p))
    throw std::runtime_error(fmt::format("{} is missing: it comes from part 1 (run --part tuning first, with the same "
                                         "--out, --data and model options)", p));
  return p;
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  double one = NAN;
  if (!(f >> one)) return "?";
  return fmt::format("{:.2f}", one);
}

std::string format_lr(double lr) {
  const int e = static_cast<int>(std::floor(std::log10(lr) + 1e-9));
  const double m = lr / std::pow(10.0, e);
  return std::fabs(m - std::round(m)) < 1e-6 ? fmt::format("{}e{}", std::lround(m), e) : fmt::format("{:.2g}", lr);
}

Spread spread(std::vector<double> sample) {
  if (sample.empty()) throw std::invalid_argument("spread: an empty sample");
  std::sort(sample.begin(), sample.end());
  auto at = [&](double q) {  // the q-quantile, between the order statistics around q (n - 1)
    const double pos = q * static_cast<double>(sample.size() - 1);
    const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, sample.size() - 1);
    return sample[lo] + (pos - static_cast<double>(lo)) * (sample[hi] - sample[lo]);
  };
  return {at(0.5), at(0.25), at(0.75)};
}

std::optional<double> crossing(const std::vector<double>& xs, const std::vector<double>& a, const std::vector<double>& b) {
  for (size_t i = 1; i < xs.size(); ++i) {
    const double d0 = a[i - 1] - b[i - 1], d1 = a[i] - b[i];
    if (d0 <= 0 && d1 > 0) {
      const double f = d0 == d1 ? 0 : d0 / (d0 - d1);  // where the difference is zero, in log x
      return std::exp(std::log(xs[i - 1]) + f * (std::log(xs[i]) - std::log(xs[i - 1])));
    }
  }
  return std::nullopt;
}

}  // namespace tg::study
