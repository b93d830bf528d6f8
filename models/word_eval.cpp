#include "models/word_eval.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

namespace tg::models {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Lower-cased word -> id of its first (most frequent) spelling among the first `limit` words.
std::unordered_map<std::string, int32_t> lower_index(const KeyedVectors& kv, int64_t limit) {
  std::unordered_map<std::string, int32_t> m;
  const int64_t n = std::min(kv.size(), limit);
  for (int64_t i = 0; i < n; ++i) m.emplace(lower(kv.words[i]), static_cast<int32_t>(i));
  return m;
}

// Unit-length copies of the first n rows.
std::vector<float> unit_rows(const KeyedVectors& kv, int64_t n) {
  std::vector<float> out(kv.vectors.begin(), kv.vectors.begin() + n * kv.dim);
  for (int64_t i = 0; i < n; ++i) {
    float* r = out.data() + i * kv.dim;
    double norm = 0;
    for (int64_t c = 0; c < kv.dim; ++c) norm += static_cast<double>(r[c]) * r[c];
    const float inv = norm > 0 ? static_cast<float>(1.0 / std::sqrt(norm)) : 0.0f;
    for (int64_t c = 0; c < kv.dim; ++c) r[c] *= inv;
  }
  return out;
}

std::vector<double> ranks(const std::vector<double>& x) {
  std::vector<size_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return x[a] < x[b]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < order.size();) {
    size_t j = i;
    while (j + 1 < order.size() && x[order[j + 1]] == x[order[i]]) ++j;
    const double avg = (static_cast<double>(i) + static_cast<double>(j)) / 2.0 + 1.0;
    for (size_t m = i; m <= j; ++m) r[order[m]] = avg;
    i = j + 1;
  }
  return r;
}

std::ifstream open_eval(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in) throw ValueError(fmt::format("{}: cannot open {}", what, path));
  return in;
}

}  // namespace

double cosine(const KeyedVectors& kv, int32_t a, int32_t b) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t c = 0; c < kv.dim; ++c) {
    dot += static_cast<double>(kv.row(a)[c]) * kv.row(b)[c];
    na += static_cast<double>(kv.row(a)[c]) * kv.row(a)[c];
    nb += static_cast<double>(kv.row(b)[c]) * kv.row(b)[c];
  }
  return na > 0 && nb > 0 ? dot / std::sqrt(na * nb) : 0.0;
}

std::vector<std::pair<std::string, double>> nearest(const KeyedVectors& kv, const std::string& word, int64_t k) {
  const int32_t w = kv.id(word);
  if (w < 0) throw ValueError(fmt::format("nearest: \"{}\" is not in the vocabulary ({} words)", word, kv.size()));
  std::vector<std::pair<double, int32_t>> scored;
  for (int32_t i = 0; i < kv.size(); ++i)
    if (i != w) scored.emplace_back(cosine(kv, w, i), i);
  const size_t n = std::min<size_t>(scored.size(), static_cast<size_t>(std::max<int64_t>(0, k)));
  std::partial_sort(scored.begin(), scored.begin() + n, scored.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<std::pair<std::string, double>> out;
  for (size_t i = 0; i < n; ++i) out.emplace_back(kv.words[scored[i].second], scored[i].first);
  return out;
}

double pearson(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.size() < 2)
    throw ValueError(fmt::format("pearson: needs two equal-length series of at least 2 values, got {} and {}",
                                 x.size(), y.size()));
  const double n = static_cast<double>(x.size());
  const double mx = std::accumulate(x.begin(), x.end(), 0.0) / n, my = std::accumulate(y.begin(), y.end(), 0.0) / n;
  double sxy = 0, sxx = 0, syy = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    sxy += (x[i] - mx) * (y[i] - my);
    sxx += (x[i] - mx) * (x[i] - mx);
    syy += (y[i] - my) * (y[i] - my);
  }
  return sxx > 0 && syy > 0 ? sxy / std::sqrt(sxx * syy) : 0.0;
}

double spearman(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size()) throw ValueError(fmt::format("spearman: series of {} and {} values", x.size(), y.size()));
  return pearson(ranks(x), ranks(y));
}

