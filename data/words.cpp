#include "data/words.h"

#include <fstream>

#include <fmt/format.h>

namespace tg::data {

std::vector<std::string> split_words(std::string_view text, WordSplit split) {
  std::vector<std::string> out;
  for_each_word(text, split, [&](std::string_view w) { out.emplace_back(w); });
  return out;
}

TokenCorpus::TokenCorpus(const Sentences& sentences) {
  for (const auto& s : sentences) {
    for (const auto& w : s) add(w);
    end_sentence();
  }
}

void TokenCorpus::add(std::string_view word) {
  auto it = index_.find(word);
  if (it == index_.end()) {
    if (words_.size() >= static_cast<size_t>(INT32_MAX))
      throw ValueError(fmt::format("TokenCorpus: more than {} distinct words", INT32_MAX));
    it = index_.emplace(std::string(word), static_cast<int32_t>(words_.size())).first;
    words_.emplace_back(word);
    counts_.push_back(0);
  }
  ++counts_[it->second];
  tokens_.push_back(it->second);
}

void TokenCorpus::end_sentence() {
  if (static_cast<int64_t>(tokens_.size()) > offsets_.back()) offsets_.push_back(static_cast<int64_t>(tokens_.size()));
}

int32_t TokenCorpus::id(std::string_view word) const {
  auto it = index_.find(word);
  return it == index_.end() ? -1 : it->second;
}

TokenCorpus read_word_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("read_word_lines: cannot open {}", path));
  TokenCorpus out;
  for (std::string line; std::getline(in, line);) {
    for_each_word(line, WordSplit::whitespace, [&](std::string_view w) { out.add(w); });
    out.end_sentence();
  }
  return out;
}

int32_t Vocab::id(const std::string& word) const {
  auto it = index.find(word);
  return it == index.end() ? -1 : it->second;
}

Vocab build_vocab(const TokenCorpus& corpus, int64_t min_count, int64_t max_size) {
  std::vector<int32_t> kept;
  for (int32_t i = 0; i < corpus.distinct(); ++i)
    if (corpus.count(i) >= min_count) kept.push_back(i);
  std::sort(kept.begin(), kept.end(), [&](int32_t a, int32_t b) {
    return corpus.count(a) != corpus.count(b) ? corpus.count(a) > corpus.count(b) : corpus.word(a) < corpus.word(b);
  });
  if (max_size > 0 && static_cast<int64_t>(kept.size()) > max_size) kept.resize(max_size);
  Vocab v;
  v.words.reserve(kept.size());
  v.counts.reserve(kept.size());
  for (int32_t i : kept) {
    v.index.emplace(corpus.word(i), static_cast<int32_t>(v.words.size()));
    v.words.push_back(corpus.word(i));
    v.counts.push_back(corpus.count(i));
    v.total += corpus.count(i);
  }
  return v;
}

Vocab build_vocab(const Sentences& sentences, int64_t min_count, int64_t max_size) {
  return build_vocab(TokenCorpus(sentences), min_count, max_size);
}

}  // namespace tg::data
