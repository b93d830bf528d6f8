#pragma once
// The main job as a study: which of the claims made for transformers against
// recurrent networks hold for this library's RNN, LSTM (and GRU) and GPT at
// matched parameter counts. Each part measures what one claim is about and
// leaves CSV files, plots and a Markdown section in the output directory; the
// verdicts part reads those files, so every verdict can be traced to a number
// on disk.
//
//   part       what it measures                                 files
//   tuning     LR sweep per model, then the full run on the text  sweep.csv, tuning.csv, loss.png, samples.txt,
//                                                                 tokenizer.json, <model>.seed<i>.safetensors
//   cost       time and memory per token against context T        cost.csv, cost.png
//   recall     recall accuracy against distance k; val loss of    recall_sweep.csv, recall.csv, context.csv,
//              the same characters against context length t       recall.png, context.png
//              (part 1's models)
//   gradients  |dL_t / dx_(t-k)| against k, init and trained      gradients.csv, gradients.png
//   parallel   sequential steps against T; tokens/s, 1 and 2      steps.csv, parallel.csv, speedup.csv,
//              threads (paired steps: medians, quartiles)          parallel.png
//   scale      val loss against parameters and training FLOPs      scale.csv, scale_fit.csv, scale_gap.csv,
//              at growing sizes and tokens-per-parameter budgets;  scale_curves.csv, scale_context.csv,
//              power-law fits per model and budget; GPT's gaps     scale.png, scale_gap.png
//   verdicts   the table of claims and verdicts                   results.md
// Parts 1, 3, 4 and scale train every model once per seed (Config::seeds)
// and report the mean and the min-max range over the seeds; a verdict that
// compares two models compares that difference with the ranges (fit.h).
// Every part also writes <part>.md (its section of results.md); times.csv
// keeps how long each part took and at what precision (part_dtype).
#include <cstdint>
#include <functional>
#include <map>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/dtype.h"
#include "autograd/generator.h"
#include "data/lm_batches.h"
#include "examples/study/fit.h"
#include "models/gpt.h"
#include "models/language_model.h"

