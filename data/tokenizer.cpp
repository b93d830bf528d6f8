#include "data/tokenizer.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "data/json_file.h"
#include "data/text.h"

namespace tg::data {

namespace {

// The code point at s[i] of valid UTF-8, and its length in bytes.
std::pair<char32_t, int> next_code_point(std::string_view s, size_t i) {
  auto c = static_cast<unsigned char>(s[i]);
  int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  char32_t cp = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return {cp, len};
}

std::string utf8(char32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// "'a' (U+0061)", control characters shown by their code point only.
std::string describe_char(char32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return fmt::format("U+{:04X}", static_cast<uint32_t>(cp));
  return fmt::format("'{}' (U+{:04X})", utf8(cp), static_cast<uint32_t>(cp));
}

// The deepest nesting of arrays and objects in JSON text (brackets inside
// strings do not count); for text that is not JSON, an estimate.
int json_depth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

void check_utf8(std::string_view text, const char* who) {
  if (int64_t bad = find_invalid_utf8(text); bad >= 0)
    throw DataError(fmt::format("{}: invalid UTF-8 at byte offset {} (byte 0x{:02X})", who, bad,
                                static_cast<unsigned char>(text[bad])));
}

}  // namespace

nlohmann::json read_json_file(const std::string& path, std::string_view who) {
  const std::string bytes = read_file_bytes(path, who);
  // The tokenizer files nest 3 levels deep at most. Deeper nesting is refused
  // before parsing: it would cost memory, and printing a deep value in an
  // error message recurses once per level.
  constexpr int kMaxDepth = 3;
  if (json_depth(bytes) > kMaxDepth)
    throw DataError(fmt::format("{}: {}: JSON nested deeper than the {} levels of a tokenizer file", who, path,
                                kMaxDepth));
  try {
    return nlohmann::json::parse(bytes);
  } catch (const nlohmann::json::parse_error& e) {
    throw DataError(fmt::format("{}: {}: not valid JSON at byte offset {}", who, path, e.byte));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number beyond the double range (1e400)
    throw DataError(fmt::format("{}: {}: not valid JSON: {}", who, path, e.what()));
  }
}

void write_json_file(const std::string& path, const nlohmann::json& j, std::string_view who) {
  std::ofstream out(path, std::ios::binary);
  out << j.dump() << '\n';
  if (!out) throw DataError(fmt::format("{}: {}: cannot be written", who, path));
}

const nlohmann::json& json_field(const nlohmann::json& j, const std::string& field, const std::string& path,
                                 std::string_view who) {
  if (!j.is_object() || !j.contains(field))
    throw DataError(fmt::format("{}: {}: field '{}' is missing", who, path, field));
  return j.at(field);
}

void check_tokenizer_header(const nlohmann::json& j, std::string_view type, const std::string& path,
                            std::string_view who) {
  const auto& t = json_field(j, "type", path, who);
  if (t != type) throw DataError(fmt::format("{}: {}: field 'type' is {}, expected \"{}\"", who, path, t.dump(), type));
  const auto& v = json_field(j, "version", path, who);
  if (v != 1) throw DataError(fmt::format("{}: {}: field 'version' is {}, expected 1", who, path, v.dump()));
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  nlohmann::json j = read_json_file(path, "tokenizer");
  const auto& type = json_field(j, "type", path, "tokenizer");
  if (type == "char") return std::make_unique<CharTokenizer>(char_tokenizer_from_json(j, path));
  if (type == "bpe") return std::make_unique<BPETokenizer>(bpe_tokenizer_from_json(j, path));
  throw DataError(fmt::format("tokenizer: {}: field 'type' is {}, expected \"char\" or \"bpe\"", path, type.dump()));
}

// --- CharTokenizer

CharTokenizer CharTokenizer::build(std::string_view text) {
  check_utf8(text, "CharTokenizer::build");
  if (text.empty()) throw DataError("CharTokenizer::build: the text is empty, so there is no vocabulary");
  std::vector<bool> seen_ascii(128, false);
  std::vector<char32_t> chars;
  for (size_t i = 0; i < text.size();) {
    auto [cp, len] = next_code_point(text, i);
    if (cp >= 128 || !seen_ascii[cp]) chars.push_back(cp);
    if (cp < 128) seen_ascii[cp] = true;
    i += len;
  }
  std::sort(chars.begin(), chars.end());
  chars.erase(std::unique(chars.begin(), chars.end()), chars.end());
  return CharTokenizer(std::move(chars));
}

CharTokenizer::CharTokenizer(std::vector<char32_t> chars) : chars_(std::move(chars)) {
  if (chars_.empty()) throw ValueError("CharTokenizer: the vocabulary is empty");
  for (size_t i = 0; i < chars_.size(); ++i) {
    char32_t cp = chars_[i];
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
      throw ValueError(fmt::format("CharTokenizer: U+{:X} is not a Unicode scalar value", static_cast<uint32_t>(cp)));
    if (i > 0 && chars_[i - 1] >= cp)
      throw ValueError(fmt::format("CharTokenizer: characters must be sorted and distinct, but {} follows {}",
                                   describe_char(cp), describe_char(chars_[i - 1])));
    index_.emplace(cp, static_cast<int64_t>(i));
  }
}

std::vector<int64_t> CharTokenizer::encode(std::string_view text) const {
  check_utf8(text, "CharTokenizer::encode");
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    auto [cp, len] = next_code_point(text, i);
    auto it = index_.find(cp);
    if (it == index_.end())
      throw DataError(fmt::format("CharTokenizer::encode: character {} at byte offset {} is not in the vocabulary of "
                                  "{} characters", describe_char(cp), i, chars_.size()));
    ids.push_back(it->second);
    i += len;
  }
  return ids;
}

std::string CharTokenizer::token(int64_t id) const {
  if (id < 0 || id >= vocab_size())
    throw IndexError(fmt::format("CharTokenizer: token id {} is out of range for vocabulary size {}", id, vocab_size()));
  return utf8(chars_[id]);
}

std::string CharTokenizer::decode(std::span<const int64_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int64_t id : ids) out += token(id);
  return out;
}

