// The resource rule of every loader of untrusted files: on hostile inputs
// built here (many tiny records, one huge record, headers that lie, nesting,
// token chains), the peak of what a loader allocates stays within a few times
// the file's size plus a constant, whether it accepts the file or refuses it
// with a ValueError (never bad_alloc, length_error or a JSON library error).
//
// This executable replaces the global operator new/delete to count the bytes
// in use (a header before each block keeps its size); tensors come from the
// caching allocator, whose own counters are read. Peak = heap peak + tensor
// peak during the call, both measured from what was in use before it.
#define BOOST_TEST_MODULE loader_memory
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <new>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/brown.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "models/word2vec.h"
#include "models/word_eval.h"
#include "nn/checkpoint.h"
#include "nn/linear.h"
#include "nn/optim.h"
#include "testing.h"

namespace {

std::atomic<int64_t> g_live{0}, g_peak{0};
// Before each block handed out: the requested size and the offset back to
// what malloc returned (16 bytes, or the alignment of an over-aligned new).
constexpr size_t kHeader = 16;

void* counted_alloc(size_t n, size_t align) {
  const size_t header = std::max(kHeader, align);
  void* base =
      align > kHeader ? std::aligned_alloc(align, (n + header + align - 1) / align * align) : std::malloc(n + header);
  if (!base) return nullptr;
  auto* p = static_cast<char*>(base) + header;
  reinterpret_cast<size_t*>(p)[-2] = n;
  reinterpret_cast<size_t*>(p)[-1] = header;
  const int64_t now = g_live.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
  for (int64_t peak = g_peak.load(); now > peak && !g_peak.compare_exchange_weak(peak, now);) {}
  return p;
}

void counted_free(void* p) noexcept {
  if (!p) return;
  const size_t* h = static_cast<size_t*>(p);
  g_live.fetch_sub(static_cast<int64_t>(h[-2]));
  std::free(static_cast<char*>(p) - h[-1]);
}

void* counted_new(size_t n, size_t align) {
  if (void* p = counted_alloc(n, align)) return p;
  throw std::bad_alloc();
}

}  // namespace

