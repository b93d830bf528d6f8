#pragma once
// Tokenizers: text <-> token ids, behind one interface so the examples can
// switch with `--tokenizer char|bpe`.
//
//   CharTokenizer  one id per Unicode character (code point) of valid UTF-8
//                  text; the vocabulary is the sorted set of characters of a
//                  corpus. An unknown character is an error (DataError naming
//                  it and its byte offset), never a silent substitute: a model
//                  cannot say anything useful about a character it never saw.
//   BPETokenizer   byte-level byte-pair encoding (GPT-2 style): ids 0..255 are
//                  the bytes, each learned merge adds one id. Works on any
//                  bytes (invalid UTF-8, NUL), so decode(encode(s)) == s always.
//
// Both save to and load from a small JSON file; load_tokenizer() reads either:
//   {"type": "char", "version": 1, "chars": ["\n", " ", "!", ...]}
//   {"type": "bpe", "version": 1, "pretokenizer": "chunks-v1", "merges": [[101, 32], ...]}
// A damaged file gives a DataError naming the file and the field. Loading
// takes at most ~32 times the file's size (the parsed JSON), plus the BPE
// tokens' bytes (bounded by BPETokenizer::max_token_bytes).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "error.h"

namespace tg::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::string kind() const = 0;  // "char" or "bpe", the "type" field of the file
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  // IndexError for an id outside [0, vocab_size).
  virtual std::string decode(std::span<const int64_t> ids) const = 0;
  // The text of one token, for printing vocabularies.
  virtual std::string token(int64_t id) const = 0;
  virtual void save(const std::string& path) const = 0;
};

// Reads a file written by CharTokenizer::save or BPETokenizer::save.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

class CharTokenizer : public Tokenizer {
 public:
  // The distinct characters of text, sorted by code point (so the ids do not
  // depend on the order of the text). DataError for invalid UTF-8 or no text.
  static CharTokenizer build(std::string_view text);
  // chars: distinct code points, sorted ascending (checked).
  explicit CharTokenizer(std::vector<char32_t> chars);
  static CharTokenizer load(const std::string& path);

  std::string kind() const override { return "char"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(chars_.size()); }
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int64_t> ids) const override;
  std::string token(int64_t id) const override;
  void save(const std::string& path) const override;
  const std::vector<char32_t>& chars() const { return chars_; }

 private:
  std::vector<char32_t> chars_;
  std::unordered_map<char32_t, int64_t> index_;
};

// Pre-tokenisation: merges never cross the boundaries of "chunks", which keep
// words apart so a token does not swallow the end of one word and the start
// of the next. A chunk is a run of letters (ASCII letters and every byte
// >= 0x80, so UTF-8 characters stay together), a run of digits, a run of
// other visible bytes, each with at most one leading space; or a run of
// whitespace (a space that precedes a non-space chunk joins that chunk).
// Splits text into such chunks; their concatenation is text.
std::vector<std::string_view> bpe_chunks(std::string_view text);

class BPETokenizer : public Tokenizer {
 public:
  using Pair = std::pair<int64_t, int64_t>;
  // Learns vocab_size - 256 merges from text (fewer when no adjacent pair of
  // tokens occurs twice any more). Each step merges the most frequent pair,
  // ties going to the smallest (left id, right id): deterministic.
  static BPETokenizer train(std::string_view text, int64_t vocab_size);
  // merges[i] = (left, right) makes token 256 + i; both ids must be < 256 + i.
  // Every token's bytes are kept, and each merge can double a token's length
  // ((0, 0), (256, 256), (257, 257), ... reaches 2^40 bytes in 40 merges), so
  // the tokens may total at most max_token_bytes(merges.size()): 1 MiB plus
  // 64 bytes a merge, far above trained vocabularies (tokens of words and
  // spaces, under 10 bytes on average). ValueError beyond it.
  explicit BPETokenizer(std::vector<Pair> merges);
  static int64_t max_token_bytes(int64_t merges) { return (int64_t{1} << 20) + 64 * merges; }
  static BPETokenizer load(const std::string& path);

  std::string kind() const override { return "bpe"; }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::vector<int64_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int64_t> ids) const override;
  std::string token(int64_t id) const override;
  void save(const std::string& path) const override;
  const std::vector<Pair>& merges() const { return merges_; }

 private:
  void encode_chunk(std::string_view chunk, std::vector<int64_t>& out) const;
  std::vector<Pair> merges_;
  std::vector<std::string> bytes_;                // bytes of every token
  std::unordered_map<uint64_t, int64_t> rank_;    // (left << 32 | right) -> merge index
};

}  // namespace tg::data
