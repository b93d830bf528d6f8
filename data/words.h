#pragma once
// Text as words: the one word tokenizer (two ways to split), a corpus held as
// word ids (TokenCorpus), and the vocabulary of a corpus by count (Vocab).
// word2vec trains on them; classify cuts its passages with them.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "error.h"

namespace tg::data {

enum class WordSplit {
  // Runs of non-whitespace, as they are: text that is tokenised already
  // ("The cat 's ." -> The, cat, 's, .).
  whitespace,
  // Lower-cased runs of ASCII letters, digits, apostrophes and bytes >= 0x80
  // (UTF-8 characters stay whole); every other visible byte is a word of its
  // own, whitespace separates ("The cat's." -> the, cat's, .).
  lowercase,
};

// Calls fn(std::string_view word) on each word of text in order. The view
// lives until fn returns: under WordSplit::whitespace it points into text,
// under WordSplit::lowercase into a buffer reused for the next word.
template <class Fn>
void for_each_word(std::string_view text, WordSplit split, Fn&& fn) {
  constexpr std::string_view space = " \t\n\v\f\r";
  if (split == WordSplit::whitespace) {
    for (size_t i = text.find_first_not_of(space); i != std::string_view::npos; i = text.find_first_not_of(space, i)) {
      const size_t end = std::min(text.find_first_of(space, i), text.size());
      fn(text.substr(i, end - i));
      i = end;
    }
    return;
  }
  std::string word;
  auto flush = [&] {
    if (!word.empty()) fn(std::string_view(word)), word.clear();
  };
  for (char ch : text) {
    const auto byte = static_cast<unsigned char>(ch);
    const bool letter = (byte >= 'a' && byte <= 'z') || (byte >= 'A' && byte <= 'Z') || (byte >= '0' && byte <= '9');
    if (letter || byte >= 0x80 || ch == '\'') {
      word += byte >= 'A' && byte <= 'Z' ? static_cast<char>(byte - 'A' + 'a') : ch;
    } else {
      flush();
      if (space.find(ch) == std::string_view::npos) fn(std::string_view(&ch, 1));
    }
  }
  flush();
}

// The words of text, as strings.
std::vector<std::string> split_words(std::string_view text, WordSplit split);

using Sentences = std::vector<std::vector<std::string>>;

// A corpus held as word ids, about 4 bytes a token: each distinct word once
// with its count, the sentences as ranges of one flat token array. It is
// filled while reading (add each word, then end_sentence), so no per-token
// string ever exists. Ids are in order of first appearance.
class TokenCorpus {
 public:
  TokenCorpus() = default;
  explicit TokenCorpus(const Sentences& sentences);

  void add(std::string_view word);  // appends word to the open sentence
  void end_sentence();              // closes it (an empty one is dropped); close the last one too

  int64_t sentences() const { return static_cast<int64_t>(offsets_.size()) - 1; }
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }  // words added
  int64_t distinct() const { return static_cast<int64_t>(words_.size()); }
  // Sentence s is token_ids()[offsets()[s], offsets()[s + 1]).
  const std::vector<int32_t>& token_ids() const { return tokens_; }
  const std::vector<int64_t>& offsets() const { return offsets_; }
  const std::string& word(int32_t id) const { return words_[id]; }
  int64_t count(int32_t id) const { return counts_[id]; }
  int32_t id(std::string_view word) const;  // -1 when absent

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::vector<std::string> words_;
  std::vector<int64_t> counts_;
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> index_;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> offsets_{0};
};

// A text file of one sentence a line, words split at whitespace, read a line
// at a time straight into ids. DataError naming the file when it cannot be
// opened.
TokenCorpus read_word_lines(const std::string& path);

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
Vocab build_vocab(const TokenCorpus& corpus, int64_t min_count, int64_t max_size = 0);
Vocab build_vocab(const Sentences& sentences, int64_t min_count, int64_t max_size = 0);

}  // namespace tg::data
