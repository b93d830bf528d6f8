#include "models/word2vec.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "autograd/atomic_file.h"

namespace tg::models {

int32_t KeyedVectors::id(const std::string& word) const {
  auto it = index.find(word);
  return it == index.end() ? -1 : it->second;
}

void KeyedVectors::rebuild_index() {
  index.clear();
  index.reserve(words.size());
  for (size_t i = 0; i < words.size(); ++i) index.emplace(words[i], static_cast<int32_t>(i));
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

UnigramSampler::UnigramSampler(std::vector<uint32_t> cum_table) : table_(std::move(cum_table)) {
  if (table_.empty() || table_.back() == 0)
    throw ValueError(fmt::format("UnigramSampler: the table has {} entries and sums to {}; expected a positive sum",
                                 table_.size(), table_.empty() ? 0 : table_.back()));
  // About four buckets per word keeps the scan to one or two steps, and the
  // bucket array (256 KiB for 15k words, 1 MiB at most) in L2.
  const int bucket_bits = std::clamp(static_cast<int>(std::bit_width(table_.size())) + 2, 4, 18);
  shift_ = std::max(0, static_cast<int>(std::bit_width(table_.back() - 1)) - bucket_bits);
  start_.resize(((table_.back() - 1) >> shift_) + 1);
  for (size_t b = 0; b < start_.size(); ++b)
    start_[b] = static_cast<int32_t>(
        std::upper_bound(table_.begin(), table_.end(), static_cast<uint32_t>(b << shift_)) - table_.begin());
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

void Word2Vec::build(const data::TokenCorpus& corpus) {
  vocab_ = data::build_vocab(corpus, options_.min_count, options_.max_vocab);
  if (vocab_.size() == 0)
    throw ValueError(fmt::format("Word2Vec: no word occurs min_count={} times in {} sentences",
                                 options_.min_count, corpus.sentences()));
  Generator gen(options_.seed);
  model_ = std::make_shared<SkipGram>(vocab_.size(), options_.dim, &gen);
  keep_threshold_.resize(vocab_.size());
  for (int64_t i = 0; i < vocab_.size(); ++i) {
    const double p = keep_probability(vocab_.counts[i], vocab_.total, options_.sample);
    keep_threshold_[i] = p >= 1.0 ? UINT32_MAX : static_cast<uint32_t>(std::llround(p * 4294967296.0));
  }
  sampler_ = UnigramSampler(unigram_table(vocab_.counts));
  std::vector<int32_t> to_vocab(corpus.distinct());
  for (int32_t i = 0; i < corpus.distinct(); ++i) to_vocab[i] = vocab_.id(corpus.word(i));
  // Reserved exactly (the kept words' counts sum to the in-vocabulary
  // tokens): growing by doubling would briefly hold twice the corpus.
  ids_.clear();
  ids_.reserve(vocab_.total);
  begin_.assign(1, 0);
  begin_.reserve(corpus.sentences() + 1);
  raw_len_.clear();
  raw_len_.reserve(corpus.sentences());
  raw_words_ = 0;
  // gensim splits sentences longer than 10,000 words the same way.
  constexpr int64_t max_len = 10000;
  const auto& tokens = corpus.token_ids();
  const auto& offsets = corpus.offsets();
  for (int64_t s = 0; s < corpus.sentences(); ++s) {
    for (int64_t start = offsets[s]; start < offsets[s + 1]; start += max_len) {
      const int64_t stop = std::min(offsets[s + 1], start + max_len);
      for (int64_t i = start; i < stop; ++i)
        if (int32_t id = to_vocab[tokens[i]]; id >= 0) ids_.push_back(id);
      begin_.push_back(static_cast<int64_t>(ids_.size()));
      raw_len_.push_back(static_cast<int32_t>(stop - start));
      raw_words_ += stop - start;
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

// The SGD step for one pair: the input row v and the context rows rows[0]
// (the output word, label 1) and rows[1..n) (its negatives, label 0). All
// dot products come first, at the current values, so the step is exactly the
// gradient of SkipGram::loss for that pair even when a negative repeats.
// Dim > 0 fixes the size at compile time (gensim's 100) so the loops unroll.
template <int64_t Dim>
inline void sgns_update(float* __restrict v, float* __restrict ctx, int64_t dim_, const int32_t* rows, int64_t n,
                        float alpha, float* __restrict grad, float* __restrict coef) {
  const int64_t dim = Dim > 0 ? Dim : dim_;
  for (int64_t d = 0; d < n; ++d) {
    const float* u = ctx + static_cast<int64_t>(rows[d]) * dim;
    float dot = 0;
#pragma omp simd reduction(+ : dot)
    for (int64_t c = 0; c < dim; ++c) dot += v[c] * u[c];
    coef[d] = ((d == 0 ? 1.0f : 0.0f) - sigmoid(dot)) * alpha;
  }
  bool distinct = true;
  for (int64_t a = 1; a < n; ++a)
    for (int64_t b = a + 1; b < n; ++b) distinct = distinct && rows[a] != rows[b];
  for (int64_t c = 0; c < dim; ++c) grad[c] = 0;
  if (distinct) {  // the usual case: one pass per row
    for (int64_t d = 0; d < n; ++d) {
      float* u = ctx + static_cast<int64_t>(rows[d]) * dim;
      const float g = coef[d];
#pragma omp simd
      for (int64_t c = 0; c < dim; ++c) {
        grad[c] += g * u[c];
        u[c] += g * v[c];
      }
    }
  } else {  // a repeated negative: the input's gradient reads every row before any is updated
    for (int64_t d = 0; d < n; ++d) {
      const float* u = ctx + static_cast<int64_t>(rows[d]) * dim;
      for (int64_t c = 0; c < dim; ++c) grad[c] += coef[d] * u[c];
    }
    for (int64_t d = 0; d < n; ++d) {
      float* u = ctx + static_cast<int64_t>(rows[d]) * dim;
      for (int64_t c = 0; c < dim; ++c) u[c] += coef[d] * v[c];
    }
  }
  for (int64_t c = 0; c < dim; ++c) v[c] += grad[c];
}

}  // namespace

void Word2Vec::run_slice(int64_t epoch, size_t begin, size_t end, uint64_t stream, std::vector<SgnsStep>* record) {
  const int64_t dim = options_.dim, window = options_.window, k = options_.negative;
  float* center = model_->center.data<float>();
  float* ctx = model_->context.data<float>();
  Lcg rng{options_.seed * 0x9e3779b97f4a7c15ULL + stream * 1000003ULL + static_cast<uint64_t>(epoch) * 7919ULL + 1};
  std::vector<float> grad(dim), coef(k + 1);
  std::vector<int32_t> kept;
  std::vector<int64_t> reduced;
  std::vector<int32_t> rows(k + 1);  // a pair's context rows: its output word, then its negatives
  const double total = static_cast<double>(raw_words_) * static_cast<double>(options_.epochs);
  for (size_t s = begin; s < end; ++s) {
    const double progress = static_cast<double>(words_done_.load(std::memory_order_relaxed)) / total;
    const float alpha = static_cast<float>(learning_rate(options_.alpha, options_.min_alpha, progress));
    kept.clear();
    for (int64_t t = begin_[s]; t < begin_[s + 1]; ++t) {
      const int32_t id = ids_[t];
      if (keep_threshold_[id] == UINT32_MAX || rng.next() < keep_threshold_[id]) kept.push_back(id);
    }
    const int64_t n = static_cast<int64_t>(kept.size());
    reduced.resize(n);
    for (int64_t i = 0; i < n; ++i) reduced[i] = rng.next() % window;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t b = reduced[i];
      const int64_t lo = std::max<int64_t>(0, i - window + b), hi = std::min<int64_t>(n, i + window + 1 - b);
      for (int64_t j = lo; j < hi; ++j) {
        if (j == i) continue;
        // As gensim: the neighbour's center vector predicts the word at i.
        const int32_t input = kept[j];
        rows[0] = kept[i];
        int64_t m = 1;
        for (int64_t d = 0; d < k; ++d)
          if (const int32_t neg = sampler_.draw(rng.next()); neg != rows[0]) rows[m++] = neg;
        if (record) record->push_back({input, rows[0], std::vector<int32_t>(rows.begin() + 1, rows.begin() + m), alpha});
        float* v = center + static_cast<int64_t>(input) * dim;
        if (dim == 100)
          sgns_update<100>(v, ctx, dim, rows.data(), m, alpha, grad.data(), coef.data());
        else
          sgns_update<0>(v, ctx, dim, rows.data(), m, alpha, grad.data(), coef.data());
      }
    }
    words_done_.fetch_add(raw_len_[s], std::memory_order_relaxed);
  }
}

void Word2Vec::train(const data::Sentences& sentences, const std::function<void(const TrainProgress&)>& on_progress,
                     std::vector<SgnsStep>* record) {
  if (!model_) build(sentences);
  train(on_progress, record);
}

void Word2Vec::train(const std::function<void(const TrainProgress&)>& on_progress, std::vector<SgnsStep>* record) {
  if (!model_) throw ValueError("Word2Vec::train: call build(corpus) first");
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
  // Each thread takes a contiguous slice of sentences holding about the same
  // number of in-vocabulary words, with its own RNG stream.
  const int64_t threads = options_.threads;
  std::vector<size_t> split(threads + 1, begin_.size() - 1);
  for (int64_t t = 0; t < threads; ++t)
    split[t] = static_cast<size_t>(
        std::lower_bound(begin_.begin(), begin_.end(), static_cast<int64_t>(ids_.size()) * t / threads) -
        begin_.begin());
  for (int64_t epoch = 0; epoch < options_.epochs; ++epoch) {
    // The caller's thread reports progress until the workers are done, woken
    // at once by the last one (a plain sleep would idle up to 100 ms an epoch).
    std::mutex mutex;
    std::condition_variable done;
    int64_t running = threads;
    std::vector<std::thread> workers;
    for (int64_t t = 0; t < threads; ++t)
      workers.emplace_back([&, epoch, t] {
        run_slice(epoch, split[t], split[t + 1], static_cast<uint64_t>(t), record);
        std::lock_guard lock(mutex);
        if (--running == 0) done.notify_one();
      });
    {
      std::unique_lock lock(mutex);
      while (!done.wait_for(lock, std::chrono::milliseconds(100), [&] { return running == 0; })) {
        lock.unlock();
        report();
        lock.lock();
      }
    }
    for (auto& th : workers) th.join();
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
  tg::detail::AtomicFile out(path, [](const std::string& message) { throw ValueError("save_word2vec: " + message); });
  std::string buffer = fmt::format("{} {}\n", kv.size(), kv.dim);
  for (int64_t i = 0; i < kv.size(); ++i) {
    const float* r = kv.row(static_cast<int32_t>(i));
    buffer += kv.words[i];
    if (binary) {
      buffer += ' ';
      buffer.append(reinterpret_cast<const char*>(r), kv.dim * sizeof(float));
    } else {
      for (int64_t c = 0; c < kv.dim; ++c) buffer += fmt::format(" {}", r[c]);
    }
    buffer += '\n';
    if (buffer.size() >= (size_t{1} << 20)) {  // written a MiB at a time
      out.write(buffer.data(), buffer.size());
      buffer.clear();
    }
  }
  out.write(buffer.data(), buffer.size());
  out.commit();
}

KeyedVectors load_word2vec(const std::string& path, bool binary) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw ValueError(fmt::format("load_word2vec: {} is not a readable file", path));
  const uintmax_t file_bytes = std::filesystem::file_size(path, ec);
  std::ifstream in(path, std::ios::binary);
  if (!in || ec) throw ValueError(fmt::format("load_word2vec: cannot open {}", path));
  std::string header;
  std::getline(in, header);
  KeyedVectors kv;
  int64_t v = -1;
  {
    std::istringstream hs(header);
    if (!(hs >> v >> kv.dim) || v < 0 || kv.dim < 1)
      throw ValueError(fmt::format("{}:1: expected a header \"<words> <dim>\", got \"{}\"", path, header));
  }
  // The header's counts are checked against what the rest of the file can
  // hold before anything is reserved: a vector takes at least 1 + 2*dim bytes
  // in text ("w 0 0 ...") and 2 + 4*dim in binary (word, space, float32s), so
  // the vectors never need more than twice the file's bytes.
  const uint64_t rest = file_bytes - std::min<uint64_t>(file_bytes, header.size() + 1);
  const uint64_t dim = static_cast<uint64_t>(kv.dim);
  if (v > 0 && (dim > rest || static_cast<uint64_t>(v) > rest / (binary ? 2 + 4 * dim : 1 + 2 * dim)))
    throw ValueError(fmt::format("{}:1: the header claims {} vectors of {} numbers, more than the {} bytes after it "
                                 "can hold", path, v, kv.dim, rest));
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
    // NaN or infinite components would make every similarity with the word
    // meaningless (and NaN breaks the orderings that rank neighbours).
    for (int64_t c = 0; c < kv.dim; ++c)
      if (!std::isfinite(r[c]))
        throw ValueError(fmt::format("{}: vector {} of {} (\"{}\"): component {} is {}, expected a finite number", path,
                                     i + 1, v, kv.words.back(), c, r[c]));
  }
  kv.rebuild_index();
  return kv;
}

}  // namespace tg::models