void* operator new(size_t n) { return counted_new(n, 0); }
void* operator new[](size_t n) { return counted_new(n, 0); }
void* operator new(size_t n, std::align_val_t a) { return counted_new(n, static_cast<size_t>(a)); }
void* operator new[](size_t n, std::align_val_t a) { return counted_new(n, static_cast<size_t>(a)); }
void* operator new(size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return counted_alloc(n, 0); }
void* operator new(size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_alloc(n, static_cast<size_t>(a));
}
void* operator new[](size_t n, std::align_val_t a, const std::nothrow_t&) noexcept {
  return counted_alloc(n, static_cast<size_t>(a));
}
void operator delete(void* p) noexcept { counted_free(p); }
void operator delete[](void* p) noexcept { counted_free(p); }
void operator delete(void* p, size_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete[](void* p, size_t, std::align_val_t) noexcept { counted_free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete(void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }
void operator delete[](void* p, std::align_val_t, const std::nothrow_t&) noexcept { counted_free(p); }

using namespace tg;
using namespace tg::testing;
namespace fs = std::filesystem;

namespace {

// The bound each loader meets, peak <= factor * file size + kConstant, as
// its header documents it. The factors come from the worst records: a
// parsed JSON value costs ~16 bytes (plus its array's growth) for 2 bytes of
// file ("0,"); a word vector, a word pair or a paragraph costs a few dozen
// bytes of bookkeeping for 3 to 6 bytes of file. The constant covers the
// BPE tokens' 1 MiB allowance and fixed buffers.
constexpr int64_t kSafetensors = 32;  // nn/checkpoint.h
constexpr int64_t kTokenizer = 32;    // data/tokenizer.h
constexpr int64_t kWord2vec = 16;     // models/word2vec.h
constexpr int64_t kWordEval = 16;     // models/word_eval.h
constexpr int64_t kText = 64;         // data/text.h, data/brown.h: a paragraph's Document and its id
constexpr int64_t kConstant = 4 << 20;

struct Peak {
  int64_t heap = 0, tensors = 0;
  int64_t total() const { return heap + tensors; }
};

// Runs load, which may refuse the file with a ValueError (any other exception
// fails the test), and returns the peak of what it allocated.
template <class F>
Peak measure(F load, bool& refused) {
  const int64_t heap0 = g_live.load();
  g_peak.store(heap0);
  reset_peak_memory_stats();
  const auto tensors0 = static_cast<int64_t>(memory_stats().bytes_in_use);
  refused = false;
  try {
    load();
  } catch (const ValueError&) {
    refused = true;
  }
  return {g_peak.load() - heap0, static_cast<int64_t>(memory_stats().peak_bytes_in_use) - tensors0};
}

enum class Expect { accepted, refused };

// Writes content to name in dir, runs load(path) and checks the outcome and
// the bound; logs the ratio so the figures can be read in the test log.
template <class F>
void check_loader(const TempDir& dir, const std::string& name, const std::string& content, Expect expect,
                  int64_t factor, F load) {
  const std::string path = dir.write(name, content);
  bool refused = false;
  const Peak p = measure([&] { load(path); }, refused);
  const auto size = static_cast<int64_t>(content.size());
  BOOST_TEST_MESSAGE(fmt::format("{:<34} {:>9} bytes  peak {:>10} (heap {:>10}, tensors {:>9})  {:5.1f}x  {}", name,
                                 size, p.total(), p.heap, p.tensors, static_cast<double>(p.total()) / size,
                                 refused ? "refused" : "accepted"));
  BOOST_TEST((refused == (expect == Expect::refused)), name << (refused ? " was refused" : " was accepted"));
  BOOST_TEST(p.total() <= factor * size + kConstant,
             name << ": peak " << p.total() << " bytes for a file of " << size << " bytes, above " << factor
                  << " x its size + " << kConstant);
}

// "w0", "w1", ...: distinct short words.
std::string word(int64_t i) { return fmt::format("w{}", i); }

std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + data;
}

}  // namespace

BOOST_AUTO_TEST_CASE(counting_allocator_counts) {
  // The measurement itself: a 1 MB string is 1 MB at the peak, freed after.
  bool refused = false;
  Peak p = measure([] { std::string s(1 << 20, 'x'); }, refused);
  BOOST_TEST(p.heap >= (1 << 20));
  BOOST_TEST(p.heap < (1 << 20) + 4096);
  p = measure([] { Tensor t = zeros({1 << 18}); }, refused);
  BOOST_TEST(p.tensors >= (1 << 20));
}

BOOST_AUTO_TEST_CASE(safetensors_tensors_module_and_optimizer) {
  TempDir d;
  auto load_raw = [](const std::string& path) { nn::load_tensors(path); };
  const int64_t n = 20000;
  {  // many empty tensors (each still a tensor object and a 64-byte block)
    std::string h = "{";
    for (int64_t i = 0; i < n; ++i)
      h += fmt::format("{}\"{}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", i ? "," : "", word(i));
    check_loader(d, "st_empty_tensors", safetensors_bytes(h + "}"), Expect::accepted, kSafetensors, load_raw);
  }
  {  // many one-element tensors
    std::string h = "{", data;
    for (int64_t i = 0; i < n; ++i) {
      h += fmt::format("{}\"{}\":{{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[{},{}]}}", i ? "," : "", word(i),
                       4 * i, 4 * i + 4);
      data += std::string(4, '\0');
    }
    check_loader(d, "st_tiny_tensors", safetensors_bytes(h + "}", data), Expect::accepted, kSafetensors, load_raw);
  }
  {  // one shape of 400k dimensions (refused for its rank, after parsing)
    std::string h = "{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,4],\"shape\":[1";
    for (int i = 0; i < 400000; ++i) h += ",1";
    check_loader(d, "st_huge_shape", safetensors_bytes(h + "]}}", "abcd"), Expect::refused, kSafetensors, load_raw);
  }
  {  // 50k metadata entries
    std::string h = "{\"__metadata__\":{";
    for (int64_t i = 0; i < 50000; ++i) h += fmt::format("{}\"{}\":\"x\"", i ? "," : "", word(i));
    check_loader(d, "st_metadata", safetensors_bytes(h + "}}"), Expect::accepted, kSafetensors, load_raw);
  }
  {  // a shape claiming 10^18 elements: refused before anything is allocated
    std::string h = "{\"t\":{\"dtype\":\"F64\",\"shape\":[1000000000,1000000000],\"data_offsets\":[0,8]}}";
    check_loader(d, "st_huge_claim", safetensors_bytes(h, std::string(8, '\0')), Expect::refused, kSafetensors,
                 load_raw);
  }
  {  // one 4 MB tensor: the file's bytes and the tensor's
    std::string h = "{\"t\":{\"dtype\":\"F32\",\"shape\":[1048576],\"data_offsets\":[0,4194304]}}";
    check_loader(d, "st_big_tensor", safetensors_bytes(h, std::string(4 << 20, '\1')), Expect::accepted, kSafetensors,
                 load_raw);
  }
  // A module and an optimizer fed a file of 20k unexpected tensors, and their own files.
  nn::Linear lin(nn::LinearOptions{.in = 64, .out = 32});
  std::string h = "{";
  for (int64_t i = 0; i < n; ++i)
    h += fmt::format("{}\"{}\":{{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", i ? "," : "", word(i));
  const std::string hostile = safetensors_bytes(h + "}");
  check_loader(d, "st_module_unexpected_keys", hostile, Expect::refused, kSafetensors,
               [&](const std::string& p) { nn::load(lin, p); });
  nn::save(lin, d / "lin.safetensors");
  check_loader(d, "st_module_own", data::read_file_bytes(d / "lin.safetensors", "test"), Expect::accepted, kSafetensors,
               [&](const std::string& p) { nn::load(lin, p); });
  nn::Adam adam(lin.parameters(), nn::AdamOptions{});
  sum(lin(ones({2, 64}))).backward();
  adam.step();
  std::string h2 = "{\"__metadata__\":{\"tapegrad.optimizer\":\"" + adam.name() + "\"}," + h.substr(1);
  check_loader(d, "st_optimizer_hostile", safetensors_bytes(h2 + "}"), Expect::refused, kSafetensors,
               [&](const std::string& p) { nn::load(adam, p); });
  nn::save(adam, d / "adam.safetensors");
  check_loader(d, "st_optimizer_own", data::read_file_bytes(d / "adam.safetensors", "test"), Expect::accepted,
               kSafetensors, [&](const std::string& p) { nn::load(adam, p); });
}

BOOST_AUTO_TEST_CASE(tokenizer_files_char_and_bpe) {
  TempDir d;
  auto load_any = [](const std::string& path) { data::load_tokenizer(path); };
  {  // every code point from U+0020 to U+FFFF but the surrogates: 63k map entries
    std::string f = R"({"type":"char","version":1,"chars":[)";
    for (char32_t c = 0x20; c <= 0xFFFF; ++c) {
      if (c >= 0xD800 && c <= 0xDFFF) continue;
      if (c != 0x20) f += ',';
      const std::string ch = data::CharTokenizer({c}).token(0);
      f += fmt::format("\"{}{}\"", c == '"' || c == '\\' ? "\\" : "", ch);  // escaped where JSON needs it
    }
    check_loader(d, "char_all_bmp_chars", f + "]}", Expect::accepted, kTokenizer, load_any);
  }
  {  // 300k numbers where characters belong: a 600 KB array, refused after parsing
    std::string f = R"({"type":"char","version":1,"chars":[0)";
    for (int i = 0; i < 300000; ++i) f += ",0";
    check_loader(d, "char_number_array", f + "]}", Expect::refused, kTokenizer, load_any);
  }
  {  // 500k levels of nesting: refused at the 4th
    check_loader(d, "deep_nesting", std::string(500000, '[') + std::string(500000, ']'), Expect::refused, kTokenizer,
                 load_any);
  }
  const std::string bpe = R"({"type":"bpe","version":1,"pretokenizer":"chunks-v1","merges":[)";
  {  // each merge joins the last token with itself: 40 merges would make 2^41 bytes
    std::string f = bpe + "[0,0]";
    for (int i = 0; i < 40; ++i) f += fmt::format(",[{},{}]", 256 + i, 256 + i);
    check_loader(d, "bpe_doubling_chain", f + "]}", Expect::refused, kTokenizer, load_any);
  }
  {  // each merge appends a byte to the last token: 1400 tokens of up to 1401 bytes
    std::string f = bpe + "[0,0]";
    for (int i = 0; i < 1400; ++i) f += fmt::format(",[{},0]", 256 + i);
    check_loader(d, "bpe_growing_chain", f + "]}", Expect::accepted, kTokenizer, load_any);
  }
  {  // all 65536 pairs of bytes
    std::string f = bpe;
    for (int i = 0; i < 65536; ++i) f += fmt::format("{}[{},{}]", i ? "," : "", i / 256, i % 256);
    check_loader(d, "bpe_all_byte_pairs", f + "]}", Expect::accepted, kTokenizer, load_any);
  }
}

BOOST_AUTO_TEST_CASE(word2vec_text_and_binary_vectors) {
  TempDir d;
  auto text = [](const std::string& path) { models::load_word2vec(path, false); };
  auto binary = [](const std::string& path) { models::load_word2vec(path, true); };
  // Headers that claim more than the file holds, refused before reserving.
  for (const char* header : {"75555557 1\n", "100000000 100\na 1\n", "4611686018427387904 4\n",
                             "1 4611686018427387904\n", "9223372036854775807 9223372036854775807\n"}) {
    check_loader(d, "w2v_lying_header.txt", header, Expect::refused, kWord2vec, text);
    check_loader(d, "w2v_lying_header.bin", header, Expect::refused, kWord2vec, binary);
  }
  const int64_t n = 100000;
  {  // 100k one-number vectors of distinct words
    std::string f = fmt::format("{} 1\n", n);
    for (int64_t i = 0; i < n; ++i) f += word(i) + " 0\n";
    check_loader(d, "w2v_tiny_vectors.txt", f, Expect::accepted, kWord2vec, text);
  }
  {
    std::string f = fmt::format("{} 1\n", n);
    for (int64_t i = 0; i < n; ++i) f += word(i) + ' ' + std::string(4, '\0');
    check_loader(d, "w2v_tiny_vectors.bin", f, Expect::accepted, kWord2vec, binary);
  }
  {  // one vector of 300k numbers, and one word of 1 MB
    std::string f = "1 300000\nw";
    for (int i = 0; i < 300000; ++i) f += " 0";
    check_loader(d, "w2v_long_vector.txt", f + "\n", Expect::accepted, kWord2vec, text);
    check_loader(d, "w2v_long_word.txt", "1 1\n" + std::string(1 << 20, 'x') + " 1\n", Expect::accepted, kWord2vec,
                 text);
    check_loader(d, "w2v_long_word.bin", "1 1\n" + std::string(1 << 20, 'x') + " \1\1\1\1", Expect::accepted, kWord2vec,
                 binary);
  }
}

BOOST_AUTO_TEST_CASE(similarity_and_analogy_files) {
  TempDir d;
  models::KeyedVectors kv;
  kv.words = {"a", "b", "c", "d", "e"};
  kv.dim = 2;
  kv.vectors = {1, 0, 0, 1, 1, 1, -1, 0, 0, -1};
  kv.rebuild_index();
  auto similarity = [&](const std::string& path) { models::evaluate_similarity(kv, path); };
  auto analogies = [&](const std::string& path) { models::evaluate_analogies(kv, path); };
  std::string pairs, sections, questions;
  for (int i = 0; i < 200000; ++i) {
    pairs += fmt::format("{} {} {}\n", kv.words[i % 5], kv.words[(i + 1) % 5], i % 10);
    sections += ": s\n";
    questions += "a b c d\n";
  }
  check_loader(d, "similarity_many_pairs", pairs, Expect::accepted, kWordEval, similarity);
  check_loader(d, "similarity_long_word", "a " + std::string(1 << 20, 'b') + " 1\n", Expect::accepted, kWordEval,
               similarity);
  check_loader(d, "similarity_long_number", "a b " + std::string(1 << 20, '1') + "\n", Expect::refused, kWordEval,
               similarity);
  check_loader(d, "analogy_section_lines", sections + ": s\na b c d\n", Expect::accepted, kWordEval, analogies);
  check_loader(d, "analogy_many_questions", ": s\n" + questions, Expect::accepted, kWordEval, analogies);
  check_loader(d, "analogy_long_line", ": s\na b c " + std::string(1 << 20, 'd') + "\n", Expect::accepted, kWordEval,
               analogies);
}

BOOST_AUTO_TEST_CASE(text_and_brown_readers) {
  TempDir d;
  auto paragraphs = [](const std::string& path) { data::read_text_file(path); };
  auto whole = [](const std::string& path) { data::read_text_file(path, data::TextSplit::whole); };
  std::string tiny, blank(1 << 20, '\n');
  for (int i = 0; i < 200000; ++i) tiny += "a\n\n";
  check_loader(d, "text_tiny_paragraphs", tiny, Expect::accepted, kText, paragraphs);
  check_loader(d, "text_one_long_line", std::string(1 << 22, 'a'), Expect::accepted, kText, paragraphs);
  check_loader(d, "text_blank_lines", blank + "a", Expect::accepted, kText, paragraphs);
  check_loader(d, "text_whole", std::string(1 << 22, 'a'), Expect::accepted, kText, whole);

  auto brown = [](const std::string& path) { data::read_brown(fs::path(path).parent_path().string()); };
  std::string tokens, lines;
  for (int i = 0; i < 200000; ++i) tokens += "a/b ";
  for (int i = 0; i < 200000; ++i) lines += "a/b\n\n";
  for (auto [name, content] : {std::pair{"ca01", tokens}, std::pair{"cb01", lines}}) {
    TempDir corpus;
    check_loader(corpus, name, content, Expect::accepted, kText, brown);
  }
}