SimilarityResult evaluate_similarity(const KeyedVectors& kv, const std::string& path) {
  auto in = open_eval(path, "evaluate_similarity");
  const auto index = lower_index(kv, kv.size());
  SimilarityResult res;
  std::vector<double> human, model;
  std::string text;
  bool first_data = true;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos || text[text.find_first_not_of(" \t")] == '#') continue;
    std::istringstream ls(text);
    std::string a, b, score_text, extra;
    if (!(ls >> a >> b >> score_text))
      throw ValueError(fmt::format("{}:{}: expected \"word1<TAB>word2<TAB>score\", got \"{}\"", path, line, text));
    char* end = nullptr;
    const double score = std::strtod(score_text.c_str(), &end);
    if (end != score_text.c_str() + score_text.size()) {
      if (first_data) {  // a header such as "Word 1<TAB>Word 2<TAB>Human (mean)"
        first_data = false;
        continue;
      }
      throw ValueError(fmt::format("{}:{}: score \"{}\" is not a number", path, line, score_text));
    }
    // NaN, infinities and numbers beyond the double range (1e400) would make
    // the correlations meaningless (and NaN breaks the sort that ranks scores).
    if (!std::isfinite(score))
      throw ValueError(fmt::format("{}:{}: score \"{}\" is not a finite number", path, line, score_text));
    first_data = false;
    ++res.pairs;
    auto ia = index.find(lower(a)), ib = index.find(lower(b));
    if (ia == index.end() || ib == index.end()) {
      ++res.oov;
      continue;
    }
    human.push_back(score);
    model.push_back(cosine(kv, ia->second, ib->second));
  }
  if (res.pairs == 0) throw ValueError(fmt::format("evaluate_similarity: {} has no word pairs", path));
  if (human.size() >= 2) {
    res.spearman = spearman(human, model);
    res.pearson = pearson(human, model);
  }
  return res;
}

AnalogyResult evaluate_analogies(const KeyedVectors& kv, const std::string& path, int64_t restrict_vocab) {
  auto in = open_eval(path, "evaluate_analogies");
  const int64_t n = std::min(kv.size(), restrict_vocab);
  const auto index = lower_index(kv, n);
  const std::vector<float> unit = unit_rows(kv, n);
  const int64_t dim = kv.dim;
  AnalogyResult res;
  std::vector<float> target(dim);
  // A section enters the result with its first question, so a file of
  // section lines alone costs no memory per line.
  std::string text, section;
  bool seen_section = false, section_open = false;
  for (int64_t line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;
    if (text[0] == ':') {
      section = text.substr(1);
      section.erase(0, section.find_first_not_of(' '));
      seen_section = true, section_open = false;
      continue;
    }
    std::istringstream ls(text);
    std::string w[4], extra;
    if (!(ls >> w[0] >> w[1] >> w[2] >> w[3]) || (ls >> extra))
      throw ValueError(fmt::format("{}:{}: expected four words \"a b c d\", got \"{}\"", path, line, text));
    if (!seen_section)
      throw ValueError(fmt::format("{}:{}: question before the first \": section\" line", path, line));
    if (!section_open) res.sections.push_back({section}), section_open = true;
    AnalogySection& sec = res.sections.back();
    ++sec.total;
    int32_t id[4];
    bool known = true;
    for (int i = 0; i < 4; ++i) {
      auto it = index.find(lower(w[i]));
      known = known && it != index.end();
      id[i] = known ? it->second : -1;
    }
    if (!known) continue;
    ++sec.seen;
    for (int64_t c = 0; c < dim; ++c)
      target[c] = unit[id[1] * dim + c] - unit[id[0] * dim + c] + unit[id[2] * dim + c];
    int32_t best = -1;
    float best_score = -INFINITY;
    for (int32_t i = 0; i < n; ++i) {
      if (i == id[0] || i == id[1] || i == id[2]) continue;
      const float* r = unit.data() + static_cast<int64_t>(i) * dim;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int64_t c = 0; c < dim; ++c) s += r[c] * target[c];
      if (s > best_score) {
        best_score = s;
        best = i;
      }
    }
    if (best == id[3]) ++sec.correct;
  }
  for (const auto& s : res.sections) {
    res.correct += s.correct;
    res.seen += s.seen;
    res.total += s.total;
  }
  if (res.total == 0) throw ValueError(fmt::format("evaluate_analogies: {} has no questions", path));
  return res;
}

}  // namespace tg::models
