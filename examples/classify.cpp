// classify — an encoder-only transformer reads passages of the Brown corpus
// and names their genre (press, fiction, learned, ...), against a
// bag-of-embeddings baseline that sees the same words but not their order.
// Documents are split into train/validation before cutting passages, so no
// document is on both sides.
//
//   build/examples/classify --steps 800 --passage 128
//   build/examples/classify --bf16             # GEMMs in bfloat16 (autocast), float32 weights
//
// BagOfEmbeddings below also shows how to write a model of your own against
// the nn API: register submodules by name, write forward().
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/corpus.h"
#include "data/words.h"
#include "models/transformer.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

// Token ids: the padding, unknown words, then the vocabulary's words (by count).
constexpr int64_t PAD = 0, UNK = 1, kFirstWord = 2;

// The baseline: the mean of the passage's word vectors, then a linear layer.
class BagOfEmbeddings : public nn::Module {
 public:
  BagOfEmbeddings(int64_t vocab, int64_t dim, int64_t classes) : Module("BagOfEmbeddings") {
    embed = register_module("embed", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = vocab, .dim = dim, .padding_idx = PAD}));
    head = register_module("head", std::make_shared<nn::Linear>(nn::LinearOptions{.in = dim, .out = classes}));
  }
  // ids (B,S), padding (B,S) nonzero = padding -> logits (B, classes)
  Tensor forward(const Tensor& ids, const Tensor& padding) {
    Tensor keep = eq(padding, zeros_like(padding)).to(DType::f32);              // (B,S)
    Tensor pooled = sum(embed->forward(ids) * keep.unsqueeze(2), {1}) / sum(keep, {1}, true);  // (B,C)
    return head->forward(pooled);
  }
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::Linear> head;
};

struct Config {
  std::string data, brown_dir, out = "out/classify";
  int64_t steps = 800, batch = 32, passage = 128, vocab = 8000, dim = 64, layers = 2, heads = 4;
  double lr = 5e-3;
  int threads = 0;
  uint64_t seed = 3;
  bool bf16 = false;
};

// The precision of the GEMMs of training and scoring (autocast.h).
DType gemm_precision(const Config& c) { return c.bf16 ? DType::bf16 : DType::f32; }
std::string precision_note(const Config& c) {
  return c.bf16 ? "GEMMs in bfloat16 (autocast), float32 master weights" : "GEMMs in float32";
}

void add_options(CLI::App& app, Config& c) {
  app.add_option("--data", c.data, "Not supported: the genres come from the Brown corpus")->check([](const std::string& s) {
    return s.empty() ? std::string() : std::string("classify needs the Brown corpus's genre labels; use --brown-dir");
  });
  app.add_option("--brown-dir", c.brown_dir, "Where scripts/fetch_brown.sh put the Brown corpus (default: its cache)");
  app.add_option("--steps", c.steps, "Training steps per model")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "Passages per step")->check(CLI::PositiveNumber);
  app.add_option("--passage", c.passage, "Words per passage")->check(CLI::PositiveNumber);
  app.add_option("--vocab", c.vocab, "Token ids: <pad>, <unk> and the most frequent training words (at least 3)")
      ->check(CLI::Range(int64_t{3}, std::numeric_limits<int64_t>::max()));
  app.add_option("--dim", c.dim, "Embedding / transformer width");
  app.add_option("--layers", c.layers, "Transformer layers");
  app.add_option("--heads", c.heads, "Attention heads");
  app.add_option("--lr", c.lr, "AdamW learning rate");
  app.add_option("--threads", c.threads, "Threads for kernels and OpenBLAS");
  app.add_option("--seed", c.seed, "Seed");
  app.add_option("--out", c.out, "Output directory");
  app.add_flag("--bf16", c.bf16, "bfloat16 autocast: GEMMs in bfloat16, float32 master weights");
}

// Genre names sorted, and their ids.
struct Classes {
  std::map<std::string, int64_t> id;
  std::vector<std::string> names;
  int64_t size() const { return static_cast<int64_t>(names.size()); }
};

Classes classes_of(const data::Corpus& corpus) {
  Classes k;
  for (const auto* docs : {&corpus.train, &corpus.val})
    for (const auto& d : *docs) k.id.emplace(d.label, 0);
  for (auto& [name, id] : k.id) id = k.size(), k.names.push_back(name);
  return k;
}

