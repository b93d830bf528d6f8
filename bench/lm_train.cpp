// lm_train — the tapegrad side of the language-model comparison
// (bench/compare.py runs it alternately with bench/torch_lm.py). Trains one
// of the comparison's workloads (bench/workloads.h) and prints one JSON line:
// steady-state tokens/s, the matmul GFLOP/s inside the step (from the
// profiler, in a separate profiled pass so timing stays clean), the model
// FLOP/s and MFU against the core's peak measured in the same process
// (bench/peak.h; mfu = model FLOP/s over threads x ranks x that peak,
// gemm_fraction_of_peak = the matmul GFLOP/s over threads x peak), heap
// allocations per steady-state step, peak RSS and, with --eval, the
// validation loss. --dtype bf16 runs each step's forward and loss (and the
// evaluation) under bfloat16 autocast, as bench/torch_lm.py --dtype bf16 runs
// PyTorch's under torch.autocast.
//
//   build/bench/lm_train --write-text out/bench/text          # the shared train.txt / val.txt
//   build/bench/lm_train --workload gpt-s --text-dir out/bench/text --threads 1
//   build/bench/lm_train --workload gpt-s --text-dir out/bench/text --dtype bf16
//   build/bench/lm_train --gemm-peak --threads 2              # OpenBLAS sgemm peak, GFLOP/s
//
// Under `mpirun -np N` (same flags) it trains data-parallel: each rank takes
// B/N rows of every batch of B and the gradients are averaged
// (dist::DistributedDataParallel), so tokens/s counts the same B*T tokens a
// step as one process does. Rank 0 prints, adding where the step time of the
// averaging went (see DDPStats): --bucket-kb sets the bucket size and
// --no-overlap starts every allreduce after backward instead of during it.
//   mpirun -np 2 --bind-to none build/bench/lm_train --workload gpt-s --threads 1

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#if defined(__GLIBC__)
#include <malloc.h>  // malloc_trim
#endif

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/blas.h"
#include "bench/peak.h"
#include "bench/workloads.h"
#include "data/lm_batches.h"
#include "data/corpus.h"
#include "distributed/ddp.h"
#include "report/report.h"

using namespace tg;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw ValueError(fmt::format("lm_train: cannot read {} (make it with --write-text)", path));
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Calls f with each code point of a UTF-8 string (the character vocabulary
// works on code points, as Python's str).
template <class F>
void for_each_code_point(const std::string& s, F&& f) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    char32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    f(cp);
    i += n;
  }
}

struct Options {
  std::string workload = "gpt-s", text_dir = "out/bench/text", write_text, brown_dir, dtype = "f32";
  int threads = 1;
  int64_t warmup = 5, steps = 30, peak_n = 1024;
  uint64_t seed = 1337;
  int64_t discarded = 0;
  bool eval = false, peak = false, no_overlap = false, profile = false, checkpoint = false;
  int64_t block = 0, batch = 0;  // > 0: replace the workload's T and B
  int64_t bucket_kb = dist::DDPOptions{}.bucket_bytes / 1024;
};

