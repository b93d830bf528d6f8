// charlm — an RNN, an LSTM and a GPT language model trained on
// the same text, at matched parameter budgets and the same token budget, then
// compared: a recurrent state against attention over the past.
//
//   build/examples/charlm                      # Brown corpus, all three models
//   build/examples/charlm --models gpt --steps 500 --data my.txt
//   build/examples/charlm --resume             # continue an interrupted run
//   build/examples/charlm --bf16               # GEMMs in bfloat16 (autocast), float32 weights
//   mpirun -np 2 build/examples/charlm ...     # data-parallel: each rank trains on --batch/2 of every batch
//
// Writes into --out (default out/charlm): loss.csv and loss.png (curves),
// samples.txt, results.md (the table), <model>.safetensors (weights) and
// <model>.state.safetensors (optimizer state, step, generator state: what
// --resume needs to continue exactly).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <optional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/corpus.h"
#include "data/lm_batches.h"
#include "data/tokenizer.h"
#include "distributed/ddp.h"
#include "models/generate.h"
#include "models/registry.h"
#include "models/training_state.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

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
  bool resume = false, profile = false, bf16 = false;
};

// The precision of the GEMMs of training and evaluation (autocast.h).
DType gemm_precision(const Config& c) { return c.bf16 ? DType::bf16 : DType::f32; }

// The recurrent models' hidden size: as given, or matched to GPT's parameter count.
int64_t hidden_of(const std::string& kind, const Config& c, int64_t V, int64_t gpt_params) {
  if (kind == "rnn" && c.rnn_hidden) return c.rnn_hidden;
  if (kind == "lstm" && c.lstm_hidden) return c.lstm_hidden;
  return models::hidden_for_parameters(
      {.vocab = V, .embed = c.embed, .layers = c.rnn_layers, .cell = models::cell_kind(kind)}, gpt_params);
}

// The model --models names, at the sizes the flags give.
models::ModelSpec spec_of(const std::string& kind, const Config& c, int64_t V, int64_t gpt_params) {
  if (kind == "gpt")
    return {.kind = kind, .vocab = V, .layers = c.gpt_layers, .block = c.block, .heads = c.gpt_heads, .dim = c.gpt_dim,
            .dropout = c.dropout};
  return {.kind = kind, .vocab = V, .layers = c.rnn_layers, .embed = c.embed,
          .hidden = hidden_of(kind, c, V, gpt_params), .dropout = c.dropout};
}

// What the table's "shape" column says of a model.
std::string shape_of(const models::ModelSpec& s) {
  if (s.kind == "gpt") return fmt::format("{} layers x {} heads, C {}", s.layers, s.heads, s.dim);
  return fmt::format("{} layer{}, E {}, H {}", s.layers, s.layers > 1 ? "s" : "", s.embed, s.hidden);
}

// The text every model trains on, as tokens.
struct Text {
  data::Corpus corpus;
  std::unique_ptr<data::Tokenizer> tok;
  data::LMBatches train, val;
  double chars_per_token = 0;  // of the validation text
  std::string prompt;          // the start of the validation text, for the samples
};

Text load_text(const Config& c) {
  data::Corpus corpus = data::load_corpus(c.data, c.brown_dir, c.val_fraction, c.seed);
  std::string train_text = data::join_text(corpus.train), val_text = data::join_text(corpus.val);
  std::unique_ptr<data::Tokenizer> tok;
  if (c.tokenizer == "char")
    tok = std::make_unique<data::CharTokenizer>(data::CharTokenizer::build(train_text + val_text));
  else
    tok = std::make_unique<data::BPETokenizer>(data::BPETokenizer::train(train_text, c.bpe_vocab));
  if (dist::is_main()) tok->save(c.out + "/tokenizer.json");
  // The encoded int64 streams are temporaries: LMBatches keeps int32 copies.
  data::LMBatches train(tok->encode(train_text), c.block), val(tok->encode(val_text), c.block);
  const double chars_per_token = static_cast<double>(val_text.size()) / val.num_tokens();
  std::string prompt = val_text.substr(0, std::min<size_t>(val_text.size(), 24));
  return Text{std::move(corpus), std::move(tok), std::move(train), std::move(val), chars_per_token, std::move(prompt)};
}