namespace tg::study {

struct Config {
  std::string data, brown_dir, out = "out/study";
  std::vector<std::string> models = {"rnn", "lstm", "gpt"};
  uint64_t seed = 1337;
  // Parts 1, 3, 4 and scale: each model trained from this many seeds
  // (run_seed); the learning-rate sweeps run at the first only.
  int64_t seeds = 3;
  int threads = 0;
  // The models: GPT's size is the reference; each recurrent model gets the
  // hidden size that brings its parameter count closest to GPT's.
  int64_t gpt_layers = 2, gpt_heads = 4, gpt_dim = 128, embed = 64;
  // Part 1: language models on the text, each at its best learning rate of `lrs`
  // after sweep_steps, then trained for steps.
  int64_t block = 128, batch = 16, steps = 400, sweep_steps = 80, eval_every = 50, eval_batches = 20, warmup = 40;
  std::vector<double> lrs = {1e-3, 3e-3, 1e-2};
  // Part 2: cost against context length, batches of cost_tokens tokens
  // (cost_tokens / T sequences), as training at a fixed token budget per step.
  std::vector<int64_t> cost_lengths = {32, 64, 128, 256, 512, 1024};
  int64_t cost_tokens = 8192, cost_reps = 5;
  // Part 3: the recall task (length, training steps, batch, test sequences per
  // distance; each model is trained at every rate of `lrs`, the best kept)
  // and the batches of validation characters scored at every context length.
  int64_t recall_length = 64, recall_steps = 250, recall_batch = 32, recall_tests = 200, context_batches = 100;
  // Part 4: validation windows whose gradients are averaged.
  int64_t grad_batch = 32;
  // Part 5: timed training steps per model and thread count.
  int64_t parallel_steps = 10;
  // Part scale: GPT widths (gpt_layers blocks, gpt_heads heads; the
  // recurrent models matched to each), the first scale_sizes of them run
  // (--full: all), a model left out above its scale_max_size (sizes counted
  // from 1: "rnn" -> 2 runs the RNN at the two smallest). Each size trains at
  // every budget of scale_tokens_per_param (tokens per GPT parameter) from
  // every seed (scale_largest_seeds at the largest size run, when set), at
  // the learning rate of a sweep over `lrs` at scale_sweep_fraction of the
  // largest budget; each run evaluated scale_evals times (scale_curves.csv).
  // Sizes from index scale_bf16_from on train under bf16 autocast; the
  // smallest size also in the other precision, to check the two agree
  // within the seeds' spread.
  std::vector<int64_t> scale_dims = {64, 128, 256};
  int64_t scale_sizes = 2, scale_bf16_from = 2;
  std::vector<double> scale_tokens_per_param = {1, 2};
  double scale_sweep_fraction = 0.25;
  int64_t scale_largest_seeds = 0, scale_evals = 4;
  std::map<std::string, int64_t> scale_max_size;
  // bfloat16 autocast (--bf16): the GEMMs of every training run (parts 1, 3)
  // and timed step (parts 2, 5) in bfloat16, float32 master weights. What
  // measures a trained model (recall accuracy, loss against context,
  // gradients) stays float32, so it tells the weights apart, not the arithmetic.
  bool bf16 = false;
};

// The precision of the training runs' and timed steps' GEMMs: DType::bf16
// under --bf16, else DType::f32.
DType gemm_precision(const Config& c);
// What the CSV files' dtype column says of a part's GEMMs: "bf16" or "f32";
// "f32" always for the parts that only measure (gradients, verdicts);
// "mixed" for scale, whose CSV says it per run.
std::string part_dtype(const Config& c, const std::string& part);

// The seed of run i of Config::seeds: seed, seed + 1000, ... (run 0 is the
// seed given, so one seed gives what the study gave before it had seeds).
uint64_t run_seed(const Config& c, int64_t i);
// <kind>.seed<i>.safetensors: part 1's model of run i.
std::string model_file(const std::string& kind, int64_t i);

// The size of Brown's character vocabulary: parts 2 and 5 time models on
// random ids over it, so their heads cost what part 1's do.
constexpr int64_t kCharVocab = 85;

// The parts in the order they run; --part takes these names.
const std::vector<std::string>& part_names();

// The training and validation text, loaded once.
struct Text {
  std::string source, train, val;
};

class Study {
 public:
  explicit Study(Config config) : c(std::move(config)) {}
  const Text& text();
  // <out>/<name>
  std::string path(const std::string& name) const { return c.out + "/" + name; }
  Config c;

