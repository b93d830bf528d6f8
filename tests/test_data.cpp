#define BOOST_TEST_MODULE data
#include <boost/test/unit_test.hpp>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/brown.h"
#include "data/lm_batches.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "data/words.h"
#include "testing.h"

using namespace tg;
using namespace tg::data;
using namespace tg::testing;

namespace {

// Two sentence lines in the first paragraph, one in the second, as in the
// real files (leading blank lines, tab-indented paragraph starts).
const std::string kCa01 =
    "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ``/`` no/at evidence/nn ''/'' ./.\n"
    "It/pps cost/vbd 1/2/cd of/in $5/nns ,/, (/( or/cc so/rb )/) ./.\n"
    "\n\n\tA/at paragraph/nn ;/. //in and/or/cc AAb//nn done/vbn ?/. \n\n";
const std::string kCr09 = "\n\n\tDear/jj Sirs/nns :/: Let/vb me/ppo begin/vb ./.\n";

}  // namespace

// --- Brown reader

BOOST_AUTO_TEST_CASE(brown_reads_sample_directory) {
  TempDir d;
  d.write("cr09", kCr09);
  d.write("ca01", kCa01);
  d.write("README", "not a corpus file\n");
  d.write("cats.txt", "ca01 news\n");
  auto docs = read_brown(d.path.string());
  BOOST_REQUIRE_EQUAL(docs.size(), 2u);
  BOOST_CHECK_EQUAL(docs[0].id, "ca01");
  BOOST_CHECK_EQUAL(docs[0].genre, 'a');
  BOOST_CHECK_EQUAL(docs[0].genre_name, "press: reportage");
  BOOST_CHECK_EQUAL(docs[0].category, "news");
  BOOST_CHECK_EQUAL(docs[0].text,
                    "The Fulton County said \"no evidence\".\n"
                    "It cost 1/2 of $5, (or so).\n"
                    "\n"
                    "A paragraph; / and/or AAb/ done?");
  BOOST_CHECK_EQUAL(docs[1].id, "cr09");
  BOOST_CHECK_EQUAL(docs[1].genre, 'r');
  BOOST_CHECK_EQUAL(docs[1].genre_name, "humor");
  BOOST_CHECK_EQUAL(docs[1].text, "Dear Sirs: Let me begin.");
  auto plain = brown_documents(docs);
  BOOST_CHECK_EQUAL(plain[1].label, "humor");
  BOOST_CHECK_EQUAL(plain[1].text, docs[1].text);
}

BOOST_AUTO_TEST_CASE(brown_genres_table) {
  BOOST_CHECK_EQUAL(brown_genres(), "abcdefghjklmnpr");
  BOOST_CHECK_EQUAL(brown_genre_name('j'), "learned");
  BOOST_CHECK_EQUAL(brown_genre_name('k'), "fiction: general");
  BOOST_CHECK_EQUAL(brown_category('m'), "science_fiction");
  BOOST_CHECK_EQUAL(brown_category('g'), "belles_lettres");
  BOOST_CHECK_THROW(brown_category('z'), DataError);
  BOOST_CHECK_EXCEPTION(brown_genre_name('i'), DataError, says<DataError>({"'i'", "abcdefghjklmnpr"}));
}

BOOST_AUTO_TEST_CASE(brown_errors) {
  TempDir d;
  const std::string missing = (d.path / "nope").string();
  BOOST_CHECK_EXCEPTION(read_brown(missing), DataError, says<DataError>({missing, "fetch_brown.sh"}));
  d.write("README", "x\n");
  BOOST_CHECK_EXCEPTION(read_brown(d.path.string()), DataError, says<DataError>({"no corpus files"}));
  // Also a ValueError, for callers that catch those.
  BOOST_CHECK_THROW(read_brown(d.path.string()), ValueError);

  for (auto [line, bad] : std::vector<std::pair<std::string, std::string>>{
           {"The/at jury said/vbd ./.", "'jury'"}, {"The/at /nn ./.", "'/nn'"}, {"The/at jury/ ./.", "'jury/'"}}) {
    TempDir e;
    std::string f = e.write("cb01", "\n\n\tFine/jj ./.\n" + line + "\n");
    BOOST_CHECK_EXCEPTION(read_brown(e.path.string()), DataError,
                          says<DataError>({f + ":4", "malformed token " + bad}));
  }
  TempDir empty;
  std::string f = empty.write("cb02", "\n\n  \n");
  BOOST_CHECK_EXCEPTION(read_brown(empty.path.string()), DataError, says<DataError>({f, "no tokens"}));
  BOOST_CHECK_EXCEPTION(read_brown_file((d.path / "ca99").string()), DataError,
                        says<DataError>({"ca99", "cannot be opened"}));
  BOOST_CHECK_EXCEPTION(read_brown_file((d.path / "cz01").string()), DataError,
                        says<DataError>({"cz01", "not a corpus file name"}));
  std::string wrong_name = d.write("notes", "a/at\n");
  BOOST_CHECK_EXCEPTION(read_brown_file(wrong_name), DataError, says<DataError>({"not a corpus file name"}));
}

