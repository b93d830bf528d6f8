// classify — an encoder-only transformer reads passages of the Brown corpus
// and names their genre (press, fiction, learned, ...), against a
// bag-of-embeddings baseline that sees the same words but not their order.
// Documents are split into train/validation before cutting passages, so no
// document is on both sides.
//
//   build/examples/classify --steps 800 --passage 128
//
// BagOfEmbeddings below also shows how to write a model of your own against
// the nn API: register submodules by name, write forward().
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <unordered_map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "examples/common/corpus.h"
#include "examples/common/progress.h"
#include "examples/common/report.h"
#include "models/transformer.h"
#include "nn/nn.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

constexpr int64_t PAD = 0, UNK = 1;

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
};

// Lower-cased words and punctuation marks.
std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::string w;
  auto flush = [&] {
    if (!w.empty()) out.push_back(w), w.clear();
  };
  for (unsigned char ch : text) {
    if (std::isalnum(ch) || ch >= 0x80 || ch == '\'') w += static_cast<char>(std::tolower(ch));
    else {
      flush();
      if (!std::isspace(ch)) out.push_back(std::string(1, static_cast<char>(ch)));
    }
  }
  flush();
  return out;
}

struct Passages {
  std::vector<std::vector<int64_t>> ids;
  std::vector<int64_t> label;
};

