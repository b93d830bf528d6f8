// seq2seq — the fixed-size bottleneck of a recurrent encoder-decoder,
// measured. Three models learn the same synthetic translation (reverse, or
// sort, a string of digits):
//   lstm       LSTM encoder-decoder; the decoder sees the source only through
//              the encoder's final state (one fixed-size vector)
//   attention  the same with additive (Bahdanau) attention over all encoder states
//   transformer  the encoder-decoder transformer (self-, masked self- and cross-attention)
// and are scored by exact-match accuracy per source length. Without attention,
// accuracy falls as strings outgrow what one vector can hold.
//
//   build/examples/seq2seq --task reverse --min-len 4 --max-len 16 --steps 1500
//   build/examples/seq2seq --bf16              # GEMMs in bfloat16 (autocast), float32 weights
#include <cmath>
#include <filesystem>
#include <memory>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "models/seq2seq.h"
#include "models/transformer.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

namespace fs = std::filesystem;
using namespace tg;

namespace {

constexpr int64_t PAD = 0, BOS = 1, EOS = 2, DIGIT0 = 3, V = 13;  // ids 3..12 are the digits 0..9

struct Config {
  std::string task = "reverse", out = "out/seq2seq";
  std::vector<std::string> models = {"lstm", "attention", "transformer"};
  int64_t min_len = 4, max_len = 16, steps = 1500, batch = 64, eval_per_len = 200, hidden = 128, dim = 64;
  double lr = 2e-3;
  int threads = 0;
  uint64_t seed = 7;
  bool bf16 = false;
};

// The precision of the GEMMs of training and evaluation (autocast.h).
DType gemm_precision(const Config& c) { return c.bf16 ? DType::bf16 : DType::f32; }

struct Example {
  std::vector<int64_t> src, tgt;  // token ids, without BOS/EOS
};

Example make_example(const std::string& task, int64_t len, Generator& gen) {
  Example e;
  for (int64_t i = 0; i < len; ++i) e.src.push_back(DIGIT0 + gen.randint(0, 10));
  e.tgt = e.src;
  if (task == "reverse") std::reverse(e.tgt.begin(), e.tgt.end());
  else std::sort(e.tgt.begin(), e.tgt.end());
  return e;
}

// A batch of one source length (so no padding is needed): src (B,S),
// tgt_in = BOS + target (B,S+1), tgt_out = target + EOS (B,S+1).
struct Batch {
  Tensor src, tgt_in, tgt_out;
};

Batch make_batch(const std::vector<Example>& ex) {
  const int64_t B = ex.size(), S = ex[0].src.size();
  std::vector<int64_t> src, in, out;
  for (const auto& e : ex) {
    src.insert(src.end(), e.src.begin(), e.src.end());
    in.push_back(BOS);
    in.insert(in.end(), e.tgt.begin(), e.tgt.end());
    out.insert(out.end(), e.tgt.begin(), e.tgt.end());
    out.push_back(EOS);
  }
  return {from_vector(src, {B, S}), from_vector(in, {B, S + 1}), from_vector(out, {B, S + 1})};
}

std::shared_ptr<models::Seq2SeqModel> make_model(const std::string& kind, const Config& c) {
  if (kind == "transformer")
    return std::make_shared<models::EncoderDecoderTransformer>(models::TransformerOptions{
        .vocab = V, .max_len = c.max_len + 2, .layers = 2, .heads = 4, .dim = c.dim});
  return std::make_shared<models::Seq2SeqRNN>(
      models::Seq2SeqRNNOptions{.vocab = V, .embed = 32, .hidden = c.hidden, .attention = kind == "attention"});
}

// Exact-match accuracy per source length, on examples no model trained on,
// decoded at the precision the model trained in.
std::vector<double> evaluate(models::Seq2SeqModel& m, const Config& c) {
  AutocastGuard autocast(gemm_precision(c));
  std::vector<double> acc;
  for (int64_t len = c.min_len; len <= c.max_len; ++len) {
    Generator gen(c.seed * 1000003 + static_cast<uint64_t>(len));  // the same test set for every model
    std::vector<Example> ex;
    for (int64_t i = 0; i < c.eval_per_len; ++i) ex.push_back(make_example(c.task, len, gen));
    Batch b = make_batch(ex);
    auto out = m.greedy(b.src, Tensor(), BOS, EOS, len + 2);
    int64_t right = 0;
    for (size_t i = 0; i < ex.size(); ++i) right += out[i] == ex[i].tgt;
    acc.push_back(static_cast<double>(right) / ex.size());
  }
  m.train();
  return acc;
}

void add_options(CLI::App& app, Config& c) {
  app.add_option("--task", c.task, "reverse or sort a digit string")->check(CLI::IsMember({"reverse", "sort"}));
  app.add_option("--models", c.models, "Which models: lstm attention transformer")->delimiter(',')
      ->check(CLI::IsMember({"lstm", "attention", "transformer"}));
  app.add_option("--min-len", c.min_len, "Shortest source string")->check(CLI::PositiveNumber);
  app.add_option("--max-len", c.max_len, "Longest source string")->check(CLI::PositiveNumber);
  app.add_option("--steps", c.steps, "Training steps per model")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "Examples per step")->check(CLI::PositiveNumber);
  app.add_option("--lr", c.lr, "Adam learning rate");
  app.add_option("--hidden", c.hidden, "LSTM hidden size");
  app.add_option("--dim", c.dim, "Transformer width");
  app.add_option("--eval-per-len", c.eval_per_len, "Test examples per length")->check(CLI::PositiveNumber);
  app.add_option("--threads", c.threads, "Threads for kernels and OpenBLAS");
  app.add_option("--seed", c.seed, "Seed");
  app.add_option("--out", c.out, "Output directory");
  app.add_flag("--bf16", c.bf16, "bfloat16 autocast: GEMMs in bfloat16, float32 master weights");
}