BOOST_AUTO_TEST_CASE(brown_words_by_sentence_line) {
  TempDir d;
  d.write("cr09", kCr09);
  d.write("ca01", kCa01);
  TokenCorpus c = read_brown_words(d.path.string());
  // One sentence per non-blank line, files in name order; words as tagged.
  BOOST_REQUIRE_EQUAL(c.sentences(), 4);
  auto sentence = [&](int64_t s) {
    std::vector<std::string> w;
    for (int64_t t = c.offsets()[s]; t < c.offsets()[s + 1]; ++t) w.push_back(c.word(c.token_ids()[t]));
    return w;
  };
  using Words = std::vector<std::string>;
  BOOST_CHECK((sentence(0) == Words{"The", "Fulton", "County", "said", "``", "no", "evidence", "''", "."}));
  BOOST_CHECK((sentence(1) == Words{"It", "cost", "1/2", "of", "$5", ",", "(", "or", "so", ")", "."}));
  BOOST_CHECK((sentence(2) == Words{"A", "paragraph", ";", "/", "and/or", "AAb/", "done", "?"}));
  BOOST_CHECK((sentence(3) == Words{"Dear", "Sirs", ":", "Let", "me", "begin", "."}));
  // The same errors as read_brown.
  const std::string missing = (d.path / "nope").string();
  BOOST_CHECK_EXCEPTION(read_brown_words(missing), DataError, says<DataError>({missing, "fetch_brown.sh"}));
  TempDir e;
  std::string f = e.write("cb01", "\n\n\tFine/jj ./.\nThe/at jury said/vbd ./.\n");
  BOOST_CHECK_EXCEPTION(read_brown_words(e.path.string()), DataError,
                        says<DataError>({f + ":4", "malformed token 'jury'"}));
}

// --- Words

BOOST_AUTO_TEST_CASE(words_split_two_ways) {
  const std::string text = " The cat's\tBOOK,  (\xc3\x89t\xc3\xa9) 42x\n";
  BOOST_CHECK((split_words(text, WordSplit::whitespace) ==
               std::vector<std::string>{"The", "cat's", "BOOK,", "(\xc3\x89t\xc3\xa9)", "42x"}));
  // Lower-cased ASCII only; UTF-8 bytes stay in the word; each mark is a word.
  BOOST_CHECK((split_words(text, WordSplit::lowercase) ==
               std::vector<std::string>{"the", "cat's", "book", ",", "(", "\xc3\x89t\xc3\xa9", ")", "42x"}));
  BOOST_CHECK(split_words(" \t\n", WordSplit::whitespace).empty());
  BOOST_CHECK(split_words(" \t\n", WordSplit::lowercase).empty());
}

BOOST_AUTO_TEST_CASE(word_lines_are_sentences) {
  TempDir d;
  const std::string f = d.write("s.txt", "a b  a\n\n  \nc\td\n");
  TokenCorpus c = read_word_lines(f);
  BOOST_CHECK_EQUAL(c.sentences(), 2);  // blank lines hold no sentence
  BOOST_CHECK_EQUAL(c.tokens(), 5);
  BOOST_CHECK_EQUAL(c.count(c.id("a")), 2);
  Vocab v = build_vocab(c, 1);
  BOOST_CHECK((v.words == std::vector<std::string>{"a", "b", "c", "d"}));
  const std::string missing = (d.path / "nope.txt").string();
  BOOST_CHECK_EXCEPTION(read_word_lines(missing), DataError, says<DataError>({missing}));
}

// --- Plain text