void add_options(CLI::App& app, Options& o) {
  app.add_option("--workload", o.workload, "gpt-s, gpt-m, rnn or lstm")->check(CLI::IsMember({"gpt-s", "gpt-m", "rnn", "lstm"}));
  app.add_option("--text-dir", o.text_dir, "Directory with train.txt and val.txt");
  app.add_option("--write-text", o.write_text, "Write the Brown corpus split as DIR/train.txt and DIR/val.txt, then exit");
  app.add_option("--brown-dir", o.brown_dir, "Where scripts/fetch_brown.sh put the Brown corpus");
  app.add_option("--threads", o.threads, "Threads for kernels and OpenBLAS")->check(CLI::PositiveNumber);
  app.add_option("--dtype", o.dtype, "f32, or bf16 for bfloat16 autocast: GEMMs in bfloat16, float32 master weights")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--warmup", o.warmup, "Untimed steps first");
  app.add_option("--steps", o.steps, "Timed steps")->check(CLI::PositiveNumber);
  app.add_flag("--eval", o.eval, "Report the validation loss on 20 fixed batches after the run");
  app.add_flag("--gemm-peak", o.peak, "Measure the OpenBLAS sgemm peak and exit");
  app.add_option("--gemm-size", o.peak_n, "Square GEMM size for --gemm-peak");
  app.add_option("--seed", o.seed, "Seed");
  app.add_option("--discarded-forwards", o.discarded,
                 "Instead of training: run N recorded forwards that nobody backpropagates and report the memory held");
  app.add_option("--bucket-kb", o.bucket_kb, "Under mpirun: KiB of gradient per allreduce bucket")->check(CLI::PositiveNumber);
  app.add_flag("--no-overlap", o.no_overlap, "Under mpirun: start the allreduces after backward, not during it");
  app.add_flag("--profile", o.profile, "Print the per-op profile and memory_summary() of the profiled steps (on stderr)");
  app.add_flag("--checkpoint", o.checkpoint,
               "Activation checkpointing: every GPT block, or the recurrence over chunks of sqrt(T) steps");
  app.add_option("--seq-len", o.block, "Sequence length T instead of the workload's (GPT: also its context)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "Batch B instead of the workload's")->check(CLI::PositiveNumber);
}

void write_text_split(const Options& o) {
  data::Corpus c = data::load_corpus("", o.brown_dir, 0.1, o.seed);
  std::filesystem::create_directories(o.write_text);
  std::ofstream(o.write_text + "/train.txt", std::ios::binary) << data::join_text(c.train);
  std::ofstream(o.write_text + "/val.txt", std::ios::binary) << data::join_text(c.val);
  fmt::print("wrote {0}/train.txt and {0}/val.txt\n", o.write_text);
}

// The character batches of train.txt and val.txt (ids over the code points of
// both, sorted) and the vocabulary size.
struct CharData {
  data::LMBatches train, val;
  int64_t vocab;
};

CharData load_char_data(const std::string& text_dir, int64_t block) {
  // Two passes over each text's bytes, the vocabulary and then the ids, so
  // that loading holds the texts and one int32 stream at a time (LMBatches
  // keeps 2 bytes a character), not a code-point copy of the corpus beside
  // them (the RNN LM's peak RSS, which loading sets: 58 -> 48 MiB).
  const std::string train = read_all(text_dir + "/train.txt"), val = read_all(text_dir + "/val.txt");
  std::vector<bool> seen;  // by code point
  auto mark = [&](char32_t cp) {
    if (cp >= seen.size()) seen.resize(cp + 1);
    seen[cp] = true;
  };
  for_each_code_point(train, mark);
  for_each_code_point(val, mark);
  std::vector<int32_t> id_of(seen.size(), -1);  // ids in code point order
  int32_t vocab = 0;
  for (size_t cp = 0; cp < seen.size(); ++cp)
    if (seen[cp]) id_of[cp] = vocab++;
  auto encode = [&](const std::string& text) {
    std::vector<int32_t> ids;
    ids.reserve(text.size());  // bytes: at least the code points
    for_each_code_point(text, [&](char32_t cp) { ids.push_back(id_of[cp]); });
    return ids;
  };
  data::LMBatches train_batches(encode(train), block);
  return {std::move(train_batches), data::LMBatches(encode(val), block), vocab};
}

// Runs N recorded forwards that nobody backpropagates: each graph must go with
// its loss, so the allocator's bytes in use and the live nodes stay flat.
// Under the training step's precision (bf16 adds the weights' bfloat16 copies).
void report_discarded_forwards(const Options& o, bench::Trainer& trainer, const data::LMBatch& b) {
  AutocastGuard precision(trainer.autocast);
  trainer.model->loss(b.inputs, b.targets);  // warm the allocator's cache
  const MemoryStats before = memory_stats();
  const int64_t nodes_before = live_nodes();
  reset_peak_memory_stats();
  int64_t max_nodes = 0;
  for (int64_t i = 0; i < o.discarded; ++i) {
    Tensor loss = trainer.model->loss(b.inputs, b.targets);
    max_nodes = std::max(max_nodes, live_nodes());
  }
  const MemoryStats after = memory_stats();
  fmt::print(
      "{{\"side\": \"tapegrad\", \"workload\": \"{}\", \"dtype\": \"{}\", \"discarded_forwards\": {}, \"bytes_in_use_before\": {}, "
      "\"bytes_in_use_after\": {}, \"pool_peak_mb\": {:.1f}, \"live_nodes_before\": {}, \"live_nodes_after\": {}, "
      "\"live_nodes_max\": {}, \"peak_rss_mb\": {:.1f}}}\n",
      o.workload, o.dtype, o.discarded, before.bytes_in_use, after.bytes_in_use, after.peak_bytes_in_use / 1048576.0,
      nodes_before, live_nodes(), max_nodes, report::peak_rss_mib());
}

// The validation loss on 20 fixed batches, at the training step's precision:
// each rank scores every N-th batch; the sums are reduced.
double validation_loss(bench::Trainer& trainer, const data::LMBatches& val, int64_t batch) {
  NoGradGuard ng;
  AutocastGuard precision(trainer.autocast);
  trainer.model->eval();
  double total = 0;
  for (int64_t i = dist::rank(); i < 20; i += dist::world_size()) {
    data::LMBatch b = val.fixed(i, 20, batch);
    total += trainer.model->loss(b.inputs, b.targets).item();
  }
  return dist::all_reduce_sum(total) / 20;
}

// Warm-up, a counted step, a profiled pass, then the timed steps; rank 0 prints one JSON line.
constexpr int kProfiledSteps = 3;
void train_and_report(const Options& o, const bench::Workload& w, bench::Trainer& trainer,
                      dist::DistributedDataParallel& ddp, CharData& d, Generator& gen) {
  double last_loss = 0;
  auto step = [&] {
    data::LMBatch b = d.train.sample(w.batch, gen);  // the whole batch on every rank, each trains on its shard
    last_loss = trainer.step(dist::shard(b.inputs), dist::shard(b.targets));
  };
  for (int64_t i = 0; i < o.warmup; ++i) step();
  // Heap allocations by the caching allocator in one steady-state step.
  uint64_t system_allocs = bench::count_system_allocs(step);
  // Matmul GFLOP/s from a profiled pass (the profiler's clock reads cost a little, so it is not the timed pass).
  profiler_reset();
  profiler_enable(true);
  for (int i = 0; i < kProfiledSteps; ++i) step();
  profiler_enable(false);
  ProfileTotals prof = profiler_totals();
  if (o.profile && dist::is_main()) {
    fmt::print(stderr, "GEMM precision: {}\nGEMMs: {}\n{}\n{}", o.dtype, gemm_backend_info(), profiler_report(), memory_summary());
  }
  dist::barrier();  // the ranks start the timed steps together
  ddp.reset_stats();
  // The peak of the timed steps above what is held between steps (weights,
  // gradients, optimizer state): the activations a step holds at once.
  const size_t held_between_steps = memory_stats().bytes_in_use;
  reset_peak_memory_stats();
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < o.steps; ++i) step();
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const MemoryStats pool = memory_stats();
  last_loss = dist::all_reduce_sum(last_loss) / dist::world_size();  // the whole batch's mean (equal shards)
  std::string extra;
  if (dist::world_size() > 1) {
    // Shares of rank 0's timed steps.
    const dist::DDPStats& st = ddp.stats();
    extra += fmt::format(
        ", \"bucket_kb\": {}, \"overlap\": {}, \"buckets\": {}, \"allreduce_bytes_per_step\": {}, \"hook_share\": {:.4f}, "
        "\"window_share\": {:.4f}, \"skew_share\": {:.4f}, \"wait_share\": {:.4f}, \"copy_back_share\": {:.4f}",
        o.bucket_kb, !o.no_overlap, st.buckets, st.bytes, st.hook_seconds / secs, st.window_seconds / secs,
        st.skew_seconds / secs, st.wait_seconds / secs, st.copy_back_seconds / secs);
  }
  if (o.eval) extra += fmt::format(", \"val_loss\": {:.5f}", validation_loss(trainer, d.val, w.batch));
  if (!dist::is_main()) return;
  const int64_t tokens = w.batch * w.model.block;
  // Model FLOPs a token: the GEMM FLOPs the profiled steps counted (every
  // GEMM of forward and backward: projections, attention's products, the
  // recurrences, the output head) over the tokens this rank trained on in
  // them, rather than the 6 N-per-token-plus-attention estimate for a GPT
  // (which it counts exactly, with nothing for the elementwise work): less
  // attention's second q k^T in its backward, which rebuilds the forward's
  // probabilities (RecomputedWork; 1.2% of the GPTs' GEMM work). With
  // --checkpoint it counts the forward's rerun, so mfu there is the
  // hardware's utilisation.
  const double flops_per_token =
      prof.model_flops / (kProfiledSteps * static_cast<double>(tokens) / dist::world_size());
  const double tokens_per_s = o.steps * tokens / secs;
  const double model_flops_per_s = flops_per_token * tokens_per_s;
  const double gemm_flops_per_s = prof.flop_seconds > 0 ? prof.flops / prof.flop_seconds : 0.0;
  // The core's peak for the run's dtype, measured here (tens of ms, after the
  // timed steps): FMAs for float32; bfloat16 dot products for bf16, or FMAs
  // where the CPU has none and bf16 GEMMs run on widened float32 operands.
  const bench::PeakLoop loop = o.dtype == "bf16" && bench::peak_loop_available(bench::PeakLoop::dpbf16_f32)
                                   ? bench::PeakLoop::dpbf16_f32
                                   : bench::PeakLoop::fma_f32;
  const double peak = bench::measure_core_peak(loop);
  const double cores = static_cast<double>(o.threads) * dist::world_size();
  if (o.profile)
    fmt::print(stderr, "GEMM shapes of the profiled steps, against one core's {} peak ({:.1f} GFLOP/s):\n{}\n",
               loop == bench::PeakLoop::fma_f32 ? "float32 FMA" : "bfloat16 dot-product", peak / 1e9,
               profiler_gemm_report(peak / 1e9));
  extra += fmt::format(
      ", \"model_flops_per_token\": {:.0f}, \"model_flops_per_s\": {:.4g}, \"peak_flops_per_core\": {:.4g}, "
      "\"peak_loop\": \"{}\", \"mfu\": {:.4f}, \"gemm_fraction_of_peak\": {:.4f}",
      flops_per_token, model_flops_per_s, peak, loop == bench::PeakLoop::fma_f32 ? "fma_f32" : "dpbf16_f32",
      peak > 0 ? model_flops_per_s / (cores * peak) : 0.0, peak > 0 ? gemm_flops_per_s / (o.threads * peak) : 0.0);
  fmt::print(
      "{{\"side\": \"tapegrad\", \"workload\": \"{}\", \"dtype\": \"{}\", \"threads\": {}, \"ranks\": {}, \"steps\": {}, \"T\": {}, \"B\": {}, \"checkpoint\": {}, \"tokens_per_step\": {}, \"tokens_per_s\": {:.1f}, \"seconds_per_step\": {:.3f}, "
      "\"last_loss\": {:.5f}, \"peak_rss_mb\": {:.1f}, \"matmul_gflops\": {:.2f}, \"matmul_share\": {:.3f}, "
      "\"system_allocs_per_step\": {}, \"pool_peak_mb\": {:.1f}, \"step_peak_mb\": {:.1f}, \"pool_held_mb\": {:.1f}{}}}\n",
      o.workload, o.dtype, o.threads, dist::world_size(), o.steps, w.model.block, w.batch, o.checkpoint, tokens,
      tokens_per_s, secs / o.steps, last_loss, report::peak_rss_mib(), gemm_flops_per_s / 1e9,
      prof.seconds > 0 ? prof.flop_seconds / prof.seconds : 0.0, system_allocs, pool.peak_bytes_in_use / 1048576.0,
      (pool.peak_bytes_in_use - held_between_steps) / 1048576.0,
      (pool.bytes_in_use + pool.bytes_cached) / 1048576.0, extra);
}

