#include "examples/common/corpus.h"

#include <cstdlib>

namespace tg::examples {

std::string default_brown_dir() {
  if (const char* d = std::getenv("TAPEGRAD_DATA"); d && *d) return std::string(d) + "/brown";
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/tapegrad/brown";
  const char* home = std::getenv("HOME");
  return std::string(home && *home ? home : ".") + "/.cache/tapegrad/brown";
}

std::string join_text(const std::vector<Document>& docs) {
  std::string out;
  for (const auto& d : docs) {
    if (!out.empty()) out += '\n';
    out += d.text;
  }
  return out;
}

}  // namespace tg::examples