 private:
  std::optional<Text> text_;
};

// Each part runs with progress bars, writes its files and returns its
// one-line summary and its section of results.md (main adds the part's time
// and writes the section to <out>/<part>.md).
struct PartOutput {
  std::string summary, markdown;
};
PartOutput run_tuning(Study& s);
PartOutput run_cost(Study& s);
PartOutput run_recall(Study& s);
PartOutput run_gradients(Study& s);
PartOutput run_parallel(Study& s);
PartOutput run_scale(Study& s);
PartOutput run_verdicts(Study& s);

// --- the models (models.cpp)

// A model of the line-up for vocabulary V and context `block` (GPT's longest
// context; learned positions unless positions says otherwise). Recurrent
// models are matched to that GPT's parameter count. Seeds the default
// generator with seed first, so a model's initial weights depend on nothing else.
std::shared_ptr<models::LanguageModel> make_model(const Config& c, const std::string& kind, int64_t V, int64_t block,
                                                  uint64_t seed,
                                                  models::PositionKind positions = models::PositionKind::learned);
// "2 layers x 4 heads, C 128" / "E 64, H 570"
std::string shape_of(const models::LanguageModel& m);
// A checkpoint written by save_model, rebuilt (its config is in the metadata).
void save_model(const models::LanguageModel& m, const std::string& path, const std::map<std::string, std::string>& extra);
std::shared_ptr<models::LanguageModel> load_model(const std::string& path);
// The model's forward split at its token lookup, so that gradients with
// respect to the embedded inputs can be taken (tg::grad):
//   embed_tokens: ids (B,T) -> x (B,T,E), the token embeddings
//   logits_from_embedded: x (B,T,E) -> logits (B,T,V), the rest of forward()
Tensor embed_tokens(models::LanguageModel& m, const Tensor& ids);
Tensor logits_from_embedded(models::LanguageModel& m, const Tensor& x);

// --- training (train.cpp)

struct CurvePoint {
  int64_t step = 0;
  double tokens = 0, seconds = 0, train_loss = 0, val_loss = 0;
};

struct TrainSpec {
  std::string label;           // progress bar
  DType precision = DType::f32;  // of the GEMMs of each step's forward and loss, and of validate
  double lr = 1e-3;
  int64_t steps = 0, warmup = 0, eval_every = 0;
  int64_t tokens_per_step = 0; // for the curve's token axis and the rate
  uint64_t seed = 0;           // batches
};

struct TrainResult {
  std::vector<CurvePoint> curve;  // one point per evaluation (and after the last step)
  double seconds = 0;             // training steps only
  size_t peak_bytes = 0;          // tensor memory
};

// The study's one recipe for every model, only the learning rate differing:
// AdamW (weight decay 0.01 on matrices), linear warm-up then cosine decay to
// lr/10, gradient norm clipped at 1. next draws a batch; loss scores it;
// validate returns the validation loss (called every eval_every steps and
// after the last; not counted in seconds).
TrainResult train(models::LanguageModel& m, const TrainSpec& spec,
                  const std::function<data::LMBatch(Generator&)>& next,
                  const std::function<Tensor(models::LanguageModel&, const data::LMBatch&)>& loss,
                  const std::function<double()>& validate);

// A learning-rate sweep: run(lr) trains a fresh model at lr and returns its
// validation loss; the best is the lowest (a diverged run, NaN, counts as the
// worst). A best rate at an end of the grid says little (a rate beyond it
// might do better), so the sweep then tries one more rate past that end, a
// grid step further, and again while the best stays at an end, up to
// max_extra rates in all.
struct Sweep {
  std::vector<double> lrs;     // the rates tried, ascending
  std::vector<double> losses;  // per rate; +inf where the run diverged
  size_t best = 0;
  int extra = 0;               // rates tried past the grid
  // The best rate is still the smallest or the largest tried.
  bool at_edge() const { return lrs.size() > 1 && (best == 0 || best + 1 == lrs.size()); }
  // Records run(lr) = loss.
  void add(double lr, double loss);
  // The rate to try next, one grid step past the end the best sits at (the
  // step between the two rates next to that end: 1e-3, 3e-3, 1e-2 goes on
  // with 3e-2, then 1e-1); nullopt once the best is inside, diverged, or
  // max_extra rates were added.
  std::optional<double> next(int max_extra) const;
};
Sweep sweep_lr(std::vector<double> grid, const std::function<double(double)>& run, int max_extra = 2);

// Mean loss of predicting n targets of ids, spread evenly over [block, size),
// each at the last position of a window of block ids whose last t are the
// ones just before it and whose first block - t come from elsewhere (half the
// ids away; eval mode, no graph). The same targets at the same position in
// windows like the training ones, at every t: losses at two t differ only by
// what the t ids before the target tell the model, not by where in the
// window it predicts (a GPT's learned positions are not all alike).
double loss_given_context(models::LanguageModel& m, const std::vector<int64_t>& ids, int64_t t, int64_t block,
                          int64_t n);
// Mean next-token loss over count fixed validation batches of B windows, in eval mode.
double validation_loss(models::LanguageModel& m, const data::LMBatches& val, int64_t count, int64_t batch);

// --- runs over MPI ranks (cells.cpp)

// Deals cells over the ranks, longest processing time first: the dearest
// cell to the rank with the least work so far (ties to the lower rank), each
// cell's cost added to that rank's load (one entry a rank, the work each
// already has). A cell that would take its rank's load past cap stays
// undealt (kUndealt). Every rank computes the same deal from the same costs.
constexpr size_t kUndealt = static_cast<size_t>(-1);
std::vector<size_t> deal_cells(const std::vector<double>& cost, std::vector<double>& load,
                               double cap = std::numeric_limits<double>::infinity());

// Runs run(i) on the rank rank_of[i] deals cell i to (tg::dist; started
// without mpirun, all here, in index order) and returns on every rank each
// cell's result in cell order. A cell's result must depend on the cell alone,
// not on where or after what it ran: each seeds what it draws from itself.
std::vector<std::string> run_cells(const std::vector<size_t>& rank_of, const std::function<std::string(size_t)>& run);
// The same, the cells dealt by cost so that every rank gets about the same work.
std::vector<std::string> run_cells(const std::vector<double>& cost, const std::function<std::string(size_t)>& run);

// --- files (files.cpp)

// A CSV file read back by column name; a missing file, column or bad number
// is a std::runtime_error naming the file and the column.
class Csv {
 public:
  explicit Csv(const std::string& path);
  static bool exists(const std::string& path);
  bool has(const std::string& column) const;
  size_t size() const { return rows_.size(); }
  const std::string& str(size_t row, const std::string& column) const;
  double num(size_t row, const std::string& column) const;

