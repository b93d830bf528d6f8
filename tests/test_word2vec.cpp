#define BOOST_TEST_MODULE word2vec
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/words.h"
#include "models/skip_gram.h"
#include "models/word2vec.h"
#include "models/word_eval.h"
#include "nn/gradcheck_module.h"
#include "testing.h"

using namespace tg;
using namespace tg::data;
using namespace tg::models;
using namespace tg::testing;
namespace tt = boost::test_tools;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = "/tmp/tg_test_word2vec_" + name;
  std::ofstream(path) << text;
  return path;
}

// A ValueError whose message names the file and line "path:line:".
void check_line_error(const std::function<void()>& fn, const std::string& where) {
  BOOST_CHECK_EXCEPTION(fn(), ValueError, says<ValueError>({where}));
}

Sentences tiny_corpus() {
  return {{"the", "cat", "sat", "on", "the", "mat"},
          {"the", "dog", "sat", "on", "the", "log"},
          {"a", "cat", "and", "a", "dog", "met", "on", "the", "mat"},
          {"the", "cat", "saw", "the", "dog"},
          {"rare"}};
}

// Unit-length hand-made vectors: man:king :: woman:queen holds exactly.
KeyedVectors toy_vectors() {
  KeyedVectors kv;
  kv.words = {"man", "woman", "king", "queen", "Apple"};
  kv.dim = 3;
  const float h = std::sqrt(0.5f);
  kv.vectors = {1, 0, 0, 0, 1, 0, h, 0, h, 0, h, h, 0, 0, -1};
  kv.rebuild_index();
  return kv;
}

}  // namespace

BOOST_AUTO_TEST_CASE(sgns_loss_gradcheck_both_tables) {
  Generator gen(3);
  SkipGram m(6, 4, &gen);
  m.context.detach().copy_(rand({6, 4}, DType::f32, &gen, -0.5, 0.5));
  m.to(DType::f64);
  Tensor in = ids({0, 2, 5}, {3}), out = ids({1, 1, 3}, {3}), negs = ids({4, 0, 2, 2, 3, 1}, {3, 2});
  GradcheckReport r = nn::gradcheck_module(m, [&](const std::vector<Tensor>&) { return m.loss(in, out, negs); }, {});
  BOOST_TEST_CONTEXT(r.str()) { BOOST_CHECK(r.passed); }
  BOOST_CHECK_EQUAL(r.inputs.size(), 2u);
  // The loss itself against its formula for one pair.
  Tensor l = m.loss(ids({0}, {1}), ids({1}, {1}), ids({4}, {1, 1}));
  double dp = 0, dn = 0;
  for (int c = 0; c < 4; ++c) {
    dp += m.center.at({0, c}) * m.context.at({1, c});
    dn += m.center.at({0, c}) * m.context.at({4, c});
  }
  const double expect = -(std::log(1 / (1 + std::exp(-dp))) + std::log(1 / (1 + std::exp(dn))));
  BOOST_TEST(l.item() == expect, tt::tolerance(1e-12));
  BOOST_CHECK_THROW(m.loss(in, out, ids({1, 2}, {2, 1})), ShapeError);
}

BOOST_AUTO_TEST_CASE(initialisation_as_word2vec) {
  SkipGram m(50, 10);
  auto c = m.center.to_vector<float>();
  auto u = m.context.to_vector<float>();
  float lo = 1, hi = -1;
  for (float x : c) lo = std::min(lo, x), hi = std::max(hi, x);
  BOOST_CHECK(lo >= -0.05f && hi <= 0.05f && hi - lo > 0.08f);
  for (float x : u) BOOST_CHECK_EQUAL(x, 0.0f);
}

