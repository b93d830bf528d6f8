#include "models/word2vec.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>

namespace tg::models {

int32_t Vocab::id(const std::string& word) const {
  auto it = index.find(word);
  return it == index.end() ? -1 : it->second;
}

int32_t KeyedVectors::id(const std::string& word) const {
  auto it = index.find(word);
  return it == index.end() ? -1 : it->second;
}

void KeyedVectors::rebuild_index() {
  index.clear();
  for (size_t i = 0; i < words.size(); ++i) index.emplace(words[i], static_cast<int32_t>(i));
}

Vocab build_vocab(const Sentences& sentences, int64_t min_count, int64_t max_size) {
  std::unordered_map<std::string, int64_t> counts;
  for (const auto& s : sentences)
    for (const auto& w : s) ++counts[w];
  std::vector<std::pair<std::string, int64_t>> kept;
  for (auto& [w, c] : counts)
    if (c >= min_count) kept.emplace_back(w, c);
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (max_size > 0 && static_cast<int64_t>(kept.size()) > max_size) kept.resize(max_size);
  Vocab v;
  for (auto& [w, c] : kept) {
    v.index.emplace(w, static_cast<int32_t>(v.words.size()));
    v.words.push_back(w);
    v.counts.push_back(c);
    v.total += c;
  }
  return v;
}

double keep_probability(int64_t count, int64_t total, double sample) {
  if (sample <= 0 || count <= 0) return 1.0;
  const double threshold = sample * static_cast<double>(total);
  const double c = static_cast<double>(count);
  return std::min(1.0, (std::sqrt(c / threshold) + 1.0) * threshold / c);
}

std::vector<uint32_t> unigram_table(const std::vector<int64_t>& counts, double power) {
  const double domain = 2147483647.0;  // 2^31 - 1, as gensim
  double z = 0;
  for (int64_t c : counts) z += std::pow(static_cast<double>(c), power);
  std::vector<uint32_t> table(counts.size());
  double cum = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    cum += std::pow(static_cast<double>(counts[i]), power);
    table[i] = static_cast<uint32_t>(std::llround(cum / z * domain));
  }
  return table;
}

double learning_rate(double alpha, double min_alpha, double progress) {
  return std::max(min_alpha, alpha - (alpha - min_alpha) * progress);
}

Word2Vec::Word2Vec(Word2VecOptions o) : options_(o) {
  if (o.dim < 1 || o.window < 1 || o.negative < 0 || o.epochs < 1 || o.threads < 1 || o.min_count < 1)
    throw ValueError(fmt::format(
        "Word2Vec: dim {}, window {}, epochs {}, threads {}, min_count {} must be positive and negative {} >= 0",
        o.dim, o.window, o.epochs, o.threads, o.min_count, o.negative));
}

void Word2Vec::build(const Sentences& sentences) {
  vocab_ = build_vocab(sentences, options_.min_count, options_.max_vocab);
  if (vocab_.size() == 0)
    throw ValueError(fmt::format("Word2Vec: no word occurs min_count={} times in {} sentences",
                                 options_.min_count, sentences.size()));
  Generator gen(options_.seed);
  model_ = std::make_shared<SkipGram>(vocab_.size(), options_.dim, &gen);
  keep_threshold_.resize(vocab_.size());
  for (int64_t i = 0; i < vocab_.size(); ++i) {
    const double p = keep_probability(vocab_.counts[i], vocab_.total, options_.sample);
    keep_threshold_[i] = p >= 1.0 ? UINT32_MAX : static_cast<uint32_t>(std::llround(p * 4294967296.0));
  }
  cum_table_ = unigram_table(vocab_.counts);
  ids_.clear();
  raw_len_.clear();
  raw_words_ = 0;
  // gensim splits sentences longer than 10,000 words the same way.
  constexpr size_t max_len = 10000;
  for (const auto& s : sentences) {
    for (size_t start = 0; start < s.size() || start == 0; start += max_len) {
      const size_t stop = std::min(s.size(), start + max_len);
      std::vector<int32_t> ids;
      for (size_t i = start; i < stop; ++i)
        if (int32_t id = vocab_.id(s[i]); id >= 0) ids.push_back(id);
      ids_.push_back(std::move(ids));
      raw_len_.push_back(static_cast<int64_t>(stop - start));
      raw_words_ += static_cast<int64_t>(stop - start);
      if (stop == s.size()) break;
    }
  }
}