struct Result {
  models::ModelSpec spec;
  int64_t params = 0;
  double train_loss = NAN, val_loss = NAN, tokens_per_s = 0, seconds = 0;
  size_t peak_bytes = 0;
  std::string sample;
  std::vector<models::CurvePoint> curve;
};

// Under MPI each rank evaluates every N-th batch and the sums are reduced:
// every rank returns the mean over all n_batches. At the precision the model
// trains in, so the curve's two losses are of the same computation.
double evaluate(LanguageModel& m, const data::LMBatches& val, int64_t n_batches, int64_t batch, DType precision) {
  NoGradGuard no_grad;
  AutocastGuard autocast(precision);
  m.eval();
  double total = 0;
  for (int64_t i = dist::rank(); i < n_batches; i += dist::world_size()) {
    data::LMBatch b = val.fixed(i, n_batches, batch);
    total += m.loss(b.inputs, b.targets).item();
  }
  m.train();
  return dist::all_reduce_sum(total) / n_batches;
}

// A run's checkpoint: <kind>.safetensors holds the weights (with the config
// `generate` rebuilds the model from), <kind>.state.safetensors the
// optimizer's state and the TrainingState.
struct Checkpoint {
  std::string weights, state;

  Checkpoint(const Config& c, const std::string& kind)
      : weights(fmt::format("{}/{}.safetensors", c.out, kind)),
        state(fmt::format("{}/{}.state.safetensors", c.out, kind)) {}
  bool exists() const { return fs::exists(weights) && fs::exists(state); }

  // Both generators' positions go into s before it is written.
  void save(LanguageModel& model, const nn::Optimizer& opt, models::TrainingState& s, const Generator& batch_gen) const {
    models::check_finite_parameters(model, fmt::format("charlm: checkpoint {}", weights));
    s.batch_seed = batch_gen.seed(), s.batch_offset = batch_gen.offset();
    s.dropout_seed = default_generator().seed(), s.dropout_offset = default_generator().offset();
    nn::save(model, weights, models::config_of(model));
    nn::save(opt, state, models::to_metadata(s));
  }

  // Loads the weights and the optimizer, and puts both generators where the
  // saved run stopped (the dropout generator of this rank: rank 0 saved its own).
  models::TrainingState load(LanguageModel& model, nn::Optimizer& opt, Generator& batch_gen) const {
    nn::load(model, weights);
    models::TrainingState s = models::training_state_from_metadata(nn::load(opt, state), state);
    batch_gen.set_state(s.batch_seed, s.batch_offset);
    default_generator().set_state(s.dropout_seed + dist::rank(), s.dropout_offset);
    return s;
  }
};