BOOST_AUTO_TEST_CASE(text_file_documents) {
  TempDir d;
  std::string f = d.write("t.txt", "\xEF\xBB\xBF" "First line\nsecond line\n\n \t\nPara two \xC3\xA9\n\n\n\nThree");
  auto docs = read_text_file(f);
  BOOST_REQUIRE_EQUAL(docs.size(), 3u);
  BOOST_CHECK_EQUAL(docs[0].text, "First line\nsecond line");
  BOOST_CHECK_EQUAL(docs[1].text, "Para two \xC3\xA9");
  BOOST_CHECK_EQUAL(docs[2].text, "Three");
  BOOST_CHECK_EQUAL(docs[2].id, f + "#2");
  BOOST_CHECK(docs[0].label.empty());
  auto whole = read_text_file(f, TextSplit::whole);
  BOOST_REQUIRE_EQUAL(whole.size(), 1u);
  BOOST_CHECK_EQUAL(whole[0].text, "First line\nsecond line\n\n \t\nPara two \xC3\xA9\n\n\n\nThree");
}

BOOST_AUTO_TEST_CASE(text_file_errors) {
  TempDir d;
  std::string missing = (d.path / "missing.txt").string();
  BOOST_CHECK_EXCEPTION(read_text_file(missing), DataError, says<DataError>({missing, "no such file"}));
  BOOST_CHECK_EXCEPTION(read_text_file(d.path.string()), DataError, says<DataError>({"is a directory"}));
  std::string empty = d.write("empty.txt", "");
  BOOST_CHECK_EXCEPTION(read_text_file(empty), DataError, says<DataError>({empty, "empty"}));
  std::string blank = d.write("blank.txt", " \n\t\n");
  BOOST_CHECK_EXCEPTION(read_text_file(blank), DataError, says<DataError>({blank, "only whitespace"}));
  std::string bad = d.write("bad.txt", "abc\xC3\xA9\xFF rest");
  BOOST_CHECK_EXCEPTION(read_text_file(bad), DataError, says<DataError>({bad, "byte offset 5", "0xFF"}));
}

BOOST_AUTO_TEST_CASE(utf8_validation) {
  BOOST_CHECK_EQUAL(find_invalid_utf8("plain \xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80"), -1);
  BOOST_CHECK_EQUAL(find_invalid_utf8(std::string("a\0b", 3)), -1);
  BOOST_CHECK_EQUAL(find_invalid_utf8("ab\xC0\x80"), 2);          // overlong NUL
  BOOST_CHECK_EQUAL(find_invalid_utf8("\xED\xA0\x80"), 0);        // surrogate U+D800
  BOOST_CHECK_EQUAL(find_invalid_utf8("x\xF4\x90\x80\x80"), 1);   // above U+10FFFF
  BOOST_CHECK_EQUAL(find_invalid_utf8("xy\xE2\x82"), 2);          // truncated
  BOOST_CHECK_EQUAL(find_invalid_utf8("\x80"), 0);                // stray continuation byte
}

// --- Train/validation split

BOOST_AUTO_TEST_CASE(split_is_deterministic_and_by_document) {
  SplitIndices a = split_indices(10, 0.3, 7), b = split_indices(10, 0.3, 7);
  BOOST_CHECK(a.val == b.val && a.train == b.train);
  BOOST_CHECK_EQUAL(a.val.size(), 3u);
  BOOST_CHECK_EQUAL(a.train.size(), 7u);
  std::vector<size_t> all(a.train);
  all.insert(all.end(), a.val.begin(), a.val.end());
  std::sort(all.begin(), all.end());
  for (size_t i = 0; i < 10; ++i) BOOST_CHECK_EQUAL(all[i], i);
  // Pinned: the split must not change between versions or machines.
  BOOST_CHECK_EQUAL(fmt::format("{}", fmt::join(a.val, ",")), "2,6,9");
  // Another seed gives another split (of 100 documents, 10 in validation).
  BOOST_CHECK(split_indices(100, 0.1, 1).val != split_indices(100, 0.1, 2).val);
  BOOST_CHECK_EQUAL(split_indices(100, 0.1, 1).val.size(), 10u);
  // A tiny fraction still gives one validation document; 0 gives none.
  BOOST_CHECK_EQUAL(split_indices(5, 0.01, 1).val.size(), 1u);
  BOOST_CHECK_EQUAL(split_indices(5, 0.0, 1).train.size(), 5u);

  std::vector<Document> docs;
  for (int i = 0; i < 10; ++i) docs.push_back({fmt::format("d{}", i), "", fmt::format("text {}", i)});
  auto [train, val] = split_documents(docs, 0.3, 7);
  BOOST_REQUIRE_EQUAL(val.size(), 3u);
  for (size_t i = 0; i < val.size(); ++i) BOOST_CHECK_EQUAL(val[i].id, fmt::format("d{}", a.val[i]));
  BOOST_CHECK_EQUAL(train.size(), 7u);
}

