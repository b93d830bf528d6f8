// charlm — the main job: an RNN, an LSTM and a GPT language model trained on
// the same text, at matched parameter budgets and the same token budget, then
// compared (seed 002's story: a recurrent state vs attention over the past).
//
//   build/examples/charlm                      # Brown corpus, all three models
//   build/examples/charlm --models gpt --steps 500 --data my.txt
//   build/examples/charlm --resume             # continue an interrupted run
//   mpirun -np 2 build/examples/charlm ...     # data-parallel: each rank trains on --batch/2 of every batch
//
// Writes into --out (default out/charlm): loss.csv and loss.png (curves),
// samples.txt, results.md (the table), <model>.safetensors (weights) and
// <model>.state.safetensors (optimizer state, step, generator state: what
// --resume needs to continue exactly).
#include <sys/resource.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/lm_batches.h"
#include "data/tokenizer.h"
#include "dist/ddp.h"
#include "examples/common/corpus.h"
#include "examples/common/progress.h"
#include "examples/common/report.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "models/registry.h"
#include "models/rnn_lm.h"
#include "nn/nn.h"

namespace fs = std::filesystem;
using namespace tg;
using models::LanguageModel;

namespace {

struct Config {
  std::string data, brown_dir, out = "out/charlm", tokenizer = "char";
  std::vector<std::string> models = {"rnn", "lstm", "gpt"};
  int64_t steps = 2000, batch = 32, block = 64, eval_every = 100, eval_batches = 20;
  int64_t gpt_layers = 2, gpt_heads = 4, gpt_dim = 128, embed = 64, rnn_layers = 1;
  int64_t rnn_hidden = 0, lstm_hidden = 0, bpe_vocab = 512, sample_len = 400;
  double lr = 0, dropout = 0.0, clip = 1.0, val_fraction = 0.1, temperature = 0.8;
  int64_t top_k = 0, warmup = 100, stop_after = 0;
  int threads = 0;
  uint64_t seed = 1337;
  bool resume = false, profile = false;
};

// Parameters of an RNN LM with embedding E, hidden H, L layers, vocabulary V
// (G gates: 1 RNN, 3 GRU, 4 LSTM), so its hidden size can be matched to a budget.
int64_t rnn_lm_params(models::CellKind cell, int64_t V, int64_t E, int64_t H, int64_t L) {
  int64_t G = cell == models::CellKind::lstm ? 4 : cell == models::CellKind::gru ? 3 : 1;
  int64_t n = V * E + H * V + V;                    // embedding, head
  for (int64_t l = 0; l < L; ++l) n += G * H * ((l == 0 ? E : H) + H + 2);  // W_ih, W_hh, two biases
  return n;
}

int64_t matched_hidden(models::CellKind cell, int64_t V, int64_t E, int64_t L, int64_t budget) {
  int64_t best = 8;
  for (int64_t H = 8; H <= 4096; ++H)
    if (std::llabs(rnn_lm_params(cell, V, E, H, L) - budget) < std::llabs(rnn_lm_params(cell, V, E, best, L) - budget))
      best = H;
  return best;
}

models::CellKind cell_of(const std::string& kind) {
  return kind == "rnn" ? models::CellKind::rnn : kind == "lstm" ? models::CellKind::lstm : models::CellKind::gru;
}

// The recurrent models' hidden size: as given, or matched to GPT's parameter count.
int64_t hidden_of(const std::string& kind, const Config& c, int64_t V, int64_t gpt_params) {
  if (kind == "rnn" && c.rnn_hidden) return c.rnn_hidden;
  if (kind == "lstm" && c.lstm_hidden) return c.lstm_hidden;
  return matched_hidden(cell_of(kind), V, c.embed, c.rnn_layers, gpt_params);
}

// What the table's "shape" column says of a model.
std::string shape_of(const std::string& kind, const Config& c, int64_t V, int64_t gpt_params) {
  if (kind == "gpt") return fmt::format("{} layers x {} heads, C {}", c.gpt_layers, c.gpt_heads, c.gpt_dim);
  return fmt::format("{} layer{}, E {}, H {}", c.rnn_layers, c.rnn_layers > 1 ? "s" : "", c.embed,
                     hidden_of(kind, c, V, gpt_params));
}

std::shared_ptr<LanguageModel> make_model(const std::string& kind, const Config& c, int64_t V, int64_t gpt_params) {
  if (kind == "gpt")
    return std::make_shared<models::GPT>(models::GPTOptions{.vocab = V, .block = c.block, .layers = c.gpt_layers,
                                                            .heads = c.gpt_heads, .dim = c.gpt_dim, .dropout = c.dropout});
  const models::CellKind cell = cell_of(kind);
  const int64_t H = hidden_of(kind, c, V, gpt_params);
  return std::make_shared<models::RNNLM>(models::RNNLMOptions{
      .vocab = V, .embed = c.embed, .hidden = H, .layers = c.rnn_layers, .cell = cell, .dropout = c.dropout});
}

std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& kind, LanguageModel& m, const Config& c) {
  // The recipes of the benchmark workloads: AdamW 1e-3 with weight decay for
  // the transformer, Adam 2e-3 for the recurrent models.
  if (kind == "gpt")
    return std::make_unique<nn::AdamW>(nn::weight_decay_groups(m, 0.01),
                                       nn::AdamWOptions{.lr = c.lr > 0 ? c.lr : 1e-3, .weight_decay = 0.01});
  return std::make_unique<nn::Adam>(m.parameters(), nn::AdamOptions{.lr = c.lr > 0 ? c.lr : 2e-3});
}