// Trains one model (or resumes it from its checkpoint) and returns what the table shows.
Result run_model(const models::ModelSpec& spec, const Config& c, const Text& text) {
  const std::string& kind = spec.kind;
  Result r;
  r.spec = spec;
  auto model = models::make_language_model(spec);
  r.params = model->num_parameters();
  auto opt = models::make_optimizer(kind, *model, c.lr);
  nn::CosineWarmupLR schedule(opt->lr(), std::min(c.warmup, c.steps), c.steps, opt->lr() * 0.1);
  // Every rank draws the same whole batches (and trains on its shard), so
  // batch_gen stays in step everywhere; dropout differs by rank.
  Generator batch_gen(c.seed), dropout_gen(c.seed + 1 + dist::rank());
  default_generator() = dropout_gen;

  const Checkpoint checkpoint(c, kind);
  models::TrainingState st;
  if (c.resume && checkpoint.exists()) {
    st = checkpoint.load(*model, *opt, batch_gen);
    if (dist::is_main()) fmt::print(stderr, "{}: resumed at step {} from {}\n", kind, st.step, checkpoint.state);
  }
  st.model = kind;
  // Every rank reads --out: on several machines it must be a shared directory.
  dist::check_same(kind + ": the steps resumed from " + checkpoint.state, std::to_string(st.step));
  // Rank 0's weights everywhere, and gradients averaged over the ranks.
  dist::DistributedDataParallel ddp(*model);

  reset_peak_memory_stats();
  const int64_t tokens_per_step = c.batch * c.block;
  const int64_t stop = c.stop_after > 0 ? std::min(c.stop_after, c.steps) : c.steps;
  // This run's bar ends where the run stops (--stop-after), so its count,
  // ETA and final line are true.
  std::optional<report::Progress> bar;  // rank 0's
  if (dist::is_main()) bar.emplace(kind, stop, "tok", st.step);
  const int64_t start_step = st.step;
  while (st.step < stop) {
    auto t0 = std::chrono::steady_clock::now();  // training time only: evaluation and checkpoints are not counted
    schedule.step(*opt, st.step);
    data::LMBatch b = text.train.sample(c.batch, batch_gen);
    // Forward and loss; each node's backward runs at the precision it was
    // recorded with. A non-finite loss stops the run with the anomaly report,
    // before anything (parameters, checkpoint) takes it in.
    Tensor loss = models::checked_loss(
        [&] {
          AutocastGuard autocast(gemm_precision(c));
          return model->loss(dist::shard(b.inputs), dist::shard(b.targets));
        },
        fmt::format("{}, step {}", kind, st.step + 1));
    loss.backward();
    ddp.finish();
    if (c.clip > 0) nn::clip_grad_norm_(model->parameters(), c.clip);
    opt->step();
    opt->zero_grad();
    ++st.step;
    st.interval_loss += loss.item();
    st.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++st.interval_steps;
    const double shown = st.interval_loss / st.interval_steps;  // mean training loss since the last evaluation
    if (st.step % c.eval_every == 0 || st.step == c.steps) {
      const double vl = evaluate(*model, text.val, c.eval_batches, c.batch, gemm_precision(c));
      st.curve.push_back({static_cast<double>(st.step),
                          dist::all_reduce_sum(st.interval_loss) / dist::world_size() / st.interval_steps, vl});
      st.interval_loss = 0, st.interval_steps = 0;
      if (dist::is_main()) checkpoint.save(*model, *opt, st, batch_gen);
    } else if (st.step == stop) {
      // Stopped between evaluations: no curve point here (an uninterrupted
      // run has none); the checkpoint keeps the loss sum, averaged over the
      // ranks, so the resumed run's next point is the uninterrupted one's.
      st.interval_loss = dist::all_reduce_sum(st.interval_loss) / dist::world_size();
      if (dist::is_main()) checkpoint.save(*model, *opt, st, batch_gen);
    }
    if (bar) bar->update(st.step, static_cast<double>((st.step - start_step) * tokens_per_step), fmt::format("loss {:.3f}", shown));
  }
  r.peak_bytes = memory_stats().peak_bytes_in_use;
  r.seconds = st.seconds;
  r.tokens_per_s = st.seconds > 0 ? st.step * tokens_per_step / st.seconds : 0;
  r.curve = st.curve;
  if (!r.curve.empty()) r.train_loss = r.curve.back().train_loss, r.val_loss = r.curve.back().val_loss;
  if (!dist::is_main()) return r;  // rank 0 alone reports
  bar->finish(st.step < c.steps ? fmt::format("stopped at step {} of {}; --resume continues", st.step, c.steps)
                                : fmt::format("train {:.3f}  val {:.3f}", r.train_loss, r.val_loss));

  Generator sample_gen(c.seed + 2);
  models::SamplingOptions so{.max_new_tokens = c.sample_len, .temperature = c.temperature, .top_k = c.top_k};
  r.sample = text.prompt + text.tok->decode(models::generate(*model, text.tok->encode(text.prompt), so, sample_gen));
  return r;
}

void add_options(CLI::App& app, Config& c) {
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
  app.add_flag("--bf16", c.bf16, "bfloat16 autocast: GEMMs in bfloat16, float32 master weights");
  app.add_flag("--profile", c.profile, "Print a per-op profile of the last model's training and its MFU against the measured sgemm peak");
}

void print_plan(const Config& c, const Text& text) {
  fmt::print("charlm: {} — {} train / {} validation documents, {} / {} tokens, vocabulary {} ({})\n",
             text.corpus.source, text.corpus.train.size(), text.corpus.val.size(), text.train.num_tokens(),
             text.val.num_tokens(), text.tok->vocab_size(), c.tokenizer);
  fmt::print("charlm: {} steps x {} x {} = {:.2f}M tokens per model, {} threads{}{}\n\n", c.steps, c.batch, c.block,
             c.steps * c.batch * c.block / 1e6, num_threads(), c.bf16 ? ", GEMMs in bfloat16 (autocast)" : "",
             dist::world_size() > 1 ? fmt::format(" x {} ranks of {} sequences", dist::world_size(), c.batch / dist::world_size()) : "");
}