BOOST_AUTO_TEST_CASE(split_errors) {
  BOOST_CHECK_EXCEPTION(split_indices(10, 1.0, 1), ValueError, says<ValueError>({"fraction 1"}));
  BOOST_CHECK_THROW(split_indices(10, -0.1, 1), ValueError);
  BOOST_CHECK_EXCEPTION(split_indices(0, 0.1, 1), DataError, says<DataError>({"no documents"}));
  BOOST_CHECK_EXCEPTION(split_indices(1, 0.5, 1), DataError, says<DataError>({"1 document(s)"}));
}

// --- LM batches

BOOST_AUTO_TEST_CASE(lm_batches_sample) {
  // Token i has id 1000 + i, so a window's offset is its first id - 1000.
  std::vector<int64_t> ids(100);
  for (int64_t i = 0; i < 100; ++i) ids[i] = 1000 + i;
  LMBatches batches(ids, 8);
  BOOST_CHECK_EQUAL(batches.num_windows(), 12);
  Generator g(3), g2(3);
  LMBatch b = batches.sample(4, g);
  BOOST_CHECK(b.inputs.shape() == Shape({4, 8}));
  BOOST_CHECK(b.targets.shape() == Shape({4, 8}));
  BOOST_CHECK(b.inputs.dtype() == DType::i64);
  BOOST_CHECK_EQUAL(g.offset(), 4u);
  auto in = b.inputs.to_vector<int64_t>(), out = b.targets.to_vector<int64_t>();
  for (int64_t r = 0; r < 4; ++r) {
    int64_t offset = in[r * 8] - 1000;
    BOOST_CHECK(offset >= 0 && offset <= 100 - 8 - 1);
    for (int64_t t = 0; t < 8; ++t) {
      BOOST_CHECK_EQUAL(in[r * 8 + t], ids[offset + t]);
      BOOST_CHECK_EQUAL(out[r * 8 + t], ids[offset + t + 1]);
    }
  }
  BOOST_CHECK(batches.sample(4, g2).inputs.to_vector<int64_t>() == in);  // same seed, same batch
  BOOST_CHECK(batches.sample(4, g).inputs.to_vector<int64_t>() != in);   // the generator moved on
  // Random offsets reach both ends of the stream.
  int64_t lo = 100, hi = -1;
  for (int i = 0; i < 200; ++i) {
    auto v = batches.sample(4, g).inputs.to_vector<int64_t>();
    for (int r = 0; r < 4; ++r) lo = std::min(lo, v[r * 8] - 1000), hi = std::max(hi, v[r * 8] - 1000);
  }
  BOOST_CHECK_EQUAL(lo, 0);
  BOOST_CHECK_EQUAL(hi, 91);
  // From a tensor.
  LMBatches from_tensor(from_vector(ids, {100}), 8);
  Generator g3(3);
  BOOST_CHECK(from_tensor.sample(4, g3).targets.to_vector<int64_t>() == out);
  BOOST_CHECK_EQUAL(from_tensor.num_tokens(), 100);
}

BOOST_AUTO_TEST_CASE(lm_batches_keep_ids_on_both_storages) {
  // Ids up to 65535 are stored as uint16, larger ones as int32: both give the ids back exactly.
  for (int64_t top : {int64_t{65535}, int64_t{65536}, int64_t{2147483647}}) {
    std::vector<int64_t> ids(50);
    for (int64_t i = 0; i < 50; ++i) ids[i] = top - 49 + i;
    LMBatches batches(ids, 49);
    BOOST_CHECK_EQUAL(batches.num_tokens(), 50);
    LMBatch b = batches.sequential(0, 1);
    BOOST_CHECK_EQUAL(b.inputs.at({0, 0}), top - 49);
    BOOST_CHECK_EQUAL(b.targets.at({0, 48}), top);
  }
}

