#pragma once
// Evaluation of word vectors: nearest neighbours, word-pair similarity against
// human scores (WordSim-353 / SimLex-999 files) and 3CosAdd analogies
// (questions-words.txt). Words are matched case-insensitively as gensim does:
// a lower-cased word maps to its most frequent spelling in the vectors.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "word2vec.h"

namespace tg::models {

// The k words closest to `word` by cosine, best first, the word itself
// excluded. ValueError when the word is not in the vectors.
std::vector<std::pair<std::string, double>> nearest(const KeyedVectors& kv, const std::string& word, int64_t k);
double cosine(const KeyedVectors& kv, int32_t a, int32_t b);

// The files below are read a line at a time; what is kept per line (a score
// pair, a section) stays within 16 times the file's size.

// Spearman's rank correlation with ties given their average rank.
double spearman(const std::vector<double>& x, const std::vector<double>& y);
double pearson(const std::vector<double>& x, const std::vector<double>& y);

struct SimilarityResult {
  double spearman = 0, pearson = 0;
  int64_t pairs = 0, oov = 0;  // pairs in the file; pairs skipped for an unknown word
};
// Lines "word1<TAB>word2<TAB>score" (spaces also separate); `#` lines and blank
// lines skipped; a first line whose score is not a number is taken as a
// header. ValueError with file:line for a malformed line or a score that is
// NaN, infinite or beyond the double range.
SimilarityResult evaluate_similarity(const KeyedVectors& kv, const std::string& path);

struct AnalogySection {
  std::string name;
  int64_t correct = 0, seen = 0, total = 0;  // seen: questions whose four words are known
};
struct AnalogyResult {
  std::vector<AnalogySection> sections;
  int64_t correct = 0, seen = 0, total = 0;
  double accuracy() const { return seen ? static_cast<double>(correct) / seen : 0; }
  double coverage() const { return total ? static_cast<double>(seen) / total : 0; }
};
// questions-words.txt: ": section" lines, then "a b c d" meaning a:b :: c:d
// (a section without questions is left out of the result).
// The answer is the word nearest to b - a + c (unit vectors) among the
// restrict_vocab most frequent words, a, b and c excluded.
AnalogyResult evaluate_analogies(const KeyedVectors& kv, const std::string& path, int64_t restrict_vocab = 30000);

}  // namespace tg::models