struct Curve {
  std::vector<double> step, train, val;
};

struct Result {
  std::string name;
  int64_t params = 0;
  double train_loss = NAN, val_loss = NAN, tokens_per_s = 0, seconds = 0;
  size_t peak_bytes = 0;
  std::string sample;
};

// Under MPI each rank evaluates every N-th batch and the sums are reduced:
// every rank returns the mean over all n_batches.
double evaluate(LanguageModel& m, const data::LMBatches& val, int64_t n_batches, int64_t batch) {
  NoGradGuard no_grad;
  m.eval();
  double total = 0;
  for (int64_t i = dist::rank(); i < n_batches; i += dist::world_size()) {
    data::LMBatch b = val.fixed(i, n_batches, batch);
    total += m.loss(b.inputs, b.targets).item();
  }
  m.train();
  return dist::all_reduce_sum(total) / n_batches;
}

// Trains one model (or resumes it from its state file) and returns what the table shows.
Result run_model(const std::string& kind, const Config& c, int64_t V, int64_t gpt_params, const data::LMBatches& train,
                 const data::LMBatches& val, Curve& curve, const data::Tokenizer& tok, const std::string& prompt) {
  Result r;
  r.name = kind;
  auto model = make_model(kind, c, V, gpt_params);
  r.params = model->num_parameters();
  auto opt = make_optimizer(kind, *model, c);
  nn::CosineWarmupLR schedule(opt->lr(), std::min(c.warmup, c.steps), c.steps, opt->lr() * 0.1);
  // Every rank draws the same whole batches (and trains on its shard), so
  // batch_gen stays in step everywhere; dropout differs by rank.
  Generator batch_gen(c.seed), dropout_gen(c.seed + 1 + dist::rank());
  default_generator() = dropout_gen;

  const std::string weights = fmt::format("{}/{}.safetensors", c.out, kind);
  const std::string state = fmt::format("{}/{}.state.safetensors", c.out, kind);
  int64_t step = 0;
  double train_seconds = 0;
  // The training loss summed since the last evaluation (the curve's next
  // point is its mean), kept in the checkpoint of a run stopped in between.
  double interval_loss = 0;
  int64_t interval_n = 0;
  if (c.resume && fs::exists(weights) && fs::exists(state)) {
    nn::load(*model, weights);
    auto meta = nn::load(*opt, state);
    step = std::stoll(meta.at("step"));
    batch_gen.set_state(std::stoull(meta.at("batch_seed")), std::stoull(meta.at("batch_offset")));
    default_generator().set_state(std::stoull(meta.at("dropout_seed")) + dist::rank(), std::stoull(meta.at("dropout_offset")));
    train_seconds = std::stod(meta.at("seconds"));
    // Absent from checkpoints written before they were kept, which were all
    // taken at an evaluation, where the sum restarts from 0.
    if (meta.count("interval_loss")) interval_loss = std::stod(meta.at("interval_loss"));
    if (meta.count("interval_steps")) interval_n = std::stoll(meta.at("interval_steps"));
    curve = Curve{};
    for (auto& [k, v] : meta)
      if (k.starts_with("curve.")) {
        double s, tl, vl;
        if (std::sscanf(v.c_str(), "%lf %lf %lf", &s, &tl, &vl) == 3) curve.step.push_back(s), curve.train.push_back(tl), curve.val.push_back(vl);
      }
    if (dist::is_main()) fmt::print(stderr, "{}: resumed at step {} from {}\n", kind, step, state);
  }
  // Every rank reads --out: on several machines it must be a shared directory.
  dist::check_same(kind + ": the steps resumed from " + state, std::to_string(step));
  // Rank 0's weights everywhere, and gradients averaged over the ranks.
  dist::DistributedDataParallel ddp(*model);
  auto save_state = [&] {
    std::map<std::string, std::string> meta = {
        {"step", std::to_string(step)}, {"model", kind}, {"seconds", fmt::format("{}", train_seconds)},
        {"batch_seed", std::to_string(batch_gen.seed())}, {"batch_offset", std::to_string(batch_gen.offset())},
        {"dropout_seed", std::to_string(default_generator().seed())},
        {"dropout_offset", std::to_string(default_generator().offset())},
        {"interval_loss", fmt::format("{:.17g}", interval_loss)}, {"interval_steps", std::to_string(interval_n)}};
    for (size_t i = 0; i < curve.step.size(); ++i)
      meta[fmt::format("curve.{:06}", i)] = fmt::format("{} {:.17g} {:.17g}", curve.step[i], curve.train[i], curve.val[i]);
    nn::save(*model, weights, models::config_of(*model));  // what `generate` rebuilds the model from
    nn::save(*opt, state, meta);
  };

  reset_peak_memory_stats();
  const int64_t tokens_per_step = c.batch * c.block;
  const int64_t stop = c.stop_after > 0 ? std::min(c.stop_after, c.steps) : c.steps;
  // This run's bar ends where the run stops (--stop-after), so its count,
  // ETA and final line are true.
  std::optional<examples::Progress> bar;  // rank 0's
  if (dist::is_main()) bar.emplace(kind, stop, "tok", step);
  const int64_t start_step = step;
  while (step < stop) {
    auto t0 = std::chrono::steady_clock::now();  // training time only: evaluation and checkpoints are not counted
    schedule.step(*opt, step);
    data::LMBatch b = train.sample(c.batch, batch_gen);
    Tensor loss = model->loss(dist::shard(b.inputs), dist::shard(b.targets));
    loss.backward();
    ddp.finish();
    if (c.clip > 0) nn::clip_grad_norm_(model->parameters(), c.clip);
    opt->step();
    opt->zero_grad();
    ++step;
    interval_loss += loss.item();
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++interval_n;
    const double shown = interval_loss / interval_n;  // mean training loss since the last evaluation
    if (step % c.eval_every == 0 || step == c.steps) {
      double vl = evaluate(*model, val, c.eval_batches, c.batch);
      curve.step.push_back(static_cast<double>(step));
      curve.train.push_back(dist::all_reduce_sum(interval_loss) / dist::world_size() / interval_n);
      curve.val.push_back(vl);
      interval_loss = 0, interval_n = 0;
      if (dist::is_main()) save_state();
    } else if (step == stop) {
      // Stopped between evaluations: no curve point here (an uninterrupted
      // run has none); the checkpoint keeps the loss sum, averaged over the
      // ranks, so the resumed run's next point is the uninterrupted one's.
      interval_loss = dist::all_reduce_sum(interval_loss) / dist::world_size();
      if (dist::is_main()) save_state();
    }
    if (bar) bar->update(step, static_cast<double>((step - start_step) * tokens_per_step), fmt::format("loss {:.3f}", shown));
  }
  r.peak_bytes = allocator_stats().peak_bytes_in_use;
  r.seconds = train_seconds;
  r.tokens_per_s = train_seconds > 0 ? step * tokens_per_step / train_seconds : 0;
  if (!curve.step.empty()) r.train_loss = curve.train.back(), r.val_loss = curve.val.back();
  if (!dist::is_main()) return r;  // rank 0 alone reports
  bar->finish(step < c.steps ? fmt::format("stopped at step {} of {}; --resume continues", step, c.steps)
                             : fmt::format("train {:.3f}  val {:.3f}", r.train_loss, r.val_loss));

  Generator sample_gen(c.seed + 2);
  models::SamplingOptions so{.max_new_tokens = c.sample_len, .temperature = c.temperature, .top_k = c.top_k};
  r.sample = prompt + tok.decode(models::generate(*model, tok.encode(prompt), so, sample_gen));
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  Config c;
  CLI::App app{"charlm: RNN vs LSTM vs GPT language models on the same text (the main tapegrad example)"};
  app.add_option("--data", c.data, "A UTF-8 text file to train on instead of the Brown corpus");
  app.add_option("--brown-dir", c.brown_dir, "Where scripts/fetch_brown.sh put the Brown corpus (default: its cache)");
  app.add_option("--models", c.models, "Which models, in order: rnn lstm gru gpt")->delimiter(',')
      ->check(CLI::IsMember({"rnn", "lstm", "gru", "gpt"}));
  app.add_option("--steps", c.steps, "Training steps per model (same token budget for all)")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "Sequences per step (B)")->check(CLI::PositiveNumber);
  app.add_option("--block", c.block, "Sequence length / context (T)")->check(CLI::PositiveNumber);
  app.add_option("--lr", c.lr, "Learning rate (default: 1e-3 AdamW for GPT, 2e-3 Adam for RNNs)");
  app.add_option("--warmup", c.warmup, "Warm-up steps of the cosine learning-rate schedule");
  app.add_option("--clip", c.clip, "Global gradient-norm clip (0: off)");
  app.add_option("--dropout", c.dropout, "Dropout in every model");
  app.add_option("--gpt-layers", c.gpt_layers, "GPT blocks");
  app.add_option("--gpt-heads", c.gpt_heads, "GPT attention heads");
  app.add_option("--gpt-dim", c.gpt_dim, "GPT width (C)");
  app.add_option("--embed", c.embed, "RNN/LSTM embedding size");
  app.add_option("--rnn-layers", c.rnn_layers, "RNN/LSTM layers");
  app.add_option("--rnn-hidden", c.rnn_hidden, "RNN hidden size (default: matched to GPT's parameter count)");
  app.add_option("--lstm-hidden", c.lstm_hidden, "LSTM hidden size (default: matched to GPT's parameter count)");
  app.add_option("--tokenizer", c.tokenizer, "char or bpe")->check(CLI::IsMember({"char", "bpe"}));
  app.add_option("--bpe-vocab", c.bpe_vocab, "BPE vocabulary size");
  app.add_option("--eval-every", c.eval_every, "Steps between validation evaluations")->check(CLI::PositiveNumber);
  app.add_option("--eval-batches", c.eval_batches, "Fixed validation batches per evaluation")->check(CLI::PositiveNumber);
  app.add_option("--sample-len", c.sample_len, "Tokens to sample from each model at the end");
  app.add_option("--temperature", c.temperature, "Sampling temperature");
  app.add_option("--top-k", c.top_k, "Sample among the k most likely tokens (0: all)");
  app.add_option("--threads", c.threads, "Threads for kernels and OpenBLAS (default: TAPEGRAD_NUM_THREADS or all cores)");
  app.add_option("--seed", c.seed, "Seed for initialisation, batches, dropout and sampling");
  app.add_option("--out", c.out, "Output directory");
  app.add_flag("--resume", c.resume, "Continue from the checkpoints in --out");
  app.add_option("--stop-after", c.stop_after, "Stop each model after this many steps, as if interrupted (--resume continues)");
  app.add_flag("--profile", c.profile, "Print a per-op profile of the last model's training and its MFU against the measured sgemm peak");
  CLI11_PARSE(app, argc, argv);

  try {
    if (c.threads > 0) set_num_threads(c.threads);
    if (c.profile) profiler_enable(true);
    if (dist::is_main()) fs::create_directories(c.out);
    examples::Corpus corpus = examples::load_corpus(c.data, c.brown_dir, c.val_fraction, c.seed);
    std::string train_text = examples::join_text(corpus.train), val_text = examples::join_text(corpus.val);

    std::unique_ptr<data::Tokenizer> tok;
    if (c.tokenizer == "char")
      tok = std::make_unique<data::CharTokenizer>(data::CharTokenizer::build(train_text + val_text));
    else
      tok = std::make_unique<data::BPETokenizer>(data::BPETokenizer::train(train_text, c.bpe_vocab));
    if (dist::is_main()) tok->save(c.out + "/tokenizer.json");
    const int64_t V = tok->vocab_size();
    // The encoded int64 streams are temporaries: LMBatches keeps int32 copies.
    data::LMBatches train(tok->encode(train_text), c.block), val(tok->encode(val_text), c.block);
    const double chars_per_token = static_cast<double>(val_text.size()) / val.num_tokens();

    manual_seed(c.seed);
    const int64_t gpt_params = make_model("gpt", c, V, 0)->num_parameters();
    if (dist::is_main()) {
      fmt::print("charlm: {} — {} train / {} validation documents, {} / {} tokens, vocabulary {} ({})\n", corpus.source,
                 corpus.train.size(), corpus.val.size(), train.num_tokens(), val.num_tokens(), V, c.tokenizer);
      fmt::print("charlm: {} steps x {} x {} = {:.2f}M tokens per model, {} threads{}\n\n", c.steps, c.batch, c.block,
                 c.steps * c.batch * c.block / 1e6, num_threads(),
                 dist::world_size() > 1 ? fmt::format(" x {} ranks of {} sequences", dist::world_size(), c.batch / dist::world_size()) : "");
    }

    std::string prompt = val_text.substr(0, std::min<size_t>(val_text.size(), 24));
    std::vector<Result> results;
    std::vector<examples::Series> curves;
    std::string csv = "model,step,tokens,train_loss,val_loss\n";
    for (const std::string& kind : c.models) {
      manual_seed(c.seed);  // every model starts from the same generator state
      if (c.profile) profiler_reset();
      Curve curve;
      results.push_back(run_model(kind, c, V, gpt_params, train, val, curve, *tok, prompt));
      for (size_t i = 0; i < curve.step.size(); ++i)
        csv += fmt::format("{},{},{},{:.6f},{:.6f}\n", kind, curve.step[i], curve.step[i] * c.batch * c.block,
                           curve.train[i], curve.val[i]);
      examples::Series s{kind + " validation", {}, curve.val};
      for (double st : curve.step) s.x.push_back(st * c.batch * c.block);
      curves.push_back(std::move(s));
    }
    if (!dist::is_main()) return 0;  // rank 0 alone reports and writes
    if (c.profile) fmt::print("\n{}\n", profiler_report(measure_sgemm_peak_gflops()));

    examples::Table table{{"model", "shape", "params", "train loss", "val loss", "val bits/char", "tokens/s", "peak MiB", "time"}, {}};
    for (auto& r : results)
      table.rows.push_back({r.name, shape_of(r.name, c, V, gpt_params), fmt::format("{}", r.params), fmt::format("{:.3f}", r.train_loss),
                            fmt::format("{:.3f}", r.val_loss),
                            fmt::format("{:.3f}", r.val_loss / std::log(2.0) / chars_per_token),
                            examples::format_count(r.tokens_per_s), fmt::format("{:.1f}", r.peak_bytes / 1048576.0),
                            examples::format_duration(r.seconds)});
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    fmt::print("\n{}\nlosses are nats/token (cross-entropy on the validation split, {} fixed batches); "
               "process peak RSS {:.0f} MiB\n",
               table.text(), c.eval_batches, ru.ru_maxrss / 1024.0);

    std::string samples;
    for (auto& r : results) samples += fmt::format("=== {} ===\n{}\n\n", r.name, r.sample);
    fmt::print("\n{}", samples);
    examples::write_file(c.out + "/samples.txt", samples);
    examples::write_file(c.out + "/loss.csv", csv);
    examples::write_file(c.out + "/results.md", table.markdown());
    std::string why = examples::plot_lines(c.out + "/loss.png", "validation loss (" + corpus.source + ")",
                                           "training tokens", "nats/token", curves);
    fmt::print("wrote {0}/loss.csv, {0}/results.md, {0}/samples.txt, checkpoints {0}/*.safetensors", c.out);
    fmt::print("{}", why.empty() ? fmt::format(" and the plot {}/loss.png\n", c.out) : fmt::format("\nno plot: {}\n", why));
  } catch (const std::exception& e) {
    dist::abort(fmt::format("charlm: {}", e.what()));  // under MPI: ends every rank, not only this one
  }
  return 0;
}