// The lower-cased words of the training documents by count, at most
// max_words of them (validation words stay unseen).
data::Vocab vocabulary(const std::vector<data::Document>& train, int64_t max_words) {
  data::TokenCorpus words;
  for (const auto& d : train) {
    data::for_each_word(d.text, data::WordSplit::lowercase, [&](std::string_view w) { words.add(w); });
    words.end_sentence();
  }
  return data::build_vocab(words, 1, max_words);
}

struct Passages {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> label;
};

// Each document's words cut into passages of len words (the rest dropped),
// labelled with the document's genre.
Passages cut(const std::vector<data::Document>& docs, const data::Vocab& vocab, const Classes& classes, int64_t len) {
  Passages p;
  for (const auto& d : docs) {
    const std::vector<std::string> w = data::split_words(d.text, data::WordSplit::lowercase);
    for (size_t s = 0; s + len <= w.size(); s += len) {
      std::vector<int64_t> ids;
      for (size_t i = s; i < s + len; ++i) {
        const int32_t id = vocab.id(w[i]);
        ids.push_back(id < 0 ? UNK : kFirstWord + id);
      }
      p.ids.push_back(std::move(ids));
      p.label.push_back(classes.id.at(d.label));
    }
  }
  return p;
}

std::pair<Tensor, Tensor> batch_of(const Passages& p, const std::vector<size_t>& rows) {
  std::vector<int64_t> ids, y;
  for (size_t r : rows) {
    ids.insert(ids.end(), p.ids[r].begin(), p.ids[r].end());
    y.push_back(p.label[r]);
  }
  const int64_t B = rows.size();
  return {from_vector(ids, {B, static_cast<int64_t>(ids.size()) / B}), from_vector(y, {B})};
}

// A model under comparison: forward maps ids (B,S) and padding (B,S) to logits (B, classes).
struct Entry {
  std::string name;
  std::shared_ptr<nn::Module> module;
  std::function<Tensor(const Tensor&, const Tensor&)> forward;
};

// c.steps AdamW steps on random batches of passages.
void train_model(const Entry& e, const Passages& train, const Config& c) {
  nn::AdamW opt(e.module->parameters(), {.lr = c.lr, .weight_decay = 0.01});
  Generator gen(c.seed + 1);
  report::Progress bar(e.name.substr(0, 6), c.steps, "passages");
  const Tensor no_padding = zeros({c.batch, c.passage}, DType::i64);
  double loss_avg = 0;
  for (int64_t s = 1; s <= c.steps; ++s) {
    std::vector<size_t> rows;
    for (int64_t i = 0; i < c.batch; ++i) rows.push_back(gen.randint(0, static_cast<int64_t>(train.ids.size())));
    auto [x, y] = batch_of(train, rows);
    Tensor loss;
    {
      // Forward and loss; each node's backward runs at the precision it was recorded with.
      AutocastGuard autocast(gemm_precision(c));
      loss = cross_entropy(e.forward(x, no_padding), y);
    }
    loss.backward();
    opt.step();
    opt.zero_grad();
    loss_avg = s == 1 ? loss.item() : 0.98 * loss_avg + 0.02 * loss.item();
    bar.update(s, static_cast<double>(s * c.batch), fmt::format("loss {:.3f}", loss_avg));
  }
  bar.finish(fmt::format("loss {:.3f}", loss_avg));
}

using Confusion = std::vector<std::vector<int64_t>>;  // [true genre][predicted genre]

// The fraction of passages classified right (in evaluation mode, at the
// precision the model trained in), counting each into confusion when one is given.
double accuracy(const Entry& e, const Passages& p, int64_t batch, DType precision, Confusion* confusion) {
  e.module->eval();
  NoGradGuard no_grad;
  AutocastGuard autocast(precision);
  int64_t right = 0;
  for (size_t s = 0; s < p.ids.size(); s += batch) {
    std::vector<size_t> rows;
    for (size_t r = s; r < std::min(p.ids.size(), s + batch); ++r) rows.push_back(r);
    auto [x, y] = batch_of(p, rows);
    auto pred = argmax(e.forward(x, zeros(x.shape(), DType::i64)), 1).to_vector<int64_t>();
    auto truth = y.to_vector<int64_t>();
    for (size_t i = 0; i < rows.size(); ++i) {
      right += pred[i] == truth[i];
      if (confusion) ++(*confusion)[truth[i]][pred[i]];
    }
  }
  return static_cast<double>(right) / p.ids.size();
}