BOOST_AUTO_TEST_CASE(token_corpus_holds_ids_counts_and_offsets) {
  Sentences s = tiny_corpus();
  s.insert(s.begin() + 2, std::vector<std::string>{});  // an empty sentence is dropped
  TokenCorpus c(s);
  BOOST_CHECK_EQUAL(c.sentences(), 5);
  BOOST_CHECK_EQUAL(c.tokens(), 6 + 6 + 9 + 5 + 1);
  BOOST_CHECK_EQUAL(c.distinct(), 12);
  const std::vector<int64_t> offsets = {0, 6, 12, 21, 26, 27};
  BOOST_CHECK_EQUAL_COLLECTIONS(c.offsets().begin(), c.offsets().end(), offsets.begin(), offsets.end());
  // Ids in order of first appearance: the cat sat on mat dog log ...
  const std::vector<int32_t> first = {0, 1, 2, 3, 0, 4};
  BOOST_CHECK_EQUAL_COLLECTIONS(c.token_ids().begin(), c.token_ids().begin() + 6, first.begin(), first.end());
  BOOST_CHECK_EQUAL(c.word(5), "dog");
  BOOST_CHECK_EQUAL(c.count(c.id("the")), 7);
  BOOST_CHECK_EQUAL(c.count(c.id("cat")), 3);
  BOOST_CHECK_EQUAL(c.id("zebra"), -1);
  // Every sentence reads back word for word.
  for (size_t i = 0, k = 0; i < s.size(); ++i) {
    if (s[i].empty()) continue;
    std::vector<std::string> back;
    for (int64_t t = c.offsets()[k]; t < c.offsets()[k + 1]; ++t) back.push_back(c.word(c.token_ids()[t]));
    BOOST_CHECK(back == s[i]);
    ++k;
  }
  // Streaming: words given as views of a line, not strings.
  TokenCorpus streamed;
  const std::string line = "b a b";
  for (size_t i = 0; i < line.size(); i += 2) streamed.add(std::string_view(line).substr(i, 1));
  streamed.end_sentence();
  streamed.end_sentence();
  BOOST_CHECK_EQUAL(streamed.sentences(), 1);
  BOOST_CHECK_EQUAL(streamed.count(streamed.id("b")), 2);
  BOOST_CHECK_EQUAL(streamed.id("b"), 0);
}

BOOST_AUTO_TEST_CASE(vocabulary_sorted_by_count_then_word) {
  const std::vector<std::string> expect = {"the", "cat", "dog", "on", "a", "mat", "sat"};
  const std::vector<int64_t> counts = {7, 3, 3, 3, 2, 2, 2};
  for (const Vocab& v : {build_vocab(tiny_corpus(), 2), build_vocab(TokenCorpus(tiny_corpus()), 2)}) {
    BOOST_CHECK_EQUAL_COLLECTIONS(v.words.begin(), v.words.end(), expect.begin(), expect.end());
    BOOST_CHECK_EQUAL_COLLECTIONS(v.counts.begin(), v.counts.end(), counts.begin(), counts.end());
    BOOST_CHECK_EQUAL(v.total, 7 + 3 + 3 + 3 + 2 + 2 + 2);
    BOOST_CHECK_EQUAL(v.id("rare"), -1);
    BOOST_CHECK_EQUAL(v.id("dog"), 2);
  }
  Vocab top = build_vocab(TokenCorpus(tiny_corpus()), 1, 3);
  BOOST_CHECK((top.words == std::vector<std::string>{"the", "cat", "dog"}));
  BOOST_CHECK_EQUAL(top.total, 13);
}

BOOST_AUTO_TEST_CASE(unigram_sampler_equals_upper_bound) {
  // A Zipf-like vocabulary as Brown's (15k words, a long tail at min_count),
  // a tiny one, and one word.
  std::vector<int64_t> zipf;
  for (int64_t i = 0; i < 15000; ++i) zipf.push_back(std::max<int64_t>(5, 60000 / (i + 1)));
  std::mt19937 gen(5);
  for (const auto& counts : {zipf, std::vector<int64_t>{16, 4, 1}, std::vector<int64_t>{7}}) {
    const std::vector<uint32_t> table = unigram_table(counts);
    UnigramSampler sampler(table);
    const uint32_t max = table.back();
    BOOST_CHECK_EQUAL(sampler.table_max(), max);
    std::vector<uint32_t> rs = {0, 1, max - 2, max - 1};
    for (uint32_t t : table)  // both sides of every boundary
      for (uint32_t r : {t - 1, t, t + 1})
        if (r < max) rs.push_back(r);
    std::uniform_int_distribution<uint32_t> uniform(0, max - 1);
    for (int i = 0; i < 200000; ++i) rs.push_back(uniform(gen));
    int64_t wrong = 0;
    for (uint32_t r : rs)
      wrong += sampler.index(r) != std::upper_bound(table.begin(), table.end(), r) - table.begin();
    BOOST_CHECK_EQUAL(wrong, 0);
    for (uint32_t bits : {0u, 12345u, max, UINT32_MAX}) BOOST_CHECK_EQUAL(sampler.draw(bits), sampler.index(bits % max));
  }
  BOOST_CHECK_THROW(UnigramSampler(std::vector<uint32_t>{}), ValueError);
  BOOST_CHECK_THROW(UnigramSampler(std::vector<uint32_t>{0, 0}), ValueError);
}