namespace {

// word2vec's linear congruential generator: one per thread, cheap and replayable.
struct Lcg {
  uint64_t state;
  uint32_t next() {
    state = state * 25214903917ULL + 11;
    return static_cast<uint32_t>(state >> 16);
  }
};

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// The SGD step for one (input, output) pair and its negatives: all dot
// products first, at the current values, so the step is exactly the gradient
// of SkipGram::loss for that pair even when a negative repeats.
inline void sgns_update(float* __restrict v, float* __restrict ctx, int64_t dim, int32_t output,
                        const int32_t* negs, int64_t k, float alpha, float* __restrict grad,
                        float* __restrict coef) {
  for (int64_t d = 0; d <= k; ++d) {
    const float* u = ctx + static_cast<int64_t>(d == 0 ? output : negs[d - 1]) * dim;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < dim; ++c) dot += v[c] * u[c];
    coef[d] = ((d == 0 ? 1.0f : 0.0f) - sigmoid(dot)) * alpha;
  }
  for (int64_t c = 0; c < dim; ++c) grad[c] = 0;
  bool distinct = true;
  for (int64_t a = 0; a < k; ++a)
    for (int64_t b = a + 1; b < k; ++b) distinct = distinct && negs[a] != negs[b];
  if (distinct) {  // the usual case: one pass per row
    for (int64_t d = 0; d <= k; ++d) {
      float* u = ctx + static_cast<int64_t>(d == 0 ? output : negs[d - 1]) * dim;
      const float g = coef[d];
      for (int64_t c = 0; c < dim; ++c) {
        grad[c] += g * u[c];
        u[c] += g * v[c];
      }
    }
    for (int64_t c = 0; c < dim; ++c) v[c] += grad[c];
    return;
  }
  // A repeated negative: the input's gradient reads every context row before any is updated.
  for (int64_t d = 0; d <= k; ++d) {
    const float* u = ctx + static_cast<int64_t>(d == 0 ? output : negs[d - 1]) * dim;
    const float g = coef[d];
    for (int64_t c = 0; c < dim; ++c) grad[c] += g * u[c];
  }
  for (int64_t d = 0; d <= k; ++d) {
    float* u = ctx + static_cast<int64_t>(d == 0 ? output : negs[d - 1]) * dim;
    const float g = coef[d];
    for (int64_t c = 0; c < dim; ++c) u[c] += g * v[c];
  }
  for (int64_t c = 0; c < dim; ++c) v[c] += grad[c];
}

}  // namespace

void Word2Vec::run_slice(int64_t epoch, size_t begin, size_t end, uint64_t stream, std::vector<SgnsStep>* record) {
  const int64_t dim = options_.dim, window = options_.window, k = options_.negative;
  float* center = model_->center.data<float>();
  float* ctx = model_->context.data<float>();
  const uint32_t table_max = cum_table_.back();
  Lcg rng{options_.seed * 0x9e3779b97f4a7c15ULL + stream * 1000003ULL + static_cast<uint64_t>(epoch) * 7919ULL + 1};
  std::vector<float> grad(dim), coef(k + 1);
  std::vector<int32_t> kept, negs(k);
  std::vector<int64_t> reduced;
  const double total = static_cast<double>(raw_words_) * static_cast<double>(options_.epochs);
  for (size_t s = begin; s < end; ++s) {
    const double progress = static_cast<double>(words_done_.load(std::memory_order_relaxed)) / total;
    const float alpha = static_cast<float>(learning_rate(options_.alpha, options_.min_alpha, progress));
    kept.clear();
    for (int32_t id : ids_[s])
      if (keep_threshold_[id] == UINT32_MAX || rng.next() < keep_threshold_[id]) kept.push_back(id);
    const int64_t n = static_cast<int64_t>(kept.size());
    reduced.resize(n);
    for (int64_t i = 0; i < n; ++i) reduced[i] = rng.next() % window;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = reduced[i];
      const int64_t lo = std::max<int64_t>(0, i - window + b), hi = std::min<int64_t>(n, i + window + 1 - b);
      for (int64_t j = lo; j < hi; ++j) {
        if (j == i) continue;
        // As gensim: the neighbour's center vector predicts the word at i.
        const int32_t output = kept[i], input = kept[j];
        int64_t m = 0;
        for (int64_t d = 0; d < k; ++d) {
          const uint32_t r = rng.next() % table_max;
          const int32_t neg = static_cast<int32_t>(
              std::upper_bound(cum_table_.begin(), cum_table_.end(), r) - cum_table_.begin());
          if (neg != output) negs[m++] = neg;
        }
        if (record) record->push_back({input, output, std::vector<int32_t>(negs.begin(), negs.begin() + m), alpha});
        sgns_update(center + static_cast<int64_t>(input) * dim, ctx, dim, output, negs.data(), m, alpha,
                    grad.data(), coef.data());
      }
    }
    words_done_.fetch_add(raw_len_[s], std::memory_order_relaxed);
  }
}