BOOST_AUTO_TEST_CASE(lm_batches_evaluation) {
  std::vector<int64_t> ids(100);
  for (int64_t i = 0; i < 100; ++i) ids[i] = i;
  LMBatches batches(ids, 8);
  BOOST_CHECK_EQUAL(batches.num_batches(5), 3);  // 12 windows: 5 + 5 + 2
  LMBatch first = batches.sequential(0, 5), last = batches.sequential(2, 5);
  BOOST_CHECK(first.inputs.shape() == Shape({5, 8}));
  BOOST_CHECK(last.inputs.shape() == Shape({2, 8}));
  BOOST_CHECK_EQUAL(first.inputs.at({1, 0}), 8);
  BOOST_CHECK_EQUAL(last.inputs.at({1, 0}), 88);
  BOOST_CHECK_EQUAL(last.targets.at({1, 7}), 96);
  // fixed: 2 batches of 3 windows at round(k * 91 / 5) = 0, 18, 36, 55, 73, 91.
  std::vector<int64_t> starts;
  for (int64_t i = 0; i < 2; ++i) {
    LMBatch b = batches.fixed(i, 2, 3);
    BOOST_CHECK(b.inputs.shape() == Shape({3, 8}));
    for (int64_t r = 0; r < 3; ++r) starts.push_back(static_cast<int64_t>(b.inputs.at({r, 0})));
  }
  BOOST_CHECK(starts == std::vector<int64_t>({0, 18, 36, 55, 73, 91}));
  BOOST_CHECK_EQUAL(batches.fixed(1, 2, 3).targets.at({2, 7}), 99);  // the last token is used
  BOOST_CHECK(batches.fixed(1, 2, 3).inputs.to_vector<int64_t>() == batches.fixed(1, 2, 3).inputs.to_vector<int64_t>());
  BOOST_CHECK_EQUAL(batches.fixed(0, 1, 1).inputs.at({0, 0}), 0);
}

BOOST_AUTO_TEST_CASE(lm_batches_errors) {
  std::vector<int64_t> ids(20, 1);
  BOOST_CHECK_EXCEPTION(LMBatches(ids, 20), DataError, says<DataError>({"20 tokens", "block 20", "21"}));
  BOOST_CHECK_THROW(LMBatches(ids, 0), ValueError);
  LMBatches b(ids, 4);
  Generator g;
  BOOST_CHECK_THROW(b.sample(0, g), ValueError);
  BOOST_CHECK_THROW(b.sequential(b.num_batches(2), 2), IndexError);
  BOOST_CHECK_THROW(b.sequential(-1, 2), IndexError);
  BOOST_CHECK_THROW(b.fixed(3, 3, 2), IndexError);
  BOOST_CHECK_THROW(b.fixed(0, 0, 2), ValueError);
  BOOST_CHECK_THROW(LMBatches(zeros({20}), 4), DTypeError);
  BOOST_CHECK_THROW(LMBatches(zeros({4, 5}, DType::i64), 4), ShapeError);
  // Ids are stored as int32: negative or too large ones are refused by position.
  ids[7] = -3;
  BOOST_CHECK_EXCEPTION(LMBatches(ids, 4), IndexError, says<IndexError>({"-3", "position 7"}));
  ids[7] = int64_t{1} << 33;
  BOOST_CHECK_EXCEPTION(LMBatches(ids, 4), IndexError, says<IndexError>({"8589934592", "position 7"}));
}

// --- Character tokenizer

BOOST_AUTO_TEST_CASE(char_tokenizer_round_trip) {
  CharTokenizer tok = CharTokenizer::build("hello, w\xC3\xB6rld\n");
  // Sorted by code point: \n ' ' , d e h l o r w ö
  BOOST_CHECK_EQUAL(tok.vocab_size(), 11);
  BOOST_CHECK_EQUAL(tok.token(0), "\n");
  BOOST_CHECK_EQUAL(tok.token(10), "\xC3\xB6");
  BOOST_CHECK(tok.encode("hello") == std::vector<int64_t>({5, 4, 6, 6, 7}));
  std::string s = "w\xC3\xB6rld, hello\n";
  BOOST_CHECK_EQUAL(tok.decode(tok.encode(s)), s);
  BOOST_CHECK_EQUAL(tok.encode(s).size(), 13u);  // ö is one token
  TempDir d;
  std::string f = (d.path / "char.json").string();
  tok.save(f);
  auto loaded = load_tokenizer(f);
  BOOST_CHECK_EQUAL(loaded->kind(), "char");
  BOOST_CHECK_EQUAL(loaded->vocab_size(), 11);
  BOOST_CHECK(loaded->encode(s) == tok.encode(s));
}

