// study — the main job: the claims made for transformers against recurrent
// networks (long-range dependencies, no vanishing gradients, fewer training
// steps, parallel computation, O(n^2 d) against O(n d^2) cost, better
// scaling), each measured for an RNN, an LSTM and a GPT at matched parameter
// counts from 3 seeds, on the Brown corpus and on a synthetic recall task;
// verdicts in one table at the end.
//
//   build/examples/study                  # every part, scale at its two smallest sizes
//   build/examples/study --full           # scale at every size, up to 20 tokens per parameter
//   mpirun -n 4 build/examples/study --full   # the same, the scale part's runs spread over 4 ranks
//   build/examples/study --quick          # the same at small budgets, ~2 minutes
//   build/examples/study --part cost      # one part (recall and gradients use part 1's models)
//   build/examples/study --bf16           # training and timed steps with GEMMs in bfloat16 (autocast)
//
// Writes into --out (default out/study): results.md (verdicts, then every
// part's tables and plots), CSV files, PNG plots, samples.txt, checkpoints.
// See examples/study/study.h for what each part writes.
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "distributed/dist.h"
#include "examples/study/study.h"
#include "report/progress.h"
#include "report/report.h"

using namespace tg;

namespace {

const std::map<std::string, std::pair<std::string, study::PartOutput (*)(study::Study&)>> kParts = {
    {"tuning", {"1. Same budget, fair tuning", study::run_tuning}},
    {"cost", {"2. Cost against context length", study::run_cost}},
    {"recall", {"3. Long-range dependencies", study::run_recall}},
    {"gradients", {"4. Vanishing gradients", study::run_gradients}},
    {"parallel", {"5. Parallelism", study::run_parallel}},
    {"scale", {"6. Scale", study::run_scale}},
    {"verdicts", {"7. Verdicts", study::run_verdicts}}};

// times.csv keeps the latest time (and GEMM precision) of every part run into this directory.
void record_time(const study::Study& s, const std::string& part, double seconds, const std::string& load_start,
                 const std::string& load_end) {
  std::map<std::string, std::string> rows;
  if (study::Csv::exists(s.path("times.csv"))) {
    study::Csv t(s.path("times.csv"));
    // A file from before the dtype column: every part then ran in float32.
    const bool has_dtype = t.has("dtype");
    for (size_t r = 0; r < t.size(); ++r)
      rows[t.str(r, "part")] = fmt::format("{},{},{},{},{}", t.str(r, "part"), t.str(r, "seconds"),
                                           t.str(r, "load_start"), t.str(r, "load_end"),
                                           has_dtype ? t.str(r, "dtype") : "f32");
  }
  rows[part] = fmt::format("{},{:.1f},{},{},{}", part, seconds, load_start, load_end, study::part_dtype(s.c, part));
  std::string csv = "part,seconds,load_start,load_end,dtype\n";
  for (const std::string& p : study::part_names())
    if (rows.count(p)) csv += rows[p] + "\n";
  report::write_file(s.path("times.csv"), csv);
}


// The command line: every option writes a field of c (or the parts to run).
void add_options(CLI::App& app, study::Config& c, std::vector<std::string>& parts, bool& quick, bool& full) {
  app.add_option("--part", parts, "Run only these parts, in order: " + fmt::format("{}", fmt::join(study::part_names(), ", ")))
      ->delimiter(',')->check(CLI::IsMember(study::part_names()));
  app.add_flag("--quick", quick, "Small budgets everywhere (about 2 minutes); options given explicitly still win");
  app.add_flag("--full", full, "The scale part at every size of --scale-dims, at 2 and 20 tokens per parameter, 3 seeds "
               "at least (1 at the largest size), the RNN at the two smallest sizes");
  app.add_option("--seeds", c.seeds, "Parts 1, 3, 4, scale: runs per model, each from its own seed (mean and min-max)")
      ->check(CLI::PositiveNumber);
  app.add_option("--data", c.data, "A UTF-8 text file instead of the Brown corpus (documents split at blank lines)");
  app.add_option("--brown-dir", c.brown_dir, "Where scripts/fetch_brown.sh put the Brown corpus (default: its cache)");
  app.add_option("--out", c.out, "Output directory");
  app.add_option("--models", c.models, "Models, in order: rnn lstm gru gpt")->delimiter(',')
      ->check(CLI::IsMember({"rnn", "lstm", "gru", "gpt"}));
  app.add_option("--seed", c.seed, "Seed of everything: initialisation, batches, tasks, sampling");
  app.add_option("--threads", c.threads, "Threads (default: TAPEGRAD_NUM_THREADS or all cores); part 5 uses 1 and 2");
  app.add_option("--gpt-layers", c.gpt_layers, "GPT blocks")->check(CLI::PositiveNumber);
  app.add_option("--gpt-heads", c.gpt_heads, "GPT attention heads")->check(CLI::PositiveNumber);
  app.add_option("--gpt-dim", c.gpt_dim, "GPT width C (the recurrent models are matched to GPT's parameter count)")
      ->check(CLI::PositiveNumber);
  app.add_option("--embed", c.embed, "Recurrent models' embedding size")->check(CLI::PositiveNumber);
  app.add_option("--block", c.block, "Part 1, 3, 4: context length T of the language models")->check(CLI::PositiveNumber);
  app.add_option("--batch", c.batch, "Part 1: sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--steps", c.steps, "Part 1: training steps of the full run")->check(CLI::PositiveNumber);
  app.add_option("--sweep-steps", c.sweep_steps, "Part 1: steps per learning rate of the sweep")->check(CLI::PositiveNumber);
  app.add_option("--lrs", c.lrs, "Part 1: learning rates swept")->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--eval-every", c.eval_every, "Part 1: steps between validation losses")->check(CLI::PositiveNumber);
  app.add_option("--eval-batches", c.eval_batches, "Part 1: fixed validation batches per evaluation")->check(CLI::PositiveNumber);
  app.add_option("--warmup", c.warmup, "Part 1: warm-up steps of the full run (the sweep's scaled down)");
  app.add_option("--cost-lengths", c.cost_lengths, "Part 2, 5: context lengths timed")->delimiter(',')
      ->check(CLI::PositiveNumber);
  app.add_option("--cost-tokens", c.cost_tokens, "Part 2: tokens per timed batch (sequences: this / T)")->check(CLI::PositiveNumber);
  app.add_option("--cost-reps", c.cost_reps, "Part 2: timed repetitions (median)")->check(CLI::PositiveNumber);
  app.add_option("--recall-length", c.recall_length, "Part 3: recall sequence length (distances 1 .. length-1)")
      ->check(CLI::Range(3, 100000));
  app.add_option("--recall-steps", c.recall_steps, "Part 3: training steps on the recall task")->check(CLI::PositiveNumber);
  app.add_option("--recall-batch", c.recall_batch, "Part 3: recall sequences per step")->check(CLI::PositiveNumber);
  app.add_option("--recall-tests", c.recall_tests, "Part 3: test sequences per distance")->check(CLI::PositiveNumber);
  app.add_option("--context-batches", c.context_batches, "Part 3: batches of validation characters scored at every context length")
      ->check(CLI::PositiveNumber);
  app.add_option("--grad-batch", c.grad_batch, "Part 4: validation windows averaged")->check(CLI::PositiveNumber);
  app.add_option("--parallel-steps", c.parallel_steps,
                 "Part 5: timed pairs of training steps, one at 1 thread and one at 2 (median and quartiles)")
      ->check(CLI::PositiveNumber);
  app.add_option("--scale-dims", c.scale_dims, "Part scale: GPT widths, ascending (the recurrent models matched to each)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--scale-sizes", c.scale_sizes, "Part scale: how many of --scale-dims to run, from the smallest")
      ->check(CLI::Range(2, 100));
  app.add_option("--tokens-per-param", c.scale_tokens_per_param,
                 "Part scale: training budgets, tokens per GPT parameter (every size trains at each)")
      ->delimiter(',')->check(CLI::PositiveNumber);
  app.add_option("--scale-sweep-fraction", c.scale_sweep_fraction,
                 "Part scale: each size's learning-rate sweep trains this fraction of the largest budget")
      ->check(CLI::Range(1e-6, 1.0));
  app.add_option("--scale-largest-seeds", c.scale_largest_seeds,
                 "Part scale: seeds at the largest size run (default: --seeds); its spread is then borrowed from the "
                 "smaller sizes")->check(CLI::NonNegativeNumber);
  app.add_option("--scale-evals", c.scale_evals, "Part scale: validation points per run (scale_curves.csv)")
      ->check(CLI::PositiveNumber);
  app.add_option_function<std::vector<std::string>>(
         "--scale-max-size",
         [&c](const std::vector<std::string>& limits) {
           for (const std::string& l : limits) {
             const size_t eq = l.find('=');
             if (eq == std::string::npos) throw CLI::ValidationError("--scale-max-size", "expected MODEL=SIZE, got " + l);
             try {
               c.scale_max_size[l.substr(0, eq)] = std::stoll(l.substr(eq + 1));
             } catch (const std::exception&) {
               throw CLI::ValidationError("--scale-max-size", "SIZE must be a number in " + l);
             }
           }
         },
         "Part scale: MODEL=SIZE runs MODEL at sizes 1 .. SIZE only (e.g. rnn=2 where the RNN's time does not allow more)")
      ->delimiter(',');
  app.add_option("--scale-bf16-from", c.scale_bf16_from,
                 "Part scale: sizes from this index (0: the smallest) on train under bfloat16 autocast");
  app.add_flag("--bf16", c.bf16, "bfloat16 autocast: GEMMs in bfloat16, float32 master weights (parts 1, 2, 3 and 5 "
               "train and time in it; measurements of trained models stay float32)");
}

// --quick: about 2 minutes on 2 cores; an option given explicitly stays.
void apply_quick(const CLI::App& app, study::Config& c) {
  auto set = [&](const char* option, auto& field, auto value) {
    if (app.count(option) == 0) field = value;
  };
  set("--steps", c.steps, int64_t{300});
  set("--sweep-steps", c.sweep_steps, int64_t{40});
  set("--eval-every", c.eval_every, int64_t{50});
  set("--eval-batches", c.eval_batches, int64_t{8});
  set("--warmup", c.warmup, int64_t{30});
  set("--block", c.block, int64_t{64});
  set("--batch", c.batch, int64_t{16});
  set("--cost-lengths", c.cost_lengths, std::vector<int64_t>{32, 64, 128, 256});
  set("--cost-tokens", c.cost_tokens, int64_t{2048});
  set("--cost-reps", c.cost_reps, int64_t{5});
  set("--recall-length", c.recall_length, int64_t{32});
  set("--recall-steps", c.recall_steps, int64_t{100});
  set("--recall-tests", c.recall_tests, int64_t{100});
  set("--context-batches", c.context_batches, int64_t{20});
  set("--grad-batch", c.grad_batch, int64_t{8});
  set("--parallel-steps", c.parallel_steps, int64_t{5});
  set("--scale-dims", c.scale_dims, std::vector<int64_t>{32, 64, 128});
  set("--tokens-per-param", c.scale_tokens_per_param, std::vector<double>{0.5, 1.5});
}

// --full: the scale part at every size, at 2 and 20 tokens per parameter
// (20: where compute-optimal transformers train), 3 seeds and 1 at the
// largest size, whose spread is borrowed from the smaller ones; the RNN,
// whose recurrence is the slowest per FLOP, at the two smallest sizes. An
// option given explicitly stays.
void apply_full(const CLI::App& app, study::Config& c) {
  if (app.count("--scale-sizes") == 0) c.scale_sizes = static_cast<int64_t>(c.scale_dims.size());
  if (app.count("--tokens-per-param") == 0) c.scale_tokens_per_param = {2, 20};
  if (app.count("--scale-sweep-fraction") == 0) c.scale_sweep_fraction = 0.1;
  if (app.count("--scale-largest-seeds") == 0) c.scale_largest_seeds = 1;
  if (app.count("--scale-max-size") == 0) c.scale_max_size = {{"rnn", 2}};
  c.seeds = std::max<int64_t>(c.seeds, 3);
}

// The threads of each rank's scale cells under mpirun when --threads is not
// given: the cores of this machine shared among the ranks on it.
int scale_threads() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const int ranks_here = local ? std::max(1, std::atoi(local)) : 1;
  return std::max(1, num_threads() / ranks_here);
}