// The table, the samples, loss.csv and loss.png.
void write_report(const Config& c, const Text& text, const std::vector<Result>& results) {
  report::Table table{{"model", "shape", "params", "train loss", "val loss", "val bits/char", "tokens/s", "peak MiB", "time"}, {}};
  for (const auto& r : results)
    table.rows.push_back({r.spec.kind, shape_of(r.spec), fmt::format("{}", r.params), fmt::format("{:.3f}", r.train_loss),
                          fmt::format("{:.3f}", r.val_loss),
                          fmt::format("{:.3f}", r.val_loss / std::log(2.0) / text.chars_per_token),
                          report::format_count(r.tokens_per_s), fmt::format("{:.1f}", r.peak_bytes / 1048576.0),
                          report::format_duration(r.seconds)});
  const std::string precision = c.bf16 ? "GEMMs in bfloat16 (autocast), float32 master weights" : "GEMMs in float32";
  fmt::print("\n{}\nlosses are nats/token (cross-entropy on the validation split, {} fixed batches); {}; "
             "process peak RSS {:.0f} MiB\n",
             table.text(), c.eval_batches, precision, report::peak_rss_mib());

  std::string samples;
  for (const auto& r : results) samples += fmt::format("=== {} ===\n{}\n\n", r.spec.kind, r.sample);
  fmt::print("\n{}", samples);

  std::string csv = "model,step,tokens,train_loss,val_loss\n";
  std::vector<report::Series> curves;
  for (const auto& r : results) {
    report::Series s{r.spec.kind + " validation", {}, {}};
    for (const auto& p : r.curve) {
      csv += fmt::format("{},{},{},{:.6f},{:.6f}\n", r.spec.kind, p.step, p.step * c.batch * c.block, p.train_loss,
                         p.val_loss);
      s.x.push_back(p.step * c.batch * c.block);
      s.y.push_back(p.val_loss);
    }
    curves.push_back(std::move(s));
  }
  report::write_file(c.out + "/samples.txt", samples);
  report::write_file(c.out + "/loss.csv", csv);
  report::write_file(c.out + "/results.md", report::provenance() + table.markdown() + "\n" + precision + ".\n");
  std::string why = report::plot_lines(c.out + "/loss.png", "validation loss (" + text.corpus.source + ")",
                                       "training tokens", "nats/token", curves);
  fmt::print("wrote {0}/loss.csv, {0}/results.md, {0}/samples.txt, checkpoints {0}/*.safetensors", c.out);
  fmt::print("{}", why.empty() ? fmt::format(" and the plot {}/loss.png\n", c.out) : fmt::format("\nno plot: {}\n", why));
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  Config c;
  CLI::App app{"charlm: RNN vs LSTM vs GPT language models on the same text (the study, examples/study, is the main job)"};
  add_options(app, c);
  CLI11_PARSE(app, argc, argv);

  try {
    if (c.threads > 0) set_num_threads(c.threads);
    if (c.profile) profiler_enable(true);
    if (dist::is_main()) fs::create_directories(c.out);
    const Text text = load_text(c);
    const int64_t V = text.tok->vocab_size();
    manual_seed(c.seed);
    const int64_t gpt_params = models::make_language_model(spec_of("gpt", c, V, 0))->num_parameters();
    if (dist::is_main()) print_plan(c, text);

    std::vector<Result> results;
    for (const std::string& kind : c.models) {
      manual_seed(c.seed);  // every model starts from the same generator state
      if (c.profile) profiler_reset();
      results.push_back(run_model(spec_of(kind, c, V, gpt_params), c, text));
    }
    if (!dist::is_main()) return 0;  // rank 0 alone reports and writes
    if (c.profile) fmt::print("\n{}\n", profiler_report(measure_sgemm_peak_gflops()));
    write_report(c, text, results);
  } catch (const std::exception& e) {
    dist::abort(fmt::format("charlm: {}", e.what()));  // under MPI: ends every rank, not only this one
  }
  return 0;
}