void run(const Options& o) {
  set_num_threads(o.threads);
  if (o.peak) {
    fmt::print("{{\"side\": \"openblas\", \"threads\": {}, \"sgemm_gflops\": {:.2f}}}\n", o.threads, measure_sgemm_peak_gflops(o.peak_n));
    return;
  }
  if (!o.write_text.empty()) return write_text_split(o);
  bench::Workload w = bench::workloads().at(o.workload);
  if (o.block > 0) w.model.block = o.block;
  if (o.batch > 0) w.batch = o.batch;
  w.model.checkpoint = o.checkpoint;
  if (w.batch % dist::world_size() != 0)
    throw ValueError(fmt::format("lm_train: {}'s batch of {} does not split over {} ranks", o.workload, w.batch, dist::world_size()));
  CharData d = load_char_data(o.text_dir, w.model.block);
#if defined(__GLIBC__)
  malloc_trim(0);  // loading's freed buffers go back to the system before training
#endif
  manual_seed(o.seed);
  bench::Trainer trainer = bench::make_trainer(w, d.vocab);
  trainer.autocast = o.dtype == "bf16" ? DType::bf16 : DType::f32;
  // Averages the gradients inside backward (the last parameter's hook
  // waits for the allreduces), so Trainer::step needs no change.
  dist::DistributedDataParallel ddp(*trainer.model, {.bucket_bytes = o.bucket_kb * 1024, .overlap = !o.no_overlap});
  Generator gen(o.seed);
  if (o.discarded > 0) return report_discarded_forwards(o, trainer, d.train.sample(w.batch, gen));
  train_and_report(o, w, trainer, ddp, d, gen);
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  Options o;
  CLI::App app{"lm_train: one training workload of the PyTorch comparison, tapegrad side"};
  add_options(app, o);
  CLI11_PARSE(app, argc, argv);
  try {
    run(o);
  } catch (const std::exception& e) {
    dist::abort(fmt::format("lm_train: {}", e.what()));  // under MPI: ends every rank, not only this one
  }
  return 0;
}