void CharTokenizer::save(const std::string& path) const {
  nlohmann::json chars = nlohmann::json::array();
  for (char32_t cp : chars_) chars.push_back(utf8(cp));
  write_json_file(path, {{"type", "char"}, {"version", 1}, {"chars", chars}}, "CharTokenizer::save");
}

CharTokenizer CharTokenizer::load(const std::string& path) {
  return char_tokenizer_from_json(read_json_file(path, "CharTokenizer::load"), path);
}

CharTokenizer char_tokenizer_from_json(const nlohmann::json& j, const std::string& path) {
  const char* who = "CharTokenizer::load";
  check_tokenizer_header(j, "char", path, who);
  const auto& chars = json_field(j, "chars", path, who);
  if (!chars.is_array() || chars.empty())
    throw DataError(fmt::format("{}: {}: field 'chars' must be a non-empty array of one-character strings", who, path));
  std::vector<char32_t> cps;
  cps.reserve(chars.size());
  for (size_t i = 0; i < chars.size(); ++i) {
    const auto& c = chars[i];
    std::string s = c.is_string() ? c.get<std::string>() : std::string();
    bool one_char = !s.empty() && find_invalid_utf8(s) < 0 && static_cast<size_t>(next_code_point(s, 0).second) == s.size();
    if (!one_char)
      throw DataError(fmt::format("{}: {}: field 'chars[{}]' is {}, expected a string of one character", who, path, i,
                                  c.dump()));
    cps.push_back(next_code_point(s, 0).first);
    if (i > 0 && cps[i - 1] >= cps[i])
      throw DataError(fmt::format("{}: {}: field 'chars[{}]' {} is not after {}: characters must be sorted and "
                                  "distinct", who, path, i, describe_char(cps[i]), describe_char(cps[i - 1])));
  }
  return CharTokenizer(std::move(cps));
}

}  // namespace tg::data
