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
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "examples/common/corpus.h"
#include "examples/common/progress.h"
#include "examples/common/report.h"
#include "models/word2vec.h"
#include "models/word_eval.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

// Calls fn on each whitespace-separated word of line, without copying it.
template <class Fn>
void for_each_word(std::string_view line, Fn&& fn) {
  constexpr std::string_view space = " \t\n\v\f\r";
  for (size_t i = line.find_first_not_of(space); i != std::string_view::npos; i = line.find_first_not_of(space, i)) {
    const size_t end = std::min(line.find_first_of(space, i), line.size());
    fn(line.substr(i, end - i));
    i = end;
  }
}

// Brown files c<genre><two digits>: each non-blank line is a sentence of
// word/tag tokens; the tag is what follows the last '/'. Read straight into
// ids: the corpus never exists as strings.
models::TokenCorpus read_brown_sentences(const std::string& dir) {
  if (!fs::is_directory(dir))
    throw ValueError(fmt::format("Brown corpus directory {} does not exist: run scripts/fetch_brown.sh, "
                                 "or pass --data FILE", dir));
  std::vector<fs::path> files;
  static const std::regex name("c[a-r][0-9][0-9]");
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && std::regex_match(e.path().filename().string(), name)) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  if (files.empty())
    throw ValueError(fmt::format("{} has no Brown corpus files (ca01 ...): run scripts/fetch_brown.sh", dir));
  models::TokenCorpus out;
  for (const auto& f : files) {
    std::ifstream in(f);
    std::string line;
    for (int64_t ln = 1; std::getline(in, line); ++ln) {
      for_each_word(line, [&](std::string_view tok) {
        const size_t slash = tok.rfind('/');
        if (slash == std::string_view::npos || slash == 0)
          throw ValueError(fmt::format("{}:{}: token \"{}\" is not word/tag", f.string(), ln, tok));
        out.add(tok.substr(0, slash));
      });
      out.end_sentence();
    }
  }
  return out;
}

models::TokenCorpus read_text_sentences(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ValueError(fmt::format("cannot open --data {}", path));
  models::TokenCorpus out;
  for (std::string line; std::getline(in, line);) {
    for_each_word(line, [&](std::string_view w) { out.add(w); });
    out.end_sentence();
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"word2vec: skip-gram with negative sampling (gensim's defaults)"};
  std::string data, brown_dir, out = "out/word2vec/vectors.txt", similarity, analogies, dump;
  std::vector<std::string> show = {"man", "money", "church", "president", "war"};
  models::Word2VecOptions o;
  bool binary = false;
  app.add_option("--data", data, "a text file, one sentence per line (default: the Brown corpus)");
  app.add_option("--brown-dir", brown_dir, "where fetch_brown.sh put the corpus");
  app.add_option("--out", out, "where to write the vectors");
  app.add_flag("--binary", binary, "write word2vec's binary format instead of text");
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
  app.add_option("--similarity", similarity, "WordSim-353 / SimLex-999 style file to evaluate on");
  app.add_option("--analogies", analogies, "questions-words.txt style file to evaluate on");
  app.add_option("--neighbours", show, "words whose nearest neighbours are printed");
  app.add_option("--dump-sentences", dump, "write the tokenised sentences to FILE and exit");
  CLI11_PARSE(app, argc, argv);

  try {
    const std::string source = data.empty() ? (brown_dir.empty() ? examples::default_brown_dir() : brown_dir) : data;
    models::Word2Vec w2v(o);
    int64_t sentences = 0;
    {  // The corpus is needed only to build: w2v keeps it as vocabulary ids.
      const models::TokenCorpus corpus = data.empty() ? read_brown_sentences(source) : read_text_sentences(source);
      if (corpus.sentences() == 0) throw ValueError(fmt::format("the corpus {} has no words", source));
      if (!dump.empty()) {
        std::ofstream f(dump);
        const auto& tokens = corpus.token_ids();
        const auto& offsets = corpus.offsets();
        for (int64_t s = 0; s < corpus.sentences(); ++s) {
          for (int64_t i = offsets[s]; i < offsets[s + 1]; ++i)
            f << (i > offsets[s] ? " " : "") << corpus.word(tokens[i]);
          f << '\n';
        }
        if (!f) throw ValueError(fmt::format("cannot write --dump-sentences {}", dump));
        fmt::print("wrote {} sentences to {}\n", corpus.sentences(), dump);
        return 0;
      }
      w2v.build(corpus);
      sentences = corpus.sentences();
    }
    fmt::print("corpus {}: {} sentences, {} words; vocabulary {} (min_count {})\n", source, sentences,
               w2v.raw_words(), w2v.vocab().size(), o.min_count);
    examples::Progress bar("word2vec", w2v.raw_words() * o.epochs, "words");
    w2v.train([&](const models::TrainProgress& p) {
      bar.update(p.words_done, static_cast<double>(p.words_done), fmt::format("lr {:.5f}", p.alpha));
    });
    const double wps = static_cast<double>(w2v.raw_words() * o.epochs) / w2v.train_seconds();
    bar.finish(fmt::format("{} words/s", examples::format_count(wps)));
    fmt::print("trained {} epochs in {:.2f} s: {:.0f} words/s ({} threads)\n", o.epochs, w2v.train_seconds(), wps,
               o.threads);

    const models::KeyedVectors kv = w2v.vectors();
    if (fs::path(out).has_parent_path()) fs::create_directories(fs::path(out).parent_path());
    models::save_word2vec(kv, out, binary);
    fmt::print("vectors written to {} ({})\n", out, binary ? "binary" : "text");

    for (const auto& w : show) {
      if (kv.id(w) < 0) continue;
      std::string line;
      for (const auto& [n, s] : models::nearest(kv, w, 8)) line += fmt::format(" {} ({:.2f})", n, s);
      fmt::print("  {:>10}:{}\n", w, line);
    }
    if (!similarity.empty()) {
      auto r = models::evaluate_similarity(kv, similarity);
      fmt::print("similarity {}: Spearman {:.4f}, Pearson {:.4f} on {} of {} pairs ({} out of vocabulary)\n",
                 similarity, r.spearman, r.pearson, r.pairs - r.oov, r.pairs, r.oov);
    }
    if (!analogies.empty()) {
      auto r = models::evaluate_analogies(kv, analogies);
      for (const auto& s : r.sections)
        fmt::print("  {:<28} {:>5}/{:<5} {:6.2f}%  (coverage {}/{})\n", s.name, s.correct, s.seen,
                   s.seen ? 100.0 * s.correct / s.seen : 0.0, s.seen, s.total);
      fmt::print("analogies {}: accuracy {:.2f}% ({}/{}), coverage {:.1f}% of {} questions\n", analogies,
                 100 * r.accuracy(), r.correct, r.seen, 100 * r.coverage(), r.total);
    }
    fmt::print("peak RSS {:.1f} MiB\n", examples::peak_rss_mib());
  } catch (const std::exception& e) {
    fmt::print(stderr, "word2vec: {}\n", e.what());
    return 1;
  }
  return 0;
}
