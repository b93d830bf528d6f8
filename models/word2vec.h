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
#include <string_view>
#include <unordered_map>
#include <vector>

#include "skip_gram.h"
#include "../data/words.h"

namespace tg::models {

// word2vec's keep probability for a word seen count times out of total:
// (sqrt(count / (sample*total)) + 1) * sample*total / count, capped at 1; 1 when sample <= 0.
double keep_probability(int64_t count, int64_t total, double sample);
// Cumulative table of count^power scaled to [0, 2^31 - 1] (gensim's cum_table):
// negative = first i with table[i] > r for r uniform in [0, table.back()).
std::vector<uint32_t> unigram_table(const std::vector<int64_t>& counts, double power = 0.75);

// Draws negatives from a unigram table: index(r) == upper_bound(table, r) -
// table.begin() for every r < table.back(), but in O(1) on average: the high
// bits of r pick a bucket that stores where the answer can start, and a short
// scan ends it (upper_bound takes ~14 unpredictable branches on Brown's 15k words).
class UnigramSampler {
 public:
  UnigramSampler() = default;
  // ValueError when the table is empty or sums to 0.
  explicit UnigramSampler(std::vector<uint32_t> cum_table);
  int32_t index(uint32_t r) const {  // r < table_max()
    int32_t i = start_[r >> shift_];
    while (table_[i] <= r) ++i;
    return i;
  }
  // A negative for 32 uniform random bits, as gensim: index(bits % table_max()).
  int32_t draw(uint32_t bits) const { return index(bits % table_max()); }
  uint32_t table_max() const { return table_.back(); }
  const std::vector<uint32_t>& table() const { return table_; }

 private:
  std::vector<uint32_t> table_;
  std::vector<int32_t> start_;  // per bucket: upper_bound of its first value
  int shift_ = 0;
};
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

  // Builds the vocabulary, keeps the corpus as vocabulary ids (the caller
  // may drop it afterwards) and initialises the tables (does not train).
  void build(const data::TokenCorpus& corpus);
  void build(const data::Sentences& sentences) { build(data::TokenCorpus(sentences)); }
  // Trains all epochs on the corpus given to build. on_progress is called
  // from the calling thread about ten times a second; record (single thread
  // only) receives every SGD step. ValueError before build.
  void train(const std::function<void(const TrainProgress&)>& on_progress = {},
             std::vector<SgnsStep>* record = nullptr);
  // Builds from the sentences first unless build was called.
  void train(const data::Sentences& sentences, const std::function<void(const TrainProgress&)>& on_progress = {},
             std::vector<SgnsStep>* record = nullptr);

  const data::Vocab& vocab() const { return vocab_; }
  SkipGram& model() { return *model_; }
  const Word2VecOptions& options() const { return options_; }
  int64_t raw_words() const { return raw_words_; }  // corpus tokens per epoch, OOV included
  double train_seconds() const { return train_seconds_; }
  KeyedVectors vectors() const;

 private:
  void run_slice(int64_t epoch, size_t begin, size_t end, uint64_t stream, std::vector<SgnsStep>* record);

  Word2VecOptions options_;
  data::Vocab vocab_;
  std::shared_ptr<SkipGram> model_;
  std::vector<uint32_t> keep_threshold_;  // keep a word when rng32 < threshold (2^32 = always)
  UnigramSampler sampler_;
  // Sentence s (split at 10,000 words as gensim) is ids_[begin_[s], begin_[s + 1]),
  // its vocabulary ids with OOV words dropped; raw_len_[s] counts them too.
  std::vector<int32_t> ids_;
  std::vector<int64_t> begin_;
  std::vector<int32_t> raw_len_;
  int64_t raw_words_ = 0;
  std::atomic<int64_t> words_done_{0};
  double train_seconds_ = 0;
};

// word2vec's formats as gensim's KeyedVectors.load_word2vec_format reads them:
// a "V C" header line, then one word per line with its C numbers (text) or
// C little-endian float32 followed by a newline (binary). Written atomically
// (a temporary file renamed over path once whole): a failed save keeps the
// file that was there.
void save_word2vec(const KeyedVectors& kv, const std::string& path, bool binary);
// Throws ValueError naming the file and line for a malformed file: one that
// is not a regular file, a header claiming more vectors than the file's size
// can hold (checked before anything is reserved: memory stays within 16 times
// the file's size, the worst being one-number vectors of short words), a
// truncated vector, a NaN or infinite component.
KeyedVectors load_word2vec(const std::string& path, bool binary);

}  // namespace tg::models