void Word2Vec::train(const Sentences& sentences, const std::function<void(const TrainProgress&)>& on_progress,
                     std::vector<SgnsStep>* record) {
  if (!model_) build(sentences);
  if (record && options_.threads != 1)
    throw ValueError(fmt::format("Word2Vec::train: recording steps needs threads=1, got {}", options_.threads));
  const auto start = std::chrono::steady_clock::now();
  const auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const int64_t total = raw_words_ * options_.epochs;
  const auto report = [&] {
    if (!on_progress) return;
    const int64_t done = words_done_.load();
    on_progress({done, total,
                 learning_rate(options_.alpha, options_.min_alpha, static_cast<double>(done) / std::max<int64_t>(1, total)),
                 seconds()});
  };
  words_done_ = 0;
  const size_t n = ids_.size();
  for (int64_t epoch = 0; epoch < options_.epochs; ++epoch) {
    // Each thread takes a contiguous slice of sentences with its own RNG stream.
    std::vector<std::thread> threads;
    std::atomic<int64_t> running{options_.threads};
    for (int64_t t = 0; t < options_.threads; ++t) {
      const size_t b = n * t / options_.threads, e = n * (t + 1) / options_.threads;
      threads.emplace_back([this, epoch, b, e, t, record, &running] {
        run_slice(epoch, b, e, static_cast<uint64_t>(t), record);
        running.fetch_sub(1);
      });
    }
    while (running.load() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      report();
    }
    for (auto& th : threads) th.join();
  }
  train_seconds_ = seconds();
  report();
}

KeyedVectors Word2Vec::vectors() const {
  KeyedVectors kv;
  kv.words = vocab_.words;
  kv.dim = options_.dim;
  kv.vectors = model_->center.contiguous().to_vector<float>();
  kv.rebuild_index();
  return kv;
}

void save_word2vec(const KeyedVectors& kv, const std::string& path, bool binary) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw ValueError(fmt::format("save_word2vec: cannot write {}", path));
  out << kv.size() << ' ' << kv.dim << '\n';
  for (int64_t i = 0; i < kv.size(); ++i) {
    const float* r = kv.row(static_cast<int32_t>(i));
    if (binary) {
      out << kv.words[i] << ' ';
      out.write(reinterpret_cast<const char*>(r), static_cast<std::streamsize>(kv.dim * sizeof(float)));
      out << '\n';
    } else {
      std::string line = kv.words[i];
      for (int64_t c = 0; c < kv.dim; ++c) line += fmt::format(" {}", r[c]);
      out << line << '\n';
    }
  }
  if (!out) throw ValueError(fmt::format("save_word2vec: write to {} failed", path));
}

KeyedVectors load_word2vec(const std::string& path, bool binary) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ValueError(fmt::format("load_word2vec: cannot open {}", path));
  std::string header;
  std::getline(in, header);
  KeyedVectors kv;
  int64_t v = -1;
  {
    std::istringstream hs(header);
    if (!(hs >> v >> kv.dim) || v < 0 || kv.dim < 1)
      throw ValueError(fmt::format("{}:1: expected a header \"<words> <dim>\", got \"{}\"", path, header));
  }
  kv.words.reserve(v);
  kv.vectors.resize(v * kv.dim);
  for (int64_t i = 0; i < v; ++i) {
    const int64_t line = i + 2;
    float* r = kv.vectors.data() + i * kv.dim;
    if (binary) {
      std::string word;
      int ch;
      while ((ch = in.get()) != EOF && (ch == '\n' || ch == '\r')) {}
      while (ch != EOF && ch != ' ') {
        word += static_cast<char>(ch);
        ch = in.get();
      }
      in.read(reinterpret_cast<char*>(r), static_cast<std::streamsize>(kv.dim * sizeof(float)));
      if (ch == EOF || word.empty() || !in)
        throw ValueError(fmt::format("{}: vector {} of {} is truncated", path, i + 1, v));
      kv.words.push_back(std::move(word));
    } else {
      std::string text;
      if (!std::getline(in, text))
        throw ValueError(fmt::format("{}:{}: file ends after {} of {} vectors", path, line, i, v));
      std::istringstream ls(text);
      std::string word;
      ls >> word;
      for (int64_t c = 0; c < kv.dim; ++c)
        if (!(ls >> r[c]))
          throw ValueError(fmt::format("{}:{}: expected {} numbers after \"{}\"", path, line, kv.dim, word));
      kv.words.push_back(std::move(word));
    }
  }
  kv.rebuild_index();
  return kv;
}

}  // namespace tg::models
