#pragma once
// word2vec's skip-gram with negative sampling, trained the way word2vec and
// gensim do: vocabulary with min_count, subsampling of frequent words, dynamic
// window, negatives from the unigram^0.75 table, linear learning-rate decay
// over all epochs, sparse Hogwild updates on several threads. The tables live
// in a SkipGram module, so the autograd loss and the fast path share them.
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "models/skip_gram.h"

namespace tg::models {

using Sentences = std::vector<std::vector<std::string>>;

// Words sorted by count (descending), ties by word, so ids are frequency ranks.
struct Vocab {
  std::vector<std::string> words;
  std::vector<int64_t> counts;
  std::unordered_map<std::string, int32_t> index;
  int64_t total = 0;  // sum of the kept words' counts
  int32_t id(const std::string& word) const;  // -1 when absent
  int64_t size() const { return static_cast<int64_t>(words.size()); }
};
// Keeps words seen at least min_count times; max_size > 0 keeps only the most frequent.
Vocab build_vocab(const Sentences& sentences, int64_t min_count, int64_t max_size = 0);

// word2vec's keep probability for a word seen count times out of total:
// (sqrt(count / (sample*total)) + 1) * sample*total / count, capped at 1; 1 when sample <= 0.
double keep_probability(int64_t count, int64_t total, double sample);
// Cumulative table of count^power scaled to [0, 2^31 - 1] (gensim's cum_table):
// negative = first i with table[i] > r for r uniform in [0, table.back()).
std::vector<uint32_t> unigram_table(const std::vector<int64_t>& counts, double power = 0.75);
// Linear decay from alpha at progress 0 to min_alpha at progress 1 (fraction of
// all epochs' words), never below min_alpha.
double learning_rate(double alpha, double min_alpha, double progress);

struct Word2VecOptions {
  int64_t dim = 100;
  int64_t window = 5;
  int64_t min_count = 5;
  int64_t max_vocab = 0;  // 0: no limit
  double sample = 1e-3;
  int64_t negative = 5;
  double alpha = 0.025, min_alpha = 1e-4;
  int64_t epochs = 5;
  int64_t threads = 1;  // 1: deterministic for a given seed
  uint64_t seed = 1;
};

// One SGD step of the fast path, recorded so the autograd path can replay it:
// input row of `center`, output row of `context`, its negatives, the rate.
struct SgnsStep {
  int32_t input = 0, output = 0;
  std::vector<int32_t> negatives;
  float alpha = 0;
};

struct TrainProgress {
  int64_t words_done = 0, words_total = 0;  // raw words over all epochs
  double alpha = 0, seconds = 0;
};

// Word vectors with their words, in vocabulary order (most frequent first).
struct KeyedVectors {
  std::vector<std::string> words;
  int64_t dim = 0;
  std::vector<float> vectors;  // (V,C) row-major
  std::unordered_map<std::string, int32_t> index;
  const float* row(int32_t i) const { return vectors.data() + static_cast<int64_t>(i) * dim; }
  int64_t size() const { return static_cast<int64_t>(words.size()); }
  int32_t id(const std::string& word) const;  // -1 when absent
  void rebuild_index();
};

class Word2Vec {
 public:
  explicit Word2Vec(Word2VecOptions options);

  // Builds the vocabulary and initialises the tables (does not train).
  void build(const Sentences& sentences);
  // Trains all epochs on the sentences given to build (re-passed here so the
  // caller owns them). on_progress is called from the calling thread about
  // ten times a second; record (single thread only) receives every SGD step.
  void train(const Sentences& sentences, const std::function<void(const TrainProgress&)>& on_progress = {},
             std::vector<SgnsStep>* record = nullptr);

  const Vocab& vocab() const { return vocab_; }
  SkipGram& model() { return *model_; }
  const Word2VecOptions& options() const { return options_; }
  int64_t raw_words() const { return raw_words_; }  // corpus tokens per epoch, OOV included
  double train_seconds() const { return train_seconds_; }
  KeyedVectors vectors() const;

 private:
  void run_slice(int64_t epoch, size_t begin, size_t end, uint64_t stream, std::vector<SgnsStep>* record);

  Word2VecOptions options_;
  Vocab vocab_;
  std::shared_ptr<SkipGram> model_;
  std::vector<uint32_t> keep_threshold_;  // keep a word when rng32 < threshold (2^32 = always)
  std::vector<uint32_t> cum_table_;
  std::vector<std::vector<int32_t>> ids_;  // sentences as ids, OOV dropped
  std::vector<int64_t> raw_len_;           // raw tokens per sentence
  int64_t raw_words_ = 0;
  std::atomic<int64_t> words_done_{0};
  double train_seconds_ = 0;
};

// word2vec's formats as gensim's KeyedVectors.load_word2vec_format reads them:
// a "V C" header line, then one word per line with its C numbers (text) or
// C little-endian float32 followed by a newline (binary).
void save_word2vec(const KeyedVectors& kv, const std::string& path, bool binary);
// Throws ValueError naming the file and line for a malformed file.
KeyedVectors load_word2vec(const std::string& path, bool binary);

}  // namespace tg::models