// Genres lettered A, B, ... in the columns, named in the rows.
report::Table confusion_table(const Confusion& confusion, const Classes& classes) {
  const int64_t K = classes.size();
  report::Table cm{{"true \\ predicted"}, {}};
  for (int64_t k = 0; k < K; ++k) cm.header.push_back(fmt::format("{}", static_cast<char>('A' + k)));
  for (int64_t k = 0; k < K; ++k) {
    std::vector<std::string> row{fmt::format("{} {}", static_cast<char>('A' + k), classes.names[k])};
    for (int64_t j = 0; j < K; ++j) row.push_back(confusion[k][j] ? fmt::format("{}", confusion[k][j]) : ".");
    cm.rows.push_back(row);
  }
  return cm;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"classify: Brown passages by genre, transformer encoder vs bag of embeddings"};
  add_options(app, c);
  CLI11_PARSE(app, argc, argv);

  try {
    if (c.threads > 0) set_num_threads(c.threads);
    fs::create_directories(c.out);
    const data::Corpus corpus = data::load_corpus("", c.brown_dir, 0.2, c.seed);
    const Classes classes = classes_of(corpus);
    // The vocabulary from the training documents only.
    const data::Vocab vocab = vocabulary(corpus.train, c.vocab - kFirstWord);
    const int64_t V = vocab.size() + kFirstWord, K = classes.size();
    Passages train = cut(corpus.train, vocab, classes, c.passage), val = cut(corpus.val, vocab, classes, c.passage);
    if (train.ids.empty() || val.ids.empty())
      throw ValueError(fmt::format("classify: no passages of {} words (train {}, validation {})", c.passage,
                                   train.ids.size(), val.ids.size()));
    fmt::print("classify: {} genres, {} train / {} validation passages of {} words, vocabulary {}; {}\n\n", K,
               train.ids.size(), val.ids.size(), c.passage, V, precision_note(c));

    manual_seed(c.seed);
    auto transformer = std::make_shared<models::TransformerClassifier>(
        models::TransformerOptions{.vocab = V, .max_len = c.passage, .layers = c.layers, .heads = c.heads, .dim = c.dim}, K);
    auto bag = std::make_shared<BagOfEmbeddings>(V, c.dim, K);
    const std::vector<Entry> entries = {
        {"bag-of-embeddings", bag, [&](const Tensor& x, const Tensor& pad) { return bag->forward(x, pad); }},
        {"transformer", transformer, [&](const Tensor& x, const Tensor& pad) { return transformer->forward(x, pad); }}};

    report::Table table{{"model", "params", "train acc", "val acc", "time"}, {}};
    std::string confusions;
    for (const auto& e : entries) {
      const auto start = std::chrono::steady_clock::now();  // the time column: training and scoring
      train_model(e, train, c);
      Confusion confusion(K, std::vector<int64_t>(K, 0));
      const double tr = accuracy(e, train, c.batch, gemm_precision(c), nullptr),
                   va = accuracy(e, val, c.batch, gemm_precision(c), &confusion);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      table.rows.push_back({e.name, fmt::format("{}", e.module->num_parameters()), fmt::format("{:.1f}%", 100 * tr),
                            fmt::format("{:.1f}%", 100 * va), report::format_duration(seconds)});
      confusions += fmt::format("\nconfusion matrix, {} (validation passages):\n{}", e.name,
                                confusion_table(confusion, classes).text());
    }
    fmt::print("\n{}{}", table.text(), confusions);
    report::write_file(c.out + "/results.md", report::provenance() + table.markdown() + "\n" + precision_note(c) + ".\n");
    report::write_file(c.out + "/confusion.txt", confusions);
    fmt::print("\nwrote {0}/results.md and {0}/confusion.txt\n", c.out);
  } catch (const std::exception& ex) {
    fmt::print(stderr, "classify: {}\n", ex.what());
    return 1;
  }
  return 0;
}