// c.steps Adam steps with teacher forcing, each on a batch of one random
// length; returns the smoothed final loss.
double train_model(models::Seq2SeqModel& m, const Config& c, report::Progress& bar) {
  nn::Adam opt(m.parameters(), {.lr = c.lr});
  Generator gen(c.seed + 1);
  double loss_avg = 0;
  for (int64_t s = 1; s <= c.steps; ++s) {
    int64_t len = c.min_len + gen.randint(0, c.max_len - c.min_len + 1);
    std::vector<Example> ex;
    for (int64_t i = 0; i < c.batch; ++i) ex.push_back(make_example(c.task, len, gen));
    Batch b = make_batch(ex);
    Tensor loss;
    {
      // Forward and loss; each node's backward runs at the precision it was recorded with.
      AutocastGuard autocast(gemm_precision(c));
      Tensor logits = m.forward(b.src, b.tgt_in);  // (B,S+1,V)
      loss = cross_entropy(logits.reshape({-1, V}), b.tgt_out.reshape({-1}));
    }
    loss.backward();
    nn::clip_grad_norm_(m.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    loss_avg = s == 1 ? loss.item() : 0.98 * loss_avg + 0.02 * loss.item();
    bar.update(s, static_cast<double>(s * c.batch), fmt::format("loss {:.3f}", loss_avg));
  }
  bar.finish(fmt::format("loss {:.3f}", loss_avg));
  return loss_avg;
}

std::string precision_note(const Config& c) {
  return c.bf16 ? "GEMMs in bfloat16 (autocast), float32 master weights" : "GEMMs in float32";
}

// The accuracy of every model (acc[model][length - min_len]) as a table, a
// CSV file and a plot.
void write_per_length(const Config& c, const std::vector<std::vector<double>>& acc, const report::Table& table) {
  std::vector<report::Series> curves;
  for (size_t k = 0; k < acc.size(); ++k) {
    report::Series s{c.models[k], {}, {}};
    for (int64_t len = c.min_len; len <= c.max_len; ++len) {
      s.x.push_back(static_cast<double>(len));
      s.y.push_back(100 * acc[k][len - c.min_len]);
    }
    curves.push_back(std::move(s));
  }
  report::Table per_len{{"length"}, {}};
  for (auto& k : c.models) per_len.header.push_back(k);
  std::string csv = "length";
  for (auto& k : c.models) csv += "," + k;
  csv += "\n";
  for (int64_t len = c.min_len; len <= c.max_len; ++len) {
    std::vector<std::string> row{fmt::format("{}", len)};
    csv += fmt::format("{}", len);
    for (auto& a : acc) {
      row.push_back(fmt::format("{:.1f}%", 100 * a[len - c.min_len]));
      csv += fmt::format(",{:.4f}", a[len - c.min_len]);
    }
    per_len.rows.push_back(row);
    csv += "\n";
  }
  fmt::print("\nexact-match accuracy by source length ({} test strings each):\n{}\n{}", c.eval_per_len,
             per_len.text(), table.text());
  report::write_file(c.out + "/accuracy.csv", csv);
  report::write_file(c.out + "/results.md", report::provenance() + per_len.markdown() + "\n" + table.markdown() + "\n" + precision_note(c) + ".\n");
  std::string why = report::plot_lines(c.out + "/accuracy.png", "exact match by length (" + c.task + ")",
                                       "source length", "accuracy (%)", curves);
  fmt::print("wrote {0}/accuracy.csv, {0}/results.md{1}\n", c.out,
             why.empty() ? fmt::format(" and {}/accuracy.png", c.out) : "; no plot: " + why);
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  CLI::App app{"seq2seq: LSTM without and with attention vs the encoder-decoder transformer on a synthetic translation task"};
  add_options(app, c);
  CLI11_PARSE(app, argc, argv);

  try {
    if (c.min_len > c.max_len) throw ValueError(fmt::format("--min-len {} is above --max-len {}", c.min_len, c.max_len));
    if (c.threads > 0) set_num_threads(c.threads);
    fs::create_directories(c.out);
    fmt::print("seq2seq: {} digit strings of length {}..{}, {} steps x {} examples per model; {}\n\n", c.task,
               c.min_len, c.max_len, c.steps, c.batch, precision_note(c));
    std::vector<std::vector<double>> acc;  // [model][length - min_len]
    report::Table table{{"model", "params", "final loss", "mean accuracy", "time"}, {}};
    for (const auto& kind : c.models) {
      manual_seed(c.seed);
      auto m = make_model(kind, c);
      report::Progress bar(kind, c.steps, "ex");  // its clock also covers the evaluation: the time column
      const double loss = train_model(*m, c, bar);
      acc.push_back(evaluate(*m, c));
      double mean = 0;
      for (double a : acc.back()) mean += a / acc.back().size();
      table.rows.push_back({kind, fmt::format("{}", m->num_parameters()), fmt::format("{:.3f}", loss),
                            fmt::format("{:.1f}%", 100 * mean), report::format_duration(bar.seconds())});
    }
    write_per_length(c, acc, table);
  } catch (const std::exception& e) {
    fmt::print(stderr, "seq2seq: {}\n", e.what());
    return 1;
  }
  return 0;
}