BOOST_AUTO_TEST_CASE(subsampling_unigram_table_and_schedule_match_formulas) {
  // (sqrt(f/t) + 1) * t/f with t = sample * total
  BOOST_TEST(keep_probability(10000, 1000000, 1e-3) == (std::sqrt(10.0) + 1) * 0.1, tt::tolerance(1e-12));
  BOOST_CHECK_EQUAL(keep_probability(500, 1000000, 1e-3), 1.0);
  BOOST_CHECK_EQUAL(keep_probability(10000, 1000000, 0.0), 1.0);
  std::vector<int64_t> counts = {16, 4, 1};
  auto t = unigram_table(counts);
  const double z = 8 + std::pow(4.0, 0.75) + 1;
  BOOST_CHECK_EQUAL(t[0], static_cast<uint32_t>(std::llround(8 / z * 2147483647.0)));
  BOOST_CHECK_EQUAL(t[1], static_cast<uint32_t>(std::llround((8 + std::pow(4.0, 0.75)) / z * 2147483647.0)));
  BOOST_CHECK_EQUAL(t[2], 2147483647u);
  BOOST_TEST(learning_rate(0.025, 1e-4, 0.0) == 0.025, tt::tolerance(1e-15));
  BOOST_TEST(learning_rate(0.025, 1e-4, 0.5) == 0.01255, tt::tolerance(1e-12));
  BOOST_TEST(learning_rate(0.025, 1e-4, 1.0) == 1e-4, tt::tolerance(1e-12));
  BOOST_TEST(learning_rate(0.025, 1e-4, 1.3) == 1e-4, tt::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(fast_sparse_path_equals_autograd_sgd) {
  Word2VecOptions o{.dim = 8, .window = 2, .min_count = 1, .sample = 0.2, .negative = 3, .epochs = 2, .seed = 7};
  Word2Vec w2v(o);
  Sentences corpus = tiny_corpus();
  w2v.build(corpus);
  Tensor c0 = w2v.model().center.detach().clone(), u0 = w2v.model().context.detach().clone();
  std::vector<SgnsStep> steps;
  w2v.train(corpus, {}, &steps);
  BOOST_REQUIRE(steps.size() > 50);
  // The schedule starts at alpha and decays linearly (never rises).
  BOOST_TEST(steps.front().alpha == 0.025f, tt::tolerance(1e-6f));
  for (size_t i = 1; i < steps.size(); ++i) BOOST_CHECK(steps[i].alpha <= steps[i - 1].alpha);
  BOOST_CHECK(steps.back().alpha < 0.02f);

  SkipGram ref(w2v.vocab().size(), o.dim);
  ref.center.detach().copy_(c0);
  ref.context.detach().copy_(u0);
  for (const SgnsStep& s : steps) {
    std::vector<int64_t> n(s.negatives.begin(), s.negatives.end());
    Tensor loss = ref.loss(from_vector(std::vector<int64_t>{s.input}, {1}),
                           from_vector(std::vector<int64_t>{s.output}, {1}),
                           from_vector(n, {1, static_cast<int64_t>(n.size())}));
    loss.backward();
    ref.center.detach().add_(ref.center.grad(), -s.alpha);
    ref.context.detach().add_(ref.context.grad(), -s.alpha);
    ref.zero_grad();
  }
  auto a = w2v.model().center.to_vector<float>(), b = ref.center.to_vector<float>();
  auto ua = w2v.model().context.to_vector<float>(), ub = ref.context.to_vector<float>();
  double diff = 0, moved = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max({diff, std::fabs(double(a[i]) - b[i]), std::fabs(double(ua[i]) - ub[i])});
    moved = std::max(moved, std::fabs(double(ua[i])));
  }
  BOOST_TEST_MESSAGE("fast vs autograd max diff " << diff << ", context moved " << moved);
  BOOST_CHECK(moved > 1e-3);  // training did change the tables
  BOOST_CHECK(diff < 1e-7);

  // Single-thread training is deterministic for a seed.
  Word2Vec again(o);
  again.build(corpus);
  again.train(corpus);
  BOOST_CHECK(again.model().center.to_vector<float>() == a);
  // Built from a TokenCorpus, the same training.
  Word2Vec compact(o);
  compact.build(TokenCorpus(corpus));
  compact.train();
  BOOST_CHECK(compact.model().center.to_vector<float>() == a);
  BOOST_CHECK_EQUAL(compact.raw_words(), w2v.raw_words());
  BOOST_CHECK_THROW(Word2Vec(o).train(), ValueError);
  BOOST_CHECK_THROW(Word2Vec(Word2VecOptions{.threads = 2}).train(corpus, {}, &steps), ValueError);
}

BOOST_AUTO_TEST_CASE(multithreaded_training_runs) {
  Sentences corpus;
  for (int i = 0; i < 200; ++i) corpus.push_back(tiny_corpus()[i % 4]);
  // Trailing sentences with no vocabulary word still count as trained, and a
  // sentence over 10,000 words is split (as gensim) without losing any.
  corpus.push_back({"once"});
  corpus.push_back(std::vector<std::string>(25001, "cat"));
  corpus.push_back({"twice"});
  Word2Vec w2v(Word2VecOptions{.dim = 16, .window = 2, .min_count = 2, .epochs = 3, .threads = 2});
  int calls = 0;
  TrainProgress last;
  w2v.train(corpus, [&](const TrainProgress& p) {
    ++calls;
    BOOST_CHECK(p.words_done <= p.words_total);
    last = p;
  });
  BOOST_CHECK(calls >= 1);
  BOOST_CHECK_EQUAL(w2v.raw_words(), 50 * (6 + 6 + 9 + 5) + 25003);
  BOOST_CHECK_EQUAL(last.words_done, 3 * w2v.raw_words());
  BOOST_CHECK_EQUAL(last.words_total, 3 * w2v.raw_words());
  for (float x : w2v.model().center.to_vector<float>()) BOOST_CHECK(std::isfinite(x));
  BOOST_CHECK_THROW(Word2Vec(Word2VecOptions{.min_count = 9}).build(tiny_corpus()), ValueError);
  BOOST_CHECK_THROW(Word2Vec(Word2VecOptions{.min_count = 9}).build(TokenCorpus()), ValueError);
  BOOST_CHECK_THROW(Word2Vec(Word2VecOptions{.dim = 0}), ValueError);
}

BOOST_AUTO_TEST_CASE(save_load_round_trip_text_and_binary) {
  KeyedVectors kv = toy_vectors();
  kv.vectors[1] = 1.2345678e-7f;
  for (bool binary : {false, true}) {
    const std::string path = write_file(binary ? "v.bin" : "v.txt", "");
    save_word2vec(kv, path, binary);
    KeyedVectors back = load_word2vec(path, binary);
    BOOST_CHECK(back.words == kv.words);
    BOOST_CHECK_EQUAL(back.dim, 3);
    BOOST_CHECK(back.vectors == kv.vectors);
    BOOST_CHECK_EQUAL(back.id("queen"), 3);
  }
  std::ifstream f("/tmp/tg_test_word2vec_v.txt");
  std::string header;
  std::getline(f, header);
  BOOST_CHECK_EQUAL(header, "5 3");
  check_line_error([&] { load_word2vec(write_file("bad.txt", "2 3\na 1 2 3\nb 1 x 3\n"), false); }, "bad.txt:3:");
  check_line_error([&] { load_word2vec(write_file("bad2.txt", "two 3\n"), false); }, "bad2.txt:1:");
  // Long enough for its header's counts, yet a line short.
  check_line_error([&] { load_word2vec(write_file("short.txt", "3 1\na 1\nb 22222\n"), false); }, "short.txt:4:");
  BOOST_CHECK_THROW(load_word2vec(write_file("trunc.bin", "1 3\nab "), true), ValueError);
  BOOST_CHECK_THROW(load_word2vec("/nonexistent/vectors.txt", false), ValueError);
}

BOOST_AUTO_TEST_CASE(correlations_with_ties) {
  BOOST_TEST(spearman({1, 2, 2, 3}, {1, 2, 3, 4}) == 4.5 / std::sqrt(22.5), tt::tolerance(1e-12));
  BOOST_TEST(pearson({1, 2, 3}, {2, 4, 6}) == 1.0, tt::tolerance(1e-12));
  BOOST_TEST(spearman({1, 2, 3}, {30, 20, 10}) == -1.0, tt::tolerance(1e-12));
  BOOST_CHECK_THROW(pearson({1}, {1}), ValueError);
}

BOOST_AUTO_TEST_CASE(nearest_and_similarity_on_hand_made_file) {
  KeyedVectors kv = toy_vectors();
  auto nn = nearest(kv, "man", 2);
  BOOST_REQUIRE_EQUAL(nn.size(), 2u);
  BOOST_CHECK_EQUAL(nn[0].first, "king");
  BOOST_TEST(nn[0].second == std::sqrt(0.5), tt::tolerance(1e-6));
  BOOST_CHECK_THROW(nearest(kv, "zebra", 3), ValueError);

  const std::string path = write_file("sim.tsv",
                                      "# a comment\nWord 1\tWord 2\tHuman (mean)\nman\twoman\t8\n"
                                      "King\tqueen\t9\n\nman\tapple\t1\nking\tzebra\t5\n");
  SimilarityResult r = evaluate_similarity(kv, path);
  BOOST_CHECK_EQUAL(r.pairs, 4);
  BOOST_CHECK_EQUAL(r.oov, 1);
  // human (8,9,1) vs cosine (0,0.5,0): ranks (2,3,1) vs (1.5,3,1.5).
  BOOST_TEST(r.spearman == 1.5 / std::sqrt(3.0), tt::tolerance(1e-6));
  BOOST_TEST(r.pearson == 1.5 / std::sqrt(38.0 / 6.0), tt::tolerance(1e-6));
  check_line_error([&] { evaluate_similarity(kv, write_file("sim_bad.tsv", "# c\nman\twoman\t8\nman\tking\n")); },
                   "sim_bad.tsv:3:");
  check_line_error([&] { evaluate_similarity(kv, write_file("sim_nan.tsv", "man\twoman\t8\nman\tking\thigh\n")); },
                   "sim_nan.tsv:2:");
  BOOST_CHECK_THROW(evaluate_similarity(kv, "/nonexistent/sim.tsv"), ValueError);
}

BOOST_AUTO_TEST_CASE(analogies_on_hand_made_file) {
  KeyedVectors kv = toy_vectors();
  const std::string path = write_file("q.txt",
                                      ": family\nman king woman queen\nMAN KING WOMAN QUEEN\nman king woman zebra\n"
                                      ": reversed\nking man queen woman\n");
  AnalogyResult r = evaluate_analogies(kv, path);
  BOOST_REQUIRE_EQUAL(r.sections.size(), 2u);
  BOOST_CHECK_EQUAL(r.sections[0].name, "family");
  BOOST_CHECK_EQUAL(r.sections[0].correct, 2);
  BOOST_CHECK_EQUAL(r.sections[0].seen, 2);
  BOOST_CHECK_EQUAL(r.sections[0].total, 3);
  BOOST_CHECK_EQUAL(r.sections[1].correct, 1);
  BOOST_CHECK_EQUAL(r.correct, 3);
  BOOST_TEST(r.coverage() == 0.75, tt::tolerance(1e-12));
  BOOST_TEST(r.accuracy() == 1.0, tt::tolerance(1e-12));
  // Restricted to the 3 most frequent words, no question has all four known.
  BOOST_CHECK_EQUAL(evaluate_analogies(kv, path, 3).seen, 0);
  check_line_error([&] { evaluate_analogies(kv, write_file("q_bad.txt", ": s\nman king woman\n")); }, "q_bad.txt:2:");
  check_line_error([&] { evaluate_analogies(kv, write_file("q_nosec.txt", "man king woman queen\n")); },
                   "q_nosec.txt:1:");
}

BOOST_AUTO_TEST_CASE(vector_file_headers_are_checked_against_the_file_size) {
  // A vector takes at least 1 + 2*dim bytes of text or 2 + 4*dim of binary:
  // headers claiming more than the file can hold are refused before anything
  // is reserved (an 11-byte "75555557 1" once reserved 2.4 GB).
  for (bool binary : {false, true})
    for (const char* header : {"75555557 1\n", "100000000 100\na 1\n", "4611686018427387904 4\n",
                               "1 4611686018427387904\n", "2 1\na 0\n"}) {
      const std::string path = write_file(binary ? "lying.bin" : "lying.txt", header);
      BOOST_CHECK_EXCEPTION(load_word2vec(path, binary), ValueError, says<ValueError>({path + ":1:", "can hold"}));
    }
  // Files exactly as small as their counts allow are read.
  KeyedVectors t = load_word2vec(write_file("tight.txt", "2 2\na 1 2\nb 3 4"), false);
  BOOST_CHECK(t.vectors == (std::vector<float>{1, 2, 3, 4}));
  const float v[2] = {0.5f, -2.0f};
  const std::string tight = write_file("tight.bin", "1 2\nw " + std::string(reinterpret_cast<const char*>(v), 8));
  KeyedVectors b = load_word2vec(tight, true);
  BOOST_CHECK(b.vectors == (std::vector<float>{0.5f, -2.0f}));
  BOOST_CHECK_EXCEPTION(load_word2vec("/tmp", false), ValueError, says<ValueError>({"/tmp", "not a readable file"}));
}

BOOST_AUTO_TEST_CASE(non_finite_vectors_and_scores_are_refused) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    const float v[4] = {1, 2, 3, bad};
    const std::string path = write_file("nan.bin", "2 2\na " + std::string(reinterpret_cast<const char*>(v), 8) +
                                                       "\nb " + std::string(reinterpret_cast<const char*>(v + 2), 8));
    BOOST_CHECK_EXCEPTION(load_word2vec(path, true), ValueError, says<ValueError>({path, "vector 2 of 2", "\"b\""}));
  }
  for (const char* bad : {"nan", "inf", "1e39"})
    check_line_error([&] { load_word2vec(write_file("nan.txt", fmt::format("2 2\na 1 2\nb 3 {}\n", bad)), false); },
                     "nan.txt:3:");
  // NaN, infinite and out-of-range scores, also on the first line (where a
  // score that is not a number at all marks a header).
  KeyedVectors kv = toy_vectors();
  for (const char* bad : {"nan", "NaN", "inf", "-Infinity", "1e400"}) {
    const std::string second = write_file("sim_inf.tsv", fmt::format("man\twoman\t8\nman\tking\t{}\n", bad));
    const std::string first = write_file("sim_inf1.tsv", fmt::format("man\tking\t{}\nman\twoman\t8\n", bad));
    BOOST_CHECK_EXCEPTION(evaluate_similarity(kv, second), ValueError,
                          says<ValueError>({second + ":2:", "not a finite number"}));
    BOOST_CHECK_EXCEPTION(evaluate_similarity(kv, first), ValueError,
                          says<ValueError>({first + ":1:", "not a finite number"}));
  }
}

BOOST_AUTO_TEST_CASE(analogy_sections_without_questions_are_left_out) {
  KeyedVectors kv = toy_vectors();
  AnalogyResult r = evaluate_analogies(kv, write_file("q_empty.txt", ": a\n: b\nman king woman queen\n: c\n: b\n"));
  BOOST_REQUIRE_EQUAL(r.sections.size(), 1u);
  BOOST_CHECK_EQUAL(r.sections[0].name, "b");
  BOOST_CHECK_EQUAL(r.sections[0].total, 1);
  BOOST_CHECK_THROW(evaluate_analogies(kv, write_file("q_none.txt", ": a\n: b\n")), ValueError);
}
