// The main job's study end to end at a tiny size (seconds): every part runs
// and writes what it promises — CSV files with their columns and one row per
// model and setting, numbers that obey what each part measures (FLOPs grow
// with T for GPT only, a recurrence's sequential steps grow by exactly the
// added length), the verdict table with a row per claim, and the plots. The
// executable's path comes from meson (env STUDY).
#define BOOST_TEST_MODULE study
#include <boost/test/unit_test.hpp>

#include "programs.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace fs = std::filesystem;

namespace {

std::string exe() { return testing::exe("STUDY"); }
using testing::read_text, testing::run;

// A CSV file as rows of column -> cell; the header must be exactly `columns`.
std::vector<std::map<std::string, std::string>> read_csv(const fs::path& p, const std::vector<std::string>& columns) {
  std::istringstream in(read_text(p));
  std::string line;
  BOOST_REQUIRE_MESSAGE(std::getline(in, line), p << " is missing or empty");
  std::vector<std::string> header;
  std::stringstream hs(line);
  for (std::string h; std::getline(hs, h, ',');) header.push_back(h);
  BOOST_REQUIRE_MESSAGE(header == columns, p << ": header " << line);
  std::vector<std::map<std::string, std::string>> rows;
  while (std::getline(in, line)) {
    std::map<std::string, std::string> row;
    std::stringstream ls(line);
    size_t i = 0;
    for (std::string cell; std::getline(ls, cell, ','); ++i) {
      BOOST_REQUIRE_MESSAGE(i < columns.size(), p << ": too many cells in " << line);
      row[columns[i]] = cell;
    }
    BOOST_REQUIRE_MESSAGE(i == columns.size(), p << ": too few cells in " << line);
    rows.push_back(row);
  }
  return rows;
}

double num(const std::map<std::string, std::string>& row, const std::string& col) { return std::stod(row.at(col)); }

const std::vector<std::string> kModels = {"rnn", "lstm", "gpt"};
// Every part at a tiny size: 1-block GPT of width 16 on a 3 KB text.
const std::string kTiny =
    " --data tests/fixtures/tiny.txt --threads 1 --gpt-dim 16 --gpt-layers 1 --gpt-heads 2 --embed 8 --block 16"
    " --batch 4 --steps 20 --sweep-steps 5 --lrs 3e-3,1e-2 --eval-every 10 --eval-batches 2 --warmup 2"
    " --cost-lengths 8,16,32 --cost-tokens 64 --cost-reps 1 --recall-length 12 --recall-steps 10 --recall-batch 8"
    " --recall-tests 20 --context-batches 2 --grad-batch 2 --parallel-steps 3";

// A learning-rate sweep of the tiny run (grid 3e-3, 1e-2): per model, the
// grid's rates in ascending order, one chosen, the lowest loss; rates past the
// grid only where the best was at that end, two at most; a best still at an
// end only when both were spent.
void check_sweep(const std::vector<std::map<std::string, std::string>>& rows) {
  for (const std::string& m : kModels) {
    std::vector<double> lrs, losses;
    size_t chosen = 0, n_chosen = 0;
    for (auto& r : rows)
      if (r.at("model") == m) {
        if (std::stoi(r.at("chosen"))) chosen = lrs.size(), ++n_chosen;
        lrs.push_back(std::stod(r.at("lr")));
        losses.push_back(std::stod(r.at("val_loss")));
      }
    BOOST_TEST_CONTEXT(m) {
      BOOST_REQUIRE(lrs.size() >= 2u);
      BOOST_TEST(lrs.size() <= 4u);
      BOOST_TEST(std::is_sorted(lrs.begin(), lrs.end()));
      BOOST_TEST(std::count(lrs.begin(), lrs.end(), 3e-3) == 1);
      BOOST_TEST(std::count(lrs.begin(), lrs.end(), 1e-2) == 1);
      BOOST_REQUIRE(n_chosen == 1u);
      BOOST_TEST(losses[chosen] == *std::min_element(losses.begin(), losses.end()));
      const bool at_edge = chosen == 0 || chosen + 1 == lrs.size();
      if (at_edge) BOOST_TEST(lrs.size() == 4u);
      // What a grid end scored when the sweep went past it.
      auto loss_at = [&](double lr) { return losses[std::find(lrs.begin(), lrs.end(), lr) - lrs.begin()]; };
      if (lrs.front() < 3e-3) BOOST_TEST(loss_at(3e-3) <= loss_at(1e-2));
      if (lrs.back() > 1e-2) BOOST_TEST(loss_at(1e-2) < loss_at(3e-3));
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_part_writes_its_files_and_the_verdicts) {
  fs::path out = fs::temp_directory_path() / fmt::format("tg_test_study_{}", ::getpid());
  fs::remove_all(out);
  auto [rc, log] = run(exe() + kTiny + " --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  for (const char* part : {"tuning", "cost", "recall", "gradients", "parallel", "verdicts"})
    BOOST_TEST(log.find(fmt::format("{}: done in", part)) != std::string::npos, part);

  // Part 1: a sweep row per model and rate tried, one chosen per model; curves every 10 steps.
  check_sweep(read_csv(out / "sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"}));
  auto curve = read_csv(out / "tuning.csv", {"model", "lr", "step", "tokens", "seconds", "train_loss", "val_loss", "dtype"});
  BOOST_TEST(curve.size() == 6u);
  for (auto& r : curve) {
    BOOST_TEST(r["dtype"] == "f32");
    BOOST_TEST(num(r, "tokens") == num(r, "step") * 4 * 16);
    BOOST_TEST(num(r, "seconds") > 0);
    BOOST_TEST(std::isfinite(num(r, "val_loss")));
  }
  for (auto& m : kModels) BOOST_TEST(fs::file_size(out / (m + ".safetensors")) > 1000u, m);
  BOOST_TEST(read_text(out / "samples.txt").find("=== gpt") != std::string::npos);

  // Part 2: per model and T, batches of 64 tokens; GPT's FLOPs per token grow with T, a
  // recurrence's do not; the prediction is anchored at the shortest T.
  auto cost = read_csv(out / "cost.csv", {"model", "T", "batch", "fwd_us_per_token", "bwd_us_per_token",
                                          "pred_fwd_us_per_token", "pred_bwd_us_per_token", "fwd_flops_per_token",
                                          "bwd_flops_per_token", "attention_flops_per_token", "fwd_mib", "step_mib",
                                          "ckpt_fwd_us_per_token", "ckpt_bwd_us_per_token", "ckpt_step_mib", "dtype"});
  BOOST_REQUIRE(cost.size() == 9u);
  for (size_t i = 0; i < cost.size(); i += 3) {
    const std::string m = cost[i]["model"];
    BOOST_TEST(cost[i]["T"] == "8");
    BOOST_TEST(num(cost[i], "pred_fwd_us_per_token") == num(cost[i], "fwd_us_per_token"),
               boost::test_tools::tolerance(1e-3));
    for (size_t j = i; j < i + 3; ++j) {
      BOOST_TEST(num(cost[j], "fwd_us_per_token") > 0);
      BOOST_TEST(num(cost[j], "batch") * num(cost[j], "T") == 64.0);  // a fixed token budget per batch
      BOOST_TEST(num(cost[j], "step_mib") > 0);
      BOOST_TEST(num(cost[j], "ckpt_fwd_us_per_token") > 0);
      BOOST_TEST(num(cost[j], "ckpt_step_mib") > 0);
    }
    if (m == "gpt") {
      BOOST_TEST(num(cost[i + 2], "fwd_flops_per_token") > num(cost[i], "fwd_flops_per_token"));
      BOOST_TEST(num(cost[i + 2], "attention_flops_per_token") == 4 * num(cost[i], "attention_flops_per_token"));
    } else {
      BOOST_TEST(num(cost[i + 2], "fwd_flops_per_token") == num(cost[i], "fwd_flops_per_token"));
      BOOST_TEST(num(cost[i], "attention_flops_per_token") == 0.0);
    }
  }

  // Part 3: distances 1, 2, 4, 8, 9 (3L/4), 11 (L-1) per model; its own learning-rate sweep;
  // the same 8 targets scored with 1, 2, 4, 8 and 16 characters of context.
  auto recall = read_csv(out / "recall.csv", {"model", "k", "accuracy", "tests", "chance", "dtype"});
  BOOST_TEST(recall.size() == 18u);
  std::set<std::string> ks;
  for (auto& r : recall) {
    ks.insert(r["k"]);
    BOOST_TEST((num(r, "accuracy") >= 0 && num(r, "accuracy") <= 1));
    BOOST_TEST(num(r, "chance") == 0.125);
  }
  BOOST_TEST((ks == std::set<std::string>{"1", "2", "4", "8", "9", "11"}));
  check_sweep(read_csv(out / "recall_sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"}));
  auto context = read_csv(out / "context.csv", {"model", "context", "val_loss", "targets"});
  BOOST_REQUIRE(context.size() == 15u);
  for (size_t i = 0; i < context.size(); ++i) {
    BOOST_TEST(num(context[i], "context") == double(1 << (i % 5)));
    BOOST_TEST(num(context[i], "targets") == 8.0);
    BOOST_TEST((num(context[i], "val_loss") > 0 && std::isfinite(num(context[i], "val_loss"))));
  }

  // Part 4: every distance 0..15, at init and trained; norms finite and positive.
  auto grads = read_csv(out / "gradients.csv", {"model", "state", "k", "grad_norm"});
  BOOST_TEST(grads.size() == 96u);
  for (auto& r : grads) BOOST_TEST((num(r, "grad_norm") > 0 && std::isfinite(num(r, "grad_norm"))));

  // Part 5: GPT's chain is the same at every T; a recurrence's grows by the added steps.
  auto steps = read_csv(out / "steps.csv", {"model", "T", "sequential_steps", "graph_nodes"});
  BOOST_REQUIRE(steps.size() == 9u);
  for (size_t i = 0; i < steps.size(); i += 3) {
    const double grow = num(steps[i + 2], "sequential_steps") - num(steps[i], "sequential_steps");
    BOOST_TEST(grow == (steps[i]["model"] == "gpt" ? 0.0 : 24.0), steps[i]["model"]);
  }
  auto tput = read_csv(out / "parallel.csv", {"model", "regime", "batch", "T", "threads", "tokens_per_s",
                                              "tokens_per_s_q1", "tokens_per_s_q3", "dtype"});
  BOOST_TEST(tput.size() == 12u);
  for (auto& r : tput) {
    BOOST_TEST(num(r, "tokens_per_s") > 0);
    BOOST_TEST(num(r, "tokens_per_s_q1") <= num(r, "tokens_per_s"));
    BOOST_TEST(num(r, "tokens_per_s") <= num(r, "tokens_per_s_q3"));
  }
  // A speedup per model and regime, from 3 pairs of steps, inside its quartiles.
  auto speedup = read_csv(out / "speedup.csv", {"model", "regime", "speedup", "speedup_q1", "speedup_q3", "pairs"});
  BOOST_TEST(speedup.size() == 6u);
  for (auto& r : speedup) {
    BOOST_TEST(num(r, "pairs") == 3.0);
    BOOST_TEST((num(r, "speedup_q1") <= num(r, "speedup") && num(r, "speedup") <= num(r, "speedup_q3")));
  }

  // Part 6: a verdict per claim, none missing its measurements.
  const std::string results = read_text(out / "results.md");
  BOOST_TEST(results.find("| claim") != std::string::npos);
  // Headed by when, where and from which commit it was measured (report::provenance).
  BOOST_TEST(results.find(" cores; commit ") != std::string::npos, results.substr(0, 300));
  for (const char* claim : {"long-range dependencies", "neither vanish nor explode", "fewer training steps",
                            "do not grow with sequence length", "O(n^2 d)"})
    BOOST_TEST(results.find(claim) != std::string::npos, claim);
  BOOST_TEST(results.find("not measured") == std::string::npos, results);
  BOOST_TEST(results.find("## 5. Parallelism") != std::string::npos);
  BOOST_TEST(read_csv(out / "times.csv", {"part", "seconds", "load_start", "load_end", "dtype"}).size() == 5u);
  BOOST_TEST(results.find("bfloat16") == std::string::npos);
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0)
    for (const char* png : {"loss.png", "cost.png", "recall.png", "context.png", "gradients.png", "parallel.png"})
      BOOST_TEST(fs::file_size(out / png) > 1000u, png);

  // A part that builds on part 1 says so when part 1's files are missing.
  fs::path empty = out / "empty";
  auto [rc2, log2] = run(exe() + kTiny + " --part gradients --out " + empty.string());
  BOOST_TEST(rc2 == 1);
  BOOST_TEST(log2.find("run --part tuning first") != std::string::npos, log2);
  fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(bf16_trains_and_times_under_autocast_and_says_so) {
  // --bf16: the parts that train or time (tuning, cost, recall, parallel)
  // record bf16 in their files and in part 1's checkpoints; gradients, which
  // only measures trained models, stays float32; the verdicts' time table and
  // each part's section name the precision.
  fs::path out = fs::temp_directory_path() / fmt::format("tg_test_study_bf16_{}", ::getpid());
  fs::remove_all(out);
  auto [rc, log] = run(exe() + kTiny + " --bf16 --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  BOOST_TEST(log.find("GEMMs in bfloat16") != std::string::npos, log);
  auto all_bf16 = [](const std::vector<std::map<std::string, std::string>>& rows) {
    return !rows.empty() && std::all_of(rows.begin(), rows.end(), [](auto& r) { return r.at("dtype") == "bf16"; });
  };
  BOOST_TEST(all_bf16(read_csv(out / "sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"})));
  auto curve = read_csv(out / "tuning.csv", {"model", "lr", "step", "tokens", "seconds", "train_loss", "val_loss", "dtype"});
  BOOST_TEST(all_bf16(curve));
  for (auto& r : curve) BOOST_TEST(std::isfinite(num(r, "val_loss")));
  BOOST_TEST(all_bf16(read_csv(out / "recall_sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"})));
  BOOST_TEST(all_bf16(read_csv(out / "cost.csv", {"model", "T", "batch", "fwd_us_per_token", "bwd_us_per_token",
                                                 "pred_fwd_us_per_token", "pred_bwd_us_per_token", "fwd_flops_per_token",
                                                 "bwd_flops_per_token", "attention_flops_per_token", "fwd_mib",
                                                 "step_mib", "ckpt_fwd_us_per_token", "ckpt_bwd_us_per_token",
                                                 "ckpt_step_mib", "dtype"})));
  BOOST_TEST(all_bf16(read_csv(out / "recall.csv", {"model", "k", "accuracy", "tests", "chance", "dtype"})));
  BOOST_TEST(all_bf16(read_csv(out / "parallel.csv", {"model", "regime", "batch", "T", "threads", "tokens_per_s",
                                                     "tokens_per_s_q1", "tokens_per_s_q3", "dtype"})));
  for (auto& m : kModels)
    BOOST_TEST(read_text(out / (m + ".safetensors")).find("\"gemm_dtype\":\"bf16\"") != std::string::npos, m);
  std::map<std::string, std::string> part_dtype;
  for (auto& r : read_csv(out / "times.csv", {"part", "seconds", "load_start", "load_end", "dtype"}))
    part_dtype[r["part"]] = r["dtype"];
  BOOST_TEST((part_dtype == std::map<std::string, std::string>{
                  {"tuning", "bf16"}, {"cost", "bf16"}, {"recall", "bf16"}, {"gradients", "f32"}, {"parallel", "bf16"}}));
  const std::string results = read_text(out / "results.md");
  BOOST_TEST(results.find("| tuning | ") != std::string::npos);
  BOOST_TEST(results.find("| bfloat16 (autocast) |") != std::string::npos, results);
  BOOST_TEST(results.find("training GEMMs in bfloat16 (autocast), float32 master weights") != std::string::npos);
  BOOST_TEST(results.find("not measured") == std::string::npos, results);
  fs::remove_all(out);
}

BOOST_AUTO_TEST_CASE(same_seed_threads_and_code_give_the_same_numbers) {
  // Every number that is not a time: two runs of the parts that train and
  // measure models (timings differ from run to run by nature, so the cost
  // and parallel parts and the seconds column are left out) must agree to
  // the last digit written. At 2 threads, so the pool's splits are exercised.
  std::string common = kTiny + " --part tuning recall gradients";
  common.replace(common.find("--threads 1"), 11, "--threads 2");
  std::vector<fs::path> outs;
  for (int run_no : {1, 2}) {
    outs.push_back(fs::temp_directory_path() / fmt::format("tg_test_study_repro{}_{}", run_no, ::getpid()));
    fs::remove_all(outs.back());
    auto [rc, log] = run(exe() + common + " --out " + outs.back().string());
    BOOST_REQUIRE_MESSAGE(rc == 0, log);
  }
  // The file's text with the named columns removed.
  auto without = [](const fs::path& p, const std::set<std::string>& drop) {
    std::istringstream in(read_text(p));
    std::string line, kept;
    std::vector<bool> keep;
    while (std::getline(in, line)) {
      std::stringstream ls(line);
      size_t i = 0;
      for (std::string cell; std::getline(ls, cell, ','); ++i) {
        if (keep.size() <= i) keep.push_back(!drop.count(cell));  // the header line decides
        if (keep[i]) kept += cell + ",";
      }
      kept += "\n";
    }
    return kept;
  };
  for (const char* file : {"sweep.csv", "tuning.csv", "recall_sweep.csv", "recall.csv", "context.csv", "gradients.csv"}) {
    const std::string a = without(outs[0] / file, {"seconds"}), b = without(outs[1] / file, {"seconds"});
    BOOST_TEST(!a.empty(), file);
    BOOST_TEST(a == b, file);
  }
  for (auto& o : outs) fs::remove_all(o);
}