BOOST_AUTO_TEST_CASE(char_tokenizer_errors) {
  CharTokenizer tok = CharTokenizer::build("abc");
  BOOST_CHECK_EXCEPTION(tok.encode("abz"), DataError, says<DataError>({"'z'", "U+007A", "byte offset 2"}));
  BOOST_CHECK_EXCEPTION(tok.encode("a\n"), DataError, says<DataError>({"U+000A"}));
  BOOST_CHECK_EXCEPTION(tok.encode("a\xFF"), DataError, says<DataError>({"invalid UTF-8", "byte offset 1"}));
  BOOST_CHECK_THROW(CharTokenizer::build(""), DataError);
  BOOST_CHECK_THROW(CharTokenizer::build("\xC3"), DataError);
  std::vector<int64_t> bad = {0, 3};
  BOOST_CHECK_EXCEPTION(tok.decode(bad), IndexError, says<IndexError>({"3", "vocabulary size 3"}));
  BOOST_CHECK_THROW(CharTokenizer({U'b', U'a'}), ValueError);
  BOOST_CHECK_THROW(CharTokenizer({}), ValueError);

  TempDir d;
  auto check_load = [&](const std::string& content, const std::string& part) {
    std::string f = d.write("t.json", content);
    BOOST_CHECK_EXCEPTION(CharTokenizer::load(f), DataError, says<DataError>({f, part}));
  };
  check_load("{\"type\": \"char\", \"version\": 1, \"chars\": [\"a\", \"b\"", "not valid JSON");
  check_load("{\"type\": \"char\", \"version\": 1}", "field 'chars' is missing");
  check_load("{\"type\": \"char\", \"version\": 2, \"chars\": [\"a\"]}", "field 'version'");
  check_load("{\"type\": \"char\", \"chars\": [\"a\"]}", "field 'version' is missing");
  check_load("{\"type\": \"bpe\", \"chars\": [\"a\"]}", "field 'type'");
  check_load("{\"type\": \"char\", \"version\": 1, \"chars\": [\"a\", \"bc\"]}", "field 'chars[1]'");
  check_load("{\"type\": \"char\", \"version\": 1, \"chars\": [\"b\", \"a\"]}", "field 'chars[1]'");
  check_load("{\"type\": \"char\", \"version\": 1, \"chars\": [\"a\", 5]}", "field 'chars[1]'");
  check_load("{\"type\": \"char\", \"version\": 1, \"chars\": []}", "field 'chars'");
  std::string missing = (d.path / "none.json").string();
  BOOST_CHECK_EXCEPTION(load_tokenizer(missing), DataError, says<DataError>({missing, "no such file"}));
  std::string unwritable = (d.path / "no_such_dir" / "t.json").string();
  BOOST_CHECK_EXCEPTION(tok.save(unwritable), DataError, says<DataError>({unwritable, "cannot be written"}));
  std::string other = d.write("o.json", "{\"type\": \"words\"}");
  BOOST_CHECK_EXCEPTION(load_tokenizer(other), DataError, says<DataError>({other, "field 'type'", "words"}));
}

// --- Byte-level BPE

BOOST_AUTO_TEST_CASE(bpe_chunking) {
  std::string s = "Hello  world\n\n 42!?x";
  auto chunks = bpe_chunks(s);
  std::vector<std::string> got(chunks.begin(), chunks.end());
  BOOST_CHECK(got == std::vector<std::string>({"Hello", " ", " world", "\n\n", " 42", "!?", "x"}));
  BOOST_CHECK(bpe_chunks("").empty());
  auto tail = bpe_chunks("a  ");
  BOOST_CHECK(std::vector<std::string>(tail.begin(), tail.end()) == std::vector<std::string>({"a", "  "}));
}

BOOST_AUTO_TEST_CASE(bpe_learns_expected_merges) {
  // The textbook example: aa, then ab (tie with (aa,a) at 2, broken by the
  // smaller pair (97,98) < (256,97)), then aa+ab; then no pair occurs twice.
  BPETokenizer tok = BPETokenizer::train("aaabdaaabac", 300);
  using P = BPETokenizer::Pair;
  BOOST_CHECK(tok.merges() == std::vector<P>({P{97, 97}, P{97, 98}, P{256, 257}}));
  BOOST_CHECK_EQUAL(tok.vocab_size(), 259);
  BOOST_CHECK_EQUAL(tok.token(258), "aaab");
  BOOST_CHECK(tok.encode("aaabdaaabac") == std::vector<int64_t>({258, 'd', 258, 'a', 'c'}));
  // Encoding applies merges in the order they were learned: aa before ab.
  BOOST_CHECK(tok.encode("aab") == std::vector<int64_t>({256, 'b'}));
  BOOST_CHECK(tok.encode("abaab") == std::vector<int64_t>({257, 256, 'b'}));
  // vocab_size caps the merges.
  BOOST_CHECK_EQUAL(BPETokenizer::train("aaabdaaabac", 257).merges().size(), 1u);
  BOOST_CHECK_EQUAL(BPETokenizer::train("aaabdaaabac", 256).vocab_size(), 256);
  // Merges stay inside chunks: "ab ab" never learns a token with the space in the middle of words.
  BPETokenizer words = BPETokenizer::train("ab ab ab ab", 270);
  for (int64_t id = 256; id < words.vocab_size(); ++id) BOOST_CHECK(words.token(id).find(' ', 1) == std::string::npos);
  BOOST_CHECK_EQUAL(words.token(words.vocab_size() - 1), " ab");
}