// Runs the chosen parts in the study's order, each with its title, its
// duration and the load average around it, then prints the summary. Under
// mpirun the scale part's runs spread over the ranks; every other part runs
// on rank 0 while the others wait.
void run_parts(const study::Config& c, const std::vector<std::string>& parts) {
  if (c.threads > 0) set_num_threads(c.threads);
  const bool main_rank = dist::is_main();
  if (main_rank) std::filesystem::create_directories(c.out);
  study::Study s(c);
  const auto start = std::chrono::steady_clock::now();
  const int threads = num_threads();
  std::vector<std::string> summaries;
  for (const std::string& part : study::part_names()) {
    if (std::find(parts.begin(), parts.end(), part) == parts.end()) continue;
    if (part != "scale" && !main_rank) {
      dist::idle_barrier();
      continue;
    }
    const auto& [title, run] = kParts.at(part);
    if (main_rank) fmt::print("\n=== {} ({}) ===\n", title, part);
    const std::string load_start = study::load_average();
    const auto t0 = std::chrono::steady_clock::now();
    if (part == "scale" && dist::world_size() > 1 && c.threads == 0) set_num_threads(scale_threads());
    study::PartOutput out = run(s);
    set_num_threads(threads);
    if (part != "scale") dist::idle_barrier();
    if (!main_rank) continue;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string load_end = study::load_average();
    if (part != "verdicts") {
      const std::string precision = study::part_dtype(c, part) == "bf16"
                                        ? "; training GEMMs in bfloat16 (autocast), float32 master weights"
                                        : "";
      const std::string ranks = part == "scale" && dist::world_size() > 1
                                    ? fmt::format(" on {} MPI ranks", dist::world_size())
                                    : "";
      report::write_file(s.path(part + ".md"),
                         fmt::format("## {}\n\n_Took {}{}; load average {} at the start, {} at the end{}._\n\n{}",
                                     title, report::format_duration(seconds), ranks, load_start, load_end, precision,
                                     out.markdown));
      record_time(s, part, seconds, load_start, load_end);
    }
    summaries.push_back(fmt::format("{:<9} {:>6}  {}", part, report::format_duration(seconds), out.summary));
    fmt::print("\n{}: done in {} — {}\n", part, report::format_duration(seconds), out.summary);
  }
  if (!main_rank) return;
  fmt::print("\n=== summary ({} in all, {} threads{}{}) ===\n{}\n",
             report::format_duration(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()),
             num_threads(), dist::world_size() > 1 ? fmt::format(", {} ranks in the scale part", dist::world_size()) : "",
             c.bf16 ? ", GEMMs in bfloat16" : "", fmt::join(summaries, "\n"));
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  study::Config c;
  std::vector<std::string> parts;
  bool quick = false, full = false;
  CLI::App app{"study: transformers against recurrent networks, claim by claim (the main tapegrad job)"};
  add_options(app, c, parts, quick, full);
  CLI11_PARSE(app, argc, argv);
  if (quick) apply_quick(app, c);
  if (full) apply_full(app, c);
  if (parts.empty()) parts = study::part_names();
  try {
    run_parts(c, parts);
  } catch (const std::exception& e) {
    if (dist::world_size() > 1) dist::abort(fmt::format("study: {}", e.what()));  // the other ranks would wait forever
    fmt::print(stderr, "study: {}\n", e.what());
    return 1;
  }
  return 0;
}
