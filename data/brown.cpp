#include "data/brown.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

namespace tg::data {

namespace fs = std::filesystem;

namespace {

struct Genre {
  char letter;
  const char* name;      // as in the corpus manual and the package's CONTENTS
  const char* category;  // as in the package's cats.txt (NLTK's names)
};
constexpr std::array<Genre, 15> kGenres = {{
    {'a', "press: reportage", "news"}, {'b', "press: editorial", "editorial"}, {'c', "press: reviews", "reviews"},
    {'d', "religion", "religion"}, {'e', "skill and hobbies", "hobbies"}, {'f', "popular lore", "lore"},
    {'g', "belles-lettres", "belles_lettres"}, {'h', "miscellaneous: government & house organs", "government"},
    {'j', "learned", "learned"}, {'k', "fiction: general", "fiction"}, {'l', "fiction: mystery", "mystery"},
    {'m', "fiction: science", "science_fiction"}, {'n', "fiction: adventure", "adventure"},
    {'p', "fiction: romance", "romance"}, {'r', "humor", "humor"},
}};

const Genre& find_genre(char letter) {
  for (const auto& g : kGenres)
    if (g.letter == letter) return g;
  throw DataError(fmt::format("brown: '{}' is not a Brown genre letter (one of {})", letter, brown_genres()));
}

bool is_genre(char letter) {
  return std::any_of(kGenres.begin(), kGenres.end(), [&](const Genre& g) { return g.letter == letter; });
}

// c<genre><digit><digit>
bool is_corpus_name(const std::string& name) {
  return name.size() == 4 && name[0] == 'c' && is_genre(name[1]) && std::isdigit(static_cast<unsigned char>(name[2])) &&
         std::isdigit(static_cast<unsigned char>(name[3]));
}

bool attaches_left(std::string_view w) {
  return w == "." || w == "," || w == ";" || w == ":" || w == "!" || w == "?" || w == ")" || w == "]" || w == "'" ||
         w == "''";
}
bool attaches_right(std::string_view w) { return w == "(" || w == "[" || w == "`" || w == "``"; }

bool is_blank(std::string_view line) { return line.find_first_not_of(" \t\r") == std::string_view::npos; }

// The corpus files of dir (c<genre><two digits>), sorted by name.
std::vector<std::string> brown_files(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw DataError(fmt::format("brown: corpus directory {} does not exist; run scripts/fetch_brown.sh to fetch it", dir));
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (is_corpus_name(entry.path().filename().string())) files.push_back(entry.path().string());
  if (ec) throw DataError(fmt::format("brown: corpus directory {} cannot be listed: {}", dir, ec.message()));
  if (files.empty())
    throw DataError(fmt::format("brown: {} has no corpus files (ca01 ... cr09); run scripts/fetch_brown.sh to fetch "
                                "them", dir));
  std::sort(files.begin(), files.end());
  return files;
}

// The word of a `word/tag` token (what precedes the last '/'), or an empty
// view for a token without a word or a tag.
std::string_view tagged_word(std::string_view token) {
  const size_t slash = token.rfind('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == token.size()) return {};
  return token.substr(0, slash);
}

DataError malformed_token(std::string_view where, std::string_view token) {
  return DataError(fmt::format("brown: {}: malformed token '{}' (expected word/tag)", where, token));
}

}  // namespace

std::string brown_genres() {
  std::string letters;
  for (const auto& g : kGenres) letters += g.letter;
  return letters;
}

std::string brown_genre_name(char genre) { return find_genre(genre).name; }
std::string brown_category(char genre) { return find_genre(genre).category; }

std::string detokenize_brown(std::string_view line, const std::string& where) {
  std::string out;
  bool glue_next = true;  // no space before the first word, nor after an opening mark
  size_t pos = 0;
  while (pos < line.size()) {
    size_t start = line.find_first_not_of(" \t\r", pos);
    if (start == std::string_view::npos) break;
    size_t end = line.find_first_of(" \t\r", start);
    if (end == std::string_view::npos) end = line.size();
    std::string_view token = line.substr(start, end - start);
    pos = end;
    std::string_view word = tagged_word(token);
    if (word.empty()) throw malformed_token(where, token);
    if (!glue_next && !attaches_left(word)) out += ' ';
    out += word == "``" || word == "''" ? std::string_view("\"") : word;
    glue_next = attaches_right(word);
  }
  return out;
}

BrownDocument read_brown_file(const std::string& path) {
  BrownDocument doc;
  doc.id = fs::path(path).filename().string();
  if (!is_corpus_name(doc.id))
    throw DataError(fmt::format("brown: {}: not a corpus file name (expected c<genre><two digits>, genre one of {})",
                                path, brown_genres()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("brown: {}: cannot be opened for reading", path));
  doc.genre = doc.id[1];
  doc.genre_name = brown_genre_name(doc.genre);
  doc.category = brown_category(doc.genre);
  // One sentence per line; a run of blank lines ends a paragraph.
  std::string line;
  int64_t line_no = 0;
  bool paragraph_break = false;
  while (std::getline(in, line)) {
    ++line_no;
    if (is_blank(line)) {
      paragraph_break = true;
      continue;
    }
    std::string sentence = detokenize_brown(line, fmt::format("{}:{}", path, line_no));
    if (!doc.text.empty()) doc.text += paragraph_break ? "\n\n" : "\n";
    doc.text += sentence;
    paragraph_break = false;
  }
  if (in.bad()) throw DataError(fmt::format("brown: {}: read error after line {}", path, line_no));
  if (doc.text.empty()) throw DataError(fmt::format("brown: {}: file has no tokens", path));
  return doc;
}

std::vector<BrownDocument> read_brown(const std::string& dir) {
  const std::vector<std::string> files = brown_files(dir);
  std::vector<BrownDocument> docs;
  docs.reserve(files.size());
  for (const auto& f : files) docs.push_back(read_brown_file(f));
  return docs;
}

std::vector<Document> brown_documents(const std::vector<BrownDocument>& docs) {
  std::vector<Document> out;
  out.reserve(docs.size());
  for (const auto& d : docs) out.push_back({d.id, d.genre_name, d.text});
  return out;
}

TokenCorpus read_brown_words(const std::string& dir) {
  TokenCorpus out;
  for (const auto& path : brown_files(dir)) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw DataError(fmt::format("brown: {}: cannot be opened for reading", path));
    std::string line;
    for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
      for_each_word(line, WordSplit::whitespace, [&](std::string_view token) {
        std::string_view word = tagged_word(token);
        if (word.empty()) throw malformed_token(fmt::format("{}:{}", path, line_no), token);
        out.add(word);
      });
      out.end_sentence();
    }
    if (in.bad()) throw DataError(fmt::format("brown: {}: read error", path));
  }
  return out;
}

}  // namespace tg::data
