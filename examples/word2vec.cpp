// word2vec — skip-gram with negative sampling on the Brown corpus (words with
// their tags stripped, case kept, one sentence per line) or any text file
// (one sentence per line, split at whitespace), with gensim's defaults.
//
//   build/examples/word2vec                                   # Brown corpus
//   build/examples/word2vec --data my.txt --threads 2 --out vec.bin --binary
//   build/examples/word2vec --similarity wordsim353.tsv --analogies questions-words.txt
//
// --dump-sentences FILE writes the training sentences exactly as tokenised,
// so another implementation (bench/compare_word2vec.py) can see the same tokens.
#include <filesystem>
#include <fstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "data/brown.h"
#include "data/corpus.h"
#include "data/words.h"
#include "models/word2vec.h"
#include "models/word_eval.h"
#include "report/progress.h"
#include "report/report.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

struct Config {
  std::string data, brown_dir, out = "out/word2vec/vectors.txt", similarity, analogies, dump;
  std::vector<std::string> show = {"man", "money", "church", "president", "war"};
  models::Word2VecOptions w2v;
  bool binary = false;
};

void add_options(CLI::App& app, Config& c) {
  models::Word2VecOptions& o = c.w2v;
  app.add_option("--data", c.data, "a text file, one sentence per line (default: the Brown corpus)");
  app.add_option("--brown-dir", c.brown_dir, "where fetch_brown.sh put the corpus");
  app.add_option("--out", c.out, "where to write the vectors");
  app.add_flag("--binary", c.binary, "write word2vec's binary format instead of text");
  app.add_option("--dim", o.dim, "vector size")->capture_default_str();
  app.add_option("--window", o.window, "maximum window")->capture_default_str();
  app.add_option("--min-count", o.min_count, "drop rarer words")->capture_default_str();
  app.add_option("--max-vocab", o.max_vocab, "keep only the most frequent words (0: all)")->capture_default_str();
  app.add_option("--sample", o.sample, "subsampling threshold")->capture_default_str();
  app.add_option("--negative", o.negative, "negatives per pair")->capture_default_str();
  app.add_option("--alpha", o.alpha, "initial learning rate")->capture_default_str();
  app.add_option("--min-alpha", o.min_alpha, "final learning rate")->capture_default_str();
  app.add_option("--epochs", o.epochs, "passes over the corpus")->capture_default_str();
  app.add_option("--threads", o.threads, "Hogwild threads (1: deterministic)")->capture_default_str();
  app.add_option("--seed", o.seed, "random seed")->capture_default_str();
  app.add_option("--similarity", c.similarity, "WordSim-353 / SimLex-999 style file to evaluate on");
  app.add_option("--analogies", c.analogies, "questions-words.txt style file to evaluate on");
  app.add_option("--neighbours", c.show, "words whose nearest neighbours are printed");
  app.add_option("--dump-sentences", c.dump, "write the tokenised sentences to FILE and exit");
}

// One sentence a line, its words separated by spaces.
void dump_sentences(const data::TokenCorpus& corpus, const std::string& path) {
  std::ofstream f(path);
  const auto& tokens = corpus.token_ids();
  const auto& offsets = corpus.offsets();
  for (int64_t s = 0; s < corpus.sentences(); ++s) {
    for (int64_t i = offsets[s]; i < offsets[s + 1]; ++i) f << (i > offsets[s] ? " " : "") << corpus.word(tokens[i]);
    f << '\n';
  }
  if (!f) throw ValueError(fmt::format("cannot write --dump-sentences {}", path));
  fmt::print("wrote {} sentences to {}\n", corpus.sentences(), path);
}

// Trains all epochs with a progress bar and prints the throughput.
void train(models::Word2Vec& w2v) {
  const models::Word2VecOptions& o = w2v.options();
  report::Progress bar("word2vec", w2v.raw_words() * o.epochs, "words");
  w2v.train([&](const models::TrainProgress& p) {
    bar.update(p.words_done, static_cast<double>(p.words_done), fmt::format("lr {:.5f}", p.alpha));
  });
  const double wps = static_cast<double>(w2v.raw_words() * o.epochs) / w2v.train_seconds();
  bar.finish(fmt::format("{} words/s", report::format_count(wps)));
  fmt::print("trained {} epochs in {:.2f} s: {:.0f} words/s ({} threads)\n", o.epochs, w2v.train_seconds(), wps,
             o.threads);
}

// Nearest neighbours of the --neighbours words, then the --similarity and
// --analogies benchmarks when given.
void evaluate(const models::KeyedVectors& kv, const Config& c) {
  for (const auto& w : c.show) {
    if (kv.id(w) < 0) continue;
    std::string line;
    for (const auto& [n, s] : models::nearest(kv, w, 8)) line += fmt::format(" {} ({:.2f})", n, s);
    fmt::print("  {:>10}:{}\n", w, line);
  }
  if (!c.similarity.empty()) {
    auto r = models::evaluate_similarity(kv, c.similarity);
    fmt::print("similarity {}: Spearman {:.4f}, Pearson {:.4f} on {} of {} pairs ({} out of vocabulary)\n",
               c.similarity, r.spearman, r.pearson, r.pairs - r.oov, r.pairs, r.oov);
  }
  if (!c.analogies.empty()) {
    auto r = models::evaluate_analogies(kv, c.analogies);
    for (const auto& s : r.sections)
      fmt::print("  {:<28} {:>5}/{:<5} {:6.2f}%  (coverage {}/{})\n", s.name, s.correct, s.seen,
                 s.seen ? 100.0 * s.correct / s.seen : 0.0, s.seen, s.total);
    fmt::print("analogies {}: accuracy {:.2f}% ({}/{}), coverage {:.1f}% of {} questions\n", c.analogies,
               100 * r.accuracy(), r.correct, r.seen, 100 * r.coverage(), r.total);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"word2vec: skip-gram with negative sampling (gensim's defaults)"};
  Config c;
  add_options(app, c);
  CLI11_PARSE(app, argc, argv);

  try {
    const std::string source = c.data.empty() ? (c.brown_dir.empty() ? data::default_brown_dir() : c.brown_dir) : c.data;
    models::Word2Vec w2v(c.w2v);
    int64_t sentences = 0;
    {  // The corpus is needed only to build: w2v keeps it as vocabulary ids.
      const data::TokenCorpus corpus = c.data.empty() ? data::read_brown_words(source) : data::read_word_lines(source);
      if (corpus.sentences() == 0) throw ValueError(fmt::format("the corpus {} has no words", source));
      if (!c.dump.empty()) {
        dump_sentences(corpus, c.dump);
        return 0;
      }
      w2v.build(corpus);
      sentences = corpus.sentences();
    }
    fmt::print("corpus {}: {} sentences, {} words; vocabulary {} (min_count {})\n", source, sentences,
               w2v.raw_words(), w2v.vocab().size(), c.w2v.min_count);
    train(w2v);

    const models::KeyedVectors kv = w2v.vectors();
    if (fs::path(c.out).has_parent_path()) fs::create_directories(fs::path(c.out).parent_path());
    models::save_word2vec(kv, c.out, c.binary);
    fmt::print("vectors written to {} ({})\n", c.out, c.binary ? "binary" : "text");
    evaluate(kv, c);
    fmt::print("peak RSS {:.1f} MiB\n", report::peak_rss_mib());
  } catch (const std::exception& e) {
    fmt::print(stderr, "word2vec: {}\n", e.what());
    return 1;
  }
  return 0;
}