BOOST_AUTO_TEST_CASE(bpe_round_trip_random_bytes) {
  // Words of 1-6 letters drawn from a skewed alphabet (with a two-byte
  // UTF-8 letter), digits and punctuation: enough distinct pairs for 64 merges.
  std::string corpus;
  Generator words(5);
  const std::vector<std::string> letters = {"e", "e", "t", "a", "o", "n", "\xC3\xA9", "s", "h", "r"};
  for (int w = 0; w < 3000; ++w) {
    corpus += w % 17 == 0 ? ". " : w % 11 == 0 ? ", 19" : " ";
    for (int64_t n = words.randint(1, 7); n > 0; --n) corpus += letters[words.randint(0, 10)];
  }
  BPETokenizer tok = BPETokenizer::train(corpus, 320);
  BOOST_CHECK_EQUAL(tok.vocab_size(), 320);
  BOOST_CHECK(tok.merges() == BPETokenizer::train(corpus, 320).merges());  // deterministic
  BOOST_CHECK_LT(tok.encode(corpus).size() * 3, corpus.size() * 2);  // 64 merges compress it by a third
  BOOST_CHECK_EQUAL(tok.decode(tok.encode(corpus)), corpus);
  Generator g(11);
  for (int trial = 0; trial < 300; ++trial) {
    std::string s(static_cast<size_t>(g.randint(0, 64)), '\0');
    for (auto& c : s) {
      // Mix random bytes (NUL, invalid UTF-8) with pieces of the corpus alphabet.
      int64_t r = g.randint(0, 4);
      c = static_cast<char>(r == 0 ? g.randint(0, 256) : r == 1 ? ' ' : "the cat1\xC3"[g.randint(0, 9)]);
    }
    BOOST_CHECK_EQUAL(tok.decode(tok.encode(s)), s);
  }
  std::string nul("a\0\0b\xFF\xFE the", 10);
  BOOST_CHECK_EQUAL(tok.decode(tok.encode(nul)), nul);
  std::vector<int64_t> bad = {5, 320};
  BOOST_CHECK_EXCEPTION(tok.decode(bad), IndexError, says<IndexError>({"320", "vocabulary size 320"}));
  BOOST_CHECK_THROW(tok.token(-1), IndexError);
  BOOST_CHECK_EXCEPTION(BPETokenizer::train(corpus, 100), ValueError, says<ValueError>({"100", "256"}));

  // Through the common interface, and saved and loaded.
  TempDir d;
  std::string f = (d.path / "bpe.json").string();
  std::unique_ptr<Tokenizer> base = std::make_unique<BPETokenizer>(tok);
  base->save(f);
  auto loaded = load_tokenizer(f);
  BOOST_CHECK_EQUAL(loaded->kind(), "bpe");
  BOOST_CHECK_EQUAL(loaded->vocab_size(), 320);
  BOOST_CHECK(loaded->encode(corpus) == tok.encode(corpus));
  BOOST_CHECK(BPETokenizer::load(f).merges() == tok.merges());
}

BOOST_AUTO_TEST_CASE(bpe_errors) {
  using P = BPETokenizer::Pair;
  BOOST_CHECK_EXCEPTION(BPETokenizer({P{97, 97}, P{256, 300}}), ValueError, says<ValueError>({"merge 1", "257"}));
  BOOST_CHECK_EXCEPTION(BPETokenizer({P{97, 97}, P{97, 97}}), ValueError, says<ValueError>({"repeats merge 0"}));
  BOOST_CHECK_THROW(BPETokenizer({P{-1, 97}}), ValueError);
  TempDir d;
  auto check_load = [&](const std::string& content, const std::string& part) {
    std::string f = d.write("b.json", content);
    BOOST_CHECK_EXCEPTION(BPETokenizer::load(f), DataError, says<DataError>({f, part}));
  };
  const std::string head = "{\"type\": \"bpe\", \"version\": 1, \"pretokenizer\": \"chunks-v1\", ";
  check_load(head + "\"merges\": [[97, 97], [256, 98], [97, 900]]}", "field 'merges[2]'");
  check_load(head + "\"merges\": [[97, 97], [97]]}", "field 'merges[1]'");
  check_load(head + "\"merges\": [[97, 97], [\"a\", 98]]}", "field 'merges[1]'");
  check_load(head + "\"merges\": [[97, 97], [97, 97]]}", "repeats");
  check_load(head + "\"merges\": {}}", "field 'merges'");
  check_load(head + "\"vocab\": []}", "field 'merges' is missing");
  check_load("{\"type\": \"bpe\", \"version\": 1, \"pretokenizer\": \"gpt2\", \"merges\": []}", "field 'pretokenizer'");
  check_load("{\"type\": \"char\", \"merges\": []}", "field 'type'");
  check_load("[1, 2", "not valid JSON");
  check_load("[1, 2]", "field 'type' is missing");
}

