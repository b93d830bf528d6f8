// lm_train — the tapegrad side of the language-model comparison
// (bench/compare.py runs it alternately with bench/torch_lm.py). Trains one
// of the comparison's workloads (bench/workloads.h) and prints one JSON line:
// steady-state tokens/s, the matmul GFLOP/s inside the step (from the
// profiler, in a separate profiled pass so timing stays clean), heap
// allocations per steady-state step, peak RSS and, with --eval, the
// validation loss.
//
//   build/bench/lm_train --write-text out/bench/text          # the shared train.txt / val.txt
//   build/bench/lm_train --workload gpt-s --text-dir out/bench/text --threads 1
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
#include <map>
#include <set>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/blas.h"
#include "bench/workloads.h"
#include "data/lm_batches.h"
#include "data/corpus.h"
#include "dist/ddp.h"
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

// Code points of a UTF-8 string (the character vocabulary works on code points, as Python's str).
std::vector<std::u32string::value_type> code_points(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    int n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    char32_t cp = n == 1 ? c : c & (0x3F >> (n - 1));
    for (int k = 1; k < n && i + k < s.size(); ++k) cp = (cp << 6) | (s[i + k] & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}


}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  std::string workload = "gpt-s", text_dir = "out/bench/text", write_text, brown_dir;
  int threads = 1;
  int64_t warmup = 5, steps = 30, peak_n = 1024;
  uint64_t seed = 1337;
  int64_t discarded = 0;
  bool eval = false, peak = false, no_overlap = false;
  int64_t bucket_kb = dist::DDPOptions{}.bucket_bytes / 1024;
  CLI::App app{"lm_train: one training workload of the PyTorch comparison, tapegrad side"};
  app.add_option("--workload", workload, "gpt-s, gpt-m, rnn or lstm")->check(CLI::IsMember({"gpt-s", "gpt-m", "rnn", "lstm"}));
  app.add_option("--text-dir", text_dir, "Directory with train.txt and val.txt");
  app.add_option("--write-text", write_text, "Write the Brown corpus split as DIR/train.txt and DIR/val.txt, then exit");
  app.add_option("--brown-dir", brown_dir, "Where scripts/fetch_brown.sh put the Brown corpus");
  app.add_option("--threads", threads, "Threads for kernels and OpenBLAS")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "Untimed steps first");
  app.add_option("--steps", steps, "Timed steps")->check(CLI::PositiveNumber);
  app.add_flag("--eval", eval, "Report the validation loss on 20 fixed batches after the run");
  app.add_flag("--gemm-peak", peak, "Measure the OpenBLAS sgemm peak and exit");
  app.add_option("--gemm-size", peak_n, "Square GEMM size for --gemm-peak");
  app.add_option("--seed", seed, "Seed");
  app.add_option("--discarded-forwards", discarded,
                 "Instead of training: run N recorded forwards that nobody backpropagates and report the memory held");
  app.add_option("--bucket-kb", bucket_kb, "Under mpirun: KiB of gradient per allreduce bucket")->check(CLI::PositiveNumber);
  app.add_flag("--no-overlap", no_overlap, "Under mpirun: start the allreduces after backward, not during it");
  CLI11_PARSE(app, argc, argv);

  try {
    set_num_threads(threads);
    if (peak) {
      fmt::print("{{\"side\": \"openblas\", \"threads\": {}, \"sgemm_gflops\": {:.2f}}}\n", threads, measure_sgemm_peak_gflops(peak_n));
      return 0;
    }
    if (!write_text.empty()) {
      data::Corpus c = data::load_corpus("", brown_dir, 0.1, seed);
      std::filesystem::create_directories(write_text);
      std::ofstream(write_text + "/train.txt", std::ios::binary) << data::join_text(c.train);
      std::ofstream(write_text + "/val.txt", std::ios::binary) << data::join_text(c.val);
      fmt::print("wrote {0}/train.txt and {0}/val.txt\n", write_text);
      return 0;
    }
    const bench::Workload& w = bench::workloads().at(workload);
    if (w.batch % dist::world_size() != 0)
      throw ValueError(fmt::format("lm_train: {}'s batch of {} does not split over {} ranks", workload, w.batch, dist::world_size()));
    // Code points -> ids; the code points are freed before training, so the
    // peak RSS holds the corpus once, in LMBatches (2 bytes a character).
    std::vector<int32_t> train_ids, val_ids;
    int64_t V = 0;
    {
      auto train_cp = code_points(read_all(text_dir + "/train.txt")), val_cp = code_points(read_all(text_dir + "/val.txt"));
      std::set<char32_t> chars(train_cp.begin(), train_cp.end());
      chars.insert(val_cp.begin(), val_cp.end());
      std::map<char32_t, int32_t> stoi;
      for (char32_t ch : chars) stoi.emplace(ch, static_cast<int32_t>(stoi.size()));
      auto encode = [&](const std::vector<char32_t>& cp) {
        std::vector<int32_t> ids(cp.size());
        for (size_t i = 0; i < cp.size(); ++i) ids[i] = stoi.at(cp[i]);
        return ids;
      };
      train_ids = encode(train_cp), val_ids = encode(val_cp);
      V = static_cast<int64_t>(chars.size());
    }
    data::LMBatches train(std::move(train_ids), w.model.block), val(std::move(val_ids), w.model.block);

    manual_seed(seed);
    bench::Trainer trainer = bench::make_trainer(w, V);
    // Averages the gradients inside backward (the last parameter's hook
    // waits for the allreduces), so Trainer::step needs no change.
    dist::DistributedDataParallel ddp(*trainer.model, {.bucket_bytes = bucket_kb * 1024, .overlap = !no_overlap});
    Generator gen(seed);
    if (discarded > 0) {
      // Each forward's graph must go with its loss: memory and live nodes stay flat.
      data::LMBatch b = train.sample(w.batch, gen);
      trainer.model->loss(b.inputs, b.targets);  // warm the allocator's cache
      const AllocatorStats before = allocator_stats();
      const int64_t nodes_before = live_nodes();
      reset_peak_memory_stats();
      int64_t max_nodes = 0;
      for (int64_t i = 0; i < discarded; ++i) {
        Tensor loss = trainer.model->loss(b.inputs, b.targets);
        max_nodes = std::max(max_nodes, live_nodes());
      }
      const AllocatorStats after = allocator_stats();
      fmt::print(
          "{{\"side\": \"tapegrad\", \"workload\": \"{}\", \"discarded_forwards\": {}, \"bytes_in_use_before\": {}, "
          "\"bytes_in_use_after\": {}, \"pool_peak_mb\": {:.1f}, \"live_nodes_before\": {}, \"live_nodes_after\": {}, "
          "\"live_nodes_max\": {}, \"peak_rss_mb\": {:.1f}}}\n",
          workload, discarded, before.bytes_in_use, after.bytes_in_use, after.peak_bytes_in_use / 1048576.0,
          nodes_before, live_nodes(), max_nodes, report::peak_rss_mib());
      return 0;
    }
    double last_loss = 0;
    auto step = [&] {
      data::LMBatch b = train.sample(w.batch, gen);  // the whole batch on every rank, each trains on its shard
      last_loss = trainer.step(dist::shard(b.inputs), dist::shard(b.targets));
    };
    for (int64_t i = 0; i < warmup; ++i) step();
    // Heap allocations by the caching allocator in one steady-state step.
    uint64_t system_allocs = bench::count_system_allocs(step);
    // Matmul GFLOP/s from a profiled pass (the profiler's clock reads cost a little, so it is not the timed pass).
    profiler_reset();
    profiler_enable(true);
    for (int i = 0; i < 3; ++i) step();
    profiler_enable(false);
    ProfileTotals prof = profiler_totals();
    dist::barrier();  // the ranks start the timed steps together
    ddp.reset_stats();
    auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < steps; ++i) step();
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const AllocatorStats pool = allocator_stats();
    last_loss = dist::all_reduce_sum(last_loss) / dist::world_size();  // the whole batch's mean (equal shards)
    std::string extra;
    if (dist::world_size() > 1) {
      // Shares of rank 0's timed steps.
      const dist::DDPStats& st = ddp.stats();
      extra += fmt::format(
          ", \"bucket_kb\": {}, \"overlap\": {}, \"buckets\": {}, \"allreduce_bytes_per_step\": {}, \"hook_share\": {:.4f}, "
          "\"window_share\": {:.4f}, \"skew_share\": {:.4f}, \"wait_share\": {:.4f}, \"copy_back_share\": {:.4f}",
          bucket_kb, !no_overlap, st.buckets, st.bytes, st.hook_seconds / secs, st.window_seconds / secs,
          st.skew_seconds / secs, st.wait_seconds / secs, st.copy_back_seconds / secs);
    }
    if (eval) {
      // Each rank scores every N-th batch; the sums are reduced.
      NoGradGuard ng;
      trainer.model->eval();
      double total = 0;
      for (int64_t i = dist::rank(); i < 20; i += dist::world_size()) {
        data::LMBatch b = val.fixed(i, 20, w.batch);
        total += trainer.model->loss(b.inputs, b.targets).item();
      }
      extra += fmt::format(", \"val_loss\": {:.5f}", dist::all_reduce_sum(total) / 20);
    }
    if (!dist::is_main()) return 0;
    fmt::print(
        "{{\"side\": \"tapegrad\", \"workload\": \"{}\", \"threads\": {}, \"ranks\": {}, \"steps\": {}, \"tokens_per_step\": {}, \"tokens_per_s\": {:.1f}, "
        "\"last_loss\": {:.5f}, \"peak_rss_mb\": {:.1f}, \"matmul_gflops\": {:.2f}, \"matmul_share\": {:.3f}, "
        "\"system_allocs_per_step\": {}, \"pool_peak_mb\": {:.1f}, \"pool_held_mb\": {:.1f}{}}}\n",
        workload, threads, dist::world_size(), steps, w.batch * w.model.block, steps * w.batch * w.model.block / secs, last_loss, report::peak_rss_mib(),
        prof.flop_seconds > 0 ? prof.flops / prof.flop_seconds / 1e9 : 0.0,
        prof.seconds > 0 ? prof.flop_seconds / prof.seconds : 0.0, system_allocs, pool.peak_bytes_in_use / 1048576.0,
        (pool.bytes_in_use + pool.bytes_cached) / 1048576.0, extra);
  } catch (const std::exception& e) {
    dist::abort(fmt::format("lm_train: {}", e.what()));  // under MPI: ends every rank, not only this one
  }
  return 0;
}
