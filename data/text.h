#pragma once
// Plain UTF-8 text as documents (`--data FILE`), and the deterministic
// train/validation split by document shared by every corpus.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "error.h"

namespace tg::data {

struct Document {
  std::string id;     // "FILE#3" for the fourth paragraph of FILE, "ca01" for Brown
  std::string label;  // a class name (Brown genre); empty for plain text
  std::string text;
};

enum class TextSplit {
  whole,       // the file is one document
  paragraphs,  // documents are separated by blank lines (lines of spaces/tabs only)
};

// Reads a UTF-8 file. A leading byte-order mark is dropped; line endings are
// kept as they are. Throws DataError naming the file when it is missing,
// unreadable, empty or only whitespace, and naming the byte offset of the
// first invalid UTF-8 sequence. Memory: the file's bytes twice (read, then
// the documents' texts) plus a Document and its id per paragraph, about 100
// bytes and the path's length: ~50 times the size of a file of 3-byte
// paragraphs ("a\n\n") read from a 40-character path.
std::vector<Document> read_text_file(const std::string& path, TextSplit split = TextSplit::paragraphs);

// The bytes of a file (one copy in memory, read at the file's size).
// DataError prefixed with who and naming the file when it is missing, a
// directory or unreadable.
std::string read_file_bytes(const std::string& path, std::string_view who);

// Byte offset of the first invalid UTF-8 sequence (overlong forms, surrogates
// and code points above U+10FFFF are invalid), or -1 when text is valid.
int64_t find_invalid_utf8(std::string_view text);

// Documents i of n go to validation or training by a hash of (seed, i) alone,
// so the split is the same on every run and machine. round(n * val_fraction)
// documents (at least one when val_fraction > 0) are validation, and at least
// one stays for training. Both index lists are in increasing order.
struct SplitIndices {
  std::vector<size_t> train, val;
};
SplitIndices split_indices(size_t n, double val_fraction, uint64_t seed);

template <class Doc>
std::pair<std::vector<Doc>, std::vector<Doc>> split_documents(const std::vector<Doc>& docs, double val_fraction,
                                                              uint64_t seed) {
  SplitIndices s = split_indices(docs.size(), val_fraction, seed);
  std::pair<std::vector<Doc>, std::vector<Doc>> out;
  for (size_t i : s.train) out.first.push_back(docs[i]);
  for (size_t i : s.val) out.second.push_back(docs[i]);
  return out;
}

}  // namespace tg::data