BOOST_AUTO_TEST_CASE(tokenizer_files_with_numbers_beyond_double_range) {
  // nlohmann reports these as out_of_range, not as parse errors: still a
  // DataError naming the file.
  TempDir d;
  for (const char* number : {"1e400", "7E777", "-1e400"}) {
    const std::string bpe = d.write(
        "bpe.json", fmt::format(R"({{"type":"bpe","version":1,"pretokenizer":"chunks-v1","merges":[[97,{}]]}})",
                                number));
    const std::string chars =
        d.write("char.json", fmt::format(R"({{"type":"char","version":{},"chars":["a"]}})", number));
    BOOST_CHECK_EXCEPTION(load_tokenizer(bpe), DataError, says<DataError>({bpe, "not valid JSON", number}));
    BOOST_CHECK_EXCEPTION(BPETokenizer::load(bpe), DataError, says<DataError>({bpe, "not valid JSON"}));
    BOOST_CHECK_EXCEPTION(CharTokenizer::load(chars), DataError, says<DataError>({chars, "not valid JSON"}));
  }
  const std::string deep = d.write("deep.json", R"({"type":"bpe","merges":[[[97, 98]]]})");
  BOOST_CHECK_EXCEPTION(load_tokenizer(deep), DataError, says<DataError>({deep, "nested deeper"}));
}

BOOST_AUTO_TEST_CASE(bpe_merges_that_double_tokens_are_refused) {
  // [[0,0],[256,256],[257,257],...]: merge k makes a token of 2^(k+1) bytes.
  // The tokens may total 1 MiB + 64 bytes a merge: 19 merges (a 512 KiB last
  // token, 1 MiB in all) fit; merge 19 of the 40-merge file (460 bytes, 2^41
  // bytes of tokens) is refused before its 1 MiB token is built.
  using P = BPETokenizer::Pair;
  auto chain = [](int n) {
    std::vector<P> merges{{0, 0}};
    for (int k = 1; k < n; ++k) merges.emplace_back(255 + k, 255 + k);
    return merges;
  };
  BPETokenizer fits(chain(19));
  BOOST_TEST(fits.token(256 + 18).size() == 524288u);
  BOOST_TEST(fits.decode(fits.encode(std::string(1 << 19, '\0'))) == std::string(1 << 19, '\0'));
  BOOST_CHECK_EXCEPTION(BPETokenizer(chain(20)), ValueError, says<ValueError>({"merge 19", "above the limit"}));
  TempDir d;
  std::string merges;
  for (auto [a, b] : chain(40)) merges += fmt::format("{}[{},{}]", merges.empty() ? "" : ",", a, b);
  const std::string f = d.write("doubling.json", R"({"type":"bpe","version":1,"pretokenizer":"chunks-v1","merges":[)" +
                                                     merges + "]}");
  BOOST_TEST(std::filesystem::file_size(f) < 500u);
  BOOST_CHECK_EXCEPTION(load_tokenizer(f), DataError, says<DataError>({f, "merge 19", "above the limit"}));
}

BOOST_AUTO_TEST_CASE(text_paragraphs_keep_their_inner_line_endings) {
  TempDir d;
  const std::string f = d.write("crlf.txt", "\r\n  \r\none\r\ntwo  \r\n\r\n\tthree\n \nfour\r\n");
  auto docs = read_text_file(f);
  BOOST_REQUIRE_EQUAL(docs.size(), 3u);
  BOOST_CHECK_EQUAL(docs[0].text, "one\r\ntwo  ");
  BOOST_CHECK_EQUAL(docs[1].text, "\tthree");
  BOOST_CHECK_EQUAL(docs[2].text, "four");
  BOOST_CHECK_EQUAL(docs[1].id, f + "#1");
}