 private:
  size_t col(const std::string& column) const;
  std::string path_;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// The budgets (tokens per parameter) of scale.csv's rows of role "fit", ascending.
std::vector<double> scale_budgets(const Csv& csv);
// Per model, the power law of val_loss against x_column ("params" or
// "train_flops") over scale.csv's rows of role "fit" at one budget, every
// seed's run a point; a model with fewer than two sizes there has none (scale.cpp).
std::map<std::string, PowerLaw> scale_fits(const Csv& csv, const std::string& x_column, double tokens_per_param);
// GPT's val loss minus a recurrent model's at one size and budget.
struct Gap {
  std::string model;
  int64_t size = 0;
  double tokens_per_param = 0, params = 0;  // params: GPT's
  std::vector<double> per_seed;             // the difference per seed both ran
  // Mean and min-max of per_seed; from one seed, its value ± half the widest
  // range of the same pair at the same budget (spread_borrowed).
  Range range;
  bool spread_borrowed = false;
};
std::vector<Gap> scale_gaps(const Csv& csv);
// Per model and size, each seed's loss at the shortest context of
// scale_context.csv minus its loss at the longest (> 0: the longer helps), at one budget.
std::map<std::string, std::map<int64_t, std::vector<double>>> context_gains(const Csv& csv, double tokens_per_param);

// <out>/<name>, which part 1 (tuning) writes and later parts build on; a
// std::runtime_error saying to run part 1 first when it is missing.
std::string from_tuning(const Study& s, const std::string& name);

// The one-minute load average now: every part states it with its time, since
// timings on a shared machine mean little without it.
std::string load_average();
// The median and quartiles of a sample (linear interpolation between its order
// statistics, as numpy's default); all three equal for one value.
struct Spread {
  double median = 0, q1 = 0, q3 = 0;
};
Spread spread(std::vector<double> sample);
// "3e-3" for 0.003, "1e-2" for 0.01
std::string format_lr(double lr);
// The first x at which a rises above b (from at or below it), interpolated
// linearly in log x between the grid points xs (ascending); nullopt if it never does.
std::optional<double> crossing(const std::vector<double>& xs, const std::vector<double>& a, const std::vector<double>& b);

}  // namespace tg::study