Passages cut(const std::vector<data::Document>& docs, const std::unordered_map<std::string, int64_t>& vocab,
             const std::map<std::string, int64_t>& classes, int64_t len) {
  Passages p;
  for (const auto& d : docs) {
    auto w = words(d.text);
    for (size_t s = 0; s + len <= w.size(); s += len) {
      std::vector<int64_t> ids;
      for (size_t i = s; i < s + len; ++i) {
        auto it = vocab.find(w[i]);
        ids.push_back(it == vocab.end() ? UNK : it->second);
      }
      p.ids.push_back(std::move(ids));
      p.label.push_back(classes.at(d.label));
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

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"classify: Brown passages by genre, transformer encoder vs bag of embeddings"};
  app.add_option("--data", c.data, "Not supported: the genres come from the Brown corpus")->check([](const std::string& s) {
    return s.empty() ? std::string() : std::string("classify needs the Brown corpus's genre labels; use --brown-dir");
  });
  app.add_option("--brown-dir", c.brown_dir, "Where scripts/fetch_brown.sh put the Brown corpus (default: its cache)");
  app.add_option("--steps", c.steps, "Training steps per model")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "Passages per step")->check(CLI::PositiveNumber);
  app.add_option("--passage", c.passage, "Words per passage")->check(CLI::PositiveNumber);
  app.add_option("--vocab", c.vocab, "Most frequent training words kept (the rest are <unk>)")->check(CLI::PositiveNumber);
  app.add_option("--dim", c.dim, "Embedding / transformer width");
  app.add_option("--layers", c.layers, "Transformer layers");
  app.add_option("--heads", c.heads, "Attention heads");
  app.add_option("--lr", c.lr, "AdamW learning rate");
  app.add_option("--threads", c.threads, "Threads for kernels and OpenBLAS");
  app.add_option("--seed", c.seed, "Seed");
  app.add_option("--out", c.out, "Output directory");
  CLI11_PARSE(app, argc, argv);

  try {
    if (c.threads > 0) set_num_threads(c.threads);
    fs::create_directories(c.out);
    examples::Corpus corpus = examples::load_corpus("", c.brown_dir, 0.2, c.seed);
    // Classes and vocabulary from the training documents only.
    std::map<std::string, int64_t> classes;
    for (const auto& d : corpus.train) classes.emplace(d.label, 0);
    for (const auto& d : corpus.val) classes.emplace(d.label, 0);
    std::vector<std::string> class_names;
    for (auto& [name, id] : classes) id = static_cast<int64_t>(class_names.size()), class_names.push_back(name);
    std::unordered_map<std::string, int64_t> counts;
    for (const auto& d : corpus.train)
      for (auto& w : words(d.text)) ++counts[w];
    std::vector<std::pair<int64_t, std::string>> by_count;
    for (auto& [w, n] : counts) by_count.push_back({-n, w});
    std::sort(by_count.begin(), by_count.end());
    std::unordered_map<std::string, int64_t> vocab;
    for (size_t i = 0; i < by_count.size() && static_cast<int64_t>(i) + 2 < c.vocab; ++i) vocab[by_count[i].second] = i + 2;
    const int64_t V = static_cast<int64_t>(vocab.size()) + 2, K = static_cast<int64_t>(class_names.size());
    Passages train = cut(corpus.train, vocab, classes, c.passage), val = cut(corpus.val, vocab, classes, c.passage);
    if (train.ids.empty() || val.ids.empty())
      throw ValueError(fmt::format("classify: no passages of {} words (train {}, validation {})", c.passage,
                                   train.ids.size(), val.ids.size()));
    fmt::print("classify: {} genres, {} train / {} validation passages of {} words, vocabulary {}\n\n", K,
               train.ids.size(), val.ids.size(), c.passage, V);

    manual_seed(c.seed);
    auto transformer = std::make_shared<models::TransformerClassifier>(
        models::TransformerOptions{.vocab = V, .max_len = c.passage, .layers = c.layers, .heads = c.heads, .dim = c.dim}, K);
    auto bag = std::make_shared<BagOfEmbeddings>(V, c.dim, K);
    struct Entry {
      std::string name;
      std::shared_ptr<nn::Module> module;
      std::function<Tensor(const Tensor&, const Tensor&)> forward;
    };
    std::vector<Entry> entries = {
        {"bag-of-embeddings", bag, [&](const Tensor& x, const Tensor& pad) { return bag->forward(x, pad); }},
        {"transformer", transformer, [&](const Tensor& x, const Tensor& pad) { return transformer->forward(x, pad); }}};

    examples::Table table{{"model", "params", "train acc", "val acc", "time"}, {}};
    std::string confusions;
    Tensor no_padding = zeros({c.batch, c.passage}, DType::i64);
    for (auto& e : entries) {
      nn::AdamW opt(e.module->parameters(), {.lr = c.lr, .weight_decay = 0.01});
      Generator gen(c.seed + 1);
      examples::Progress bar(e.name.substr(0, 6), c.steps, "passages");
      double loss_avg = 0;
      for (int64_t s = 1; s <= c.steps; ++s) {
        std::vector<size_t> rows;
        for (int64_t i = 0; i < c.batch; ++i) rows.push_back(gen.randint(0, static_cast<int64_t>(train.ids.size())));
        auto [x, y] = batch_of(train, rows);
        Tensor loss = cross_entropy(e.forward(x, no_padding), y);
        loss.backward();
        opt.step();
        opt.zero_grad();
        loss_avg = s == 1 ? loss.item() : 0.98 * loss_avg + 0.02 * loss.item();
        bar.update(s, static_cast<double>(s * c.batch), fmt::format("loss {:.3f}", loss_avg));
      }
      bar.finish(fmt::format("loss {:.3f}", loss_avg));
      // Accuracy and the confusion matrix (rows: true genre, columns: predicted).
      e.module->eval();
      NoGradGuard ng;
      auto accuracy = [&](const Passages& p, std::vector<std::vector<int64_t>>* confusion) {
        int64_t right = 0;
        for (size_t s = 0; s < p.ids.size(); s += c.batch) {
          std::vector<size_t> rows;
          for (size_t r = s; r < std::min(p.ids.size(), s + c.batch); ++r) rows.push_back(r);
          auto [x, y] = batch_of(p, rows);
          auto pred = argmax(e.forward(x, zeros(x.shape(), DType::i64)), 1).to_vector<int64_t>();
          auto truth = y.to_vector<int64_t>();
          for (size_t i = 0; i < rows.size(); ++i) {
            right += pred[i] == truth[i];
            if (confusion) ++(*confusion)[truth[i]][pred[i]];
          }
        }
        return static_cast<double>(right) / p.ids.size();
      };
      std::vector<std::vector<int64_t>> confusion(K, std::vector<int64_t>(K, 0));
      double tr = accuracy(train, nullptr), va = accuracy(val, &confusion);
      table.rows.push_back({e.name, fmt::format("{}", e.module->num_parameters()), fmt::format("{:.1f}%", 100 * tr),
                            fmt::format("{:.1f}%", 100 * va), examples::format_duration(bar.seconds())});
      examples::Table cm{{"true \\ predicted"}, {}};
      for (int64_t k = 0; k < K; ++k) cm.header.push_back(fmt::format("{}", static_cast<char>('A' + k)));
      for (int64_t k = 0; k < K; ++k) {
        std::vector<std::string> row{fmt::format("{} {}", static_cast<char>('A' + k), class_names[k])};
        for (int64_t j = 0; j < K; ++j) row.push_back(confusion[k][j] ? fmt::format("{}", confusion[k][j]) : ".");
        cm.rows.push_back(row);
      }
      confusions += fmt::format("\nconfusion matrix, {} (validation passages):\n{}", e.name, cm.text());
    }
    fmt::print("\n{}{}", table.text(), confusions);
    examples::write_file(c.out + "/results.md", table.markdown());
    examples::write_file(c.out + "/confusion.txt", confusions);
    fmt::print("\nwrote {0}/results.md and {0}/confusion.txt\n", c.out);
  } catch (const std::exception& ex) {
    fmt::print(stderr, "classify: {}\n", ex.what());
    return 1;
  }
  return 0;
}
