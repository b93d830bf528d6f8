#include "data/text.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>

#include "autograd/generator.h"

namespace tg::data {

namespace fs = std::filesystem;

namespace {

bool is_blank(std::string_view line) {
  return line.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos;
}

// Calls f with each paragraph of text: a run of non-blank lines, which keep
// their own line endings except the one that ends the run.
template <class F>
void for_each_paragraph(std::string_view text, F f) {
  constexpr size_t none = std::string_view::npos;
  size_t begin = none, end = 0;
  auto close = [&] {
    if (begin == none) return;
    while (end > begin && (text[end - 1] == '\n' || text[end - 1] == '\r')) --end;
    f(text.substr(begin, end - begin));
    begin = none;
  };
  for (size_t pos = 0; pos < text.size();) {
    const size_t eol = text.find('\n', pos);
    const size_t next = eol == none ? text.size() : eol + 1;
    if (is_blank(text.substr(pos, next - pos))) {
      close();
    } else {
      if (begin == none) begin = pos;
      end = next;
    }
    pos = next;
  }
  close();
}

}  // namespace

std::string read_file_bytes(const std::string& path, std::string_view who) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw DataError(fmt::format("{}: {}: no such file", who, path));
  if (fs::is_directory(path, ec)) throw DataError(fmt::format("{}: {}: is a directory, expected a file", who, path));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: {}: cannot be opened for reading", who, path));
  std::string bytes;
  const uintmax_t size = fs::is_regular_file(path, ec) ? fs::file_size(path, ec) : 0;
  if (size > 0 && !ec) {
    // Read in one piece at the file's size: a stream copy would hold up to
    // three copies while its buffer grows.
    bytes.resize(size);
    in.read(bytes.data(), static_cast<std::streamsize>(size));
    bytes.resize(static_cast<size_t>(in.gcount()));
  } else {  // a pipe or device, whose size is not known beforehand
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (in.bad()) throw DataError(fmt::format("{}: {}: read error", who, path));
  return bytes;
}

int64_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    unsigned char c = p[i];
    if (c < 0x80) { ++i; continue; }
    int len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return static_cast<int64_t>(i);
    if (i + len > n) return static_cast<int64_t>(i);
    for (int k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return static_cast<int64_t>(i);
    i += len;
  }
  return -1;
}

std::vector<Document> read_text_file(const std::string& path, TextSplit split) {
  std::string text = read_file_bytes(path, "text");
  if (text.starts_with("\xEF\xBB\xBF")) text.erase(0, 3);
  if (text.empty()) throw DataError(fmt::format("text: {}: file is empty", path));
  if (int64_t bad = find_invalid_utf8(text); bad >= 0)
    throw DataError(fmt::format("text: {}: invalid UTF-8 at byte offset {} (byte 0x{:02X})", path, bad,
                                static_cast<unsigned char>(text[bad])));
  if (is_blank(text)) throw DataError(fmt::format("text: {}: file has only whitespace", path));

  std::vector<Document> docs;
  if (split == TextSplit::whole) {
    docs.push_back({path + "#0", "", std::move(text)});
    return docs;
  }
  // Counted first so the documents are reserved exactly: a file of tiny
  // paragraphs then costs about 100 bytes a paragraph (the Document and its
  // id), not up to three times that while a vector grows.
  size_t n = 0;
  for_each_paragraph(text, [&](std::string_view) { ++n; });
  docs.reserve(n);
  for_each_paragraph(text, [&](std::string_view p) {
    docs.push_back({fmt::format("{}#{}", path, docs.size()), "", std::string(p)});
  });
  return docs;
}

SplitIndices split_indices(size_t n, double val_fraction, uint64_t seed) {
  if (!(val_fraction >= 0.0 && val_fraction < 1.0))
    throw ValueError(fmt::format("split: validation fraction {} is not in [0, 1)", val_fraction));
  if (n == 0) throw DataError("split: there are no documents to split");
  size_t n_val = static_cast<size_t>(std::llround(static_cast<double>(n) * val_fraction));
  if (val_fraction > 0.0) n_val = std::max<size_t>(n_val, 1);
  if (n_val >= n)
    throw DataError(fmt::format("split: {} document(s) cannot be split into training and validation with "
                                "fraction {} (each side needs at least one document; plain text files are split into "
                                "documents at blank lines)", n, val_fraction));
  // Rank documents by a hash of (seed, index): a stable pseudo-random order
  // that depends on nothing else. The lowest n_val ranks are validation.
  Generator g(seed);
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    uint64_t ha = g.bits(a), hb = g.bits(b);
    return ha != hb ? ha < hb : a < b;
  });
  SplitIndices s;
  s.val.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(n_val));
  s.train.assign(order.begin() + static_cast<std::ptrdiff_t>(n_val), order.end());
  std::sort(s.val.begin(), s.val.end());
  std::sort(s.train.begin(), s.train.end());
  return s;
}

}  // namespace tg::data
