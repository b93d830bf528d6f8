// The main job's study end to end at a tiny size (seconds): every part runs
// and writes what it promises — CSV files with their columns and one row per
// model and setting, numbers that obey what each part measures (FLOPs grow
// with T for GPT only, a recurrence's sequential steps grow by exactly the
// added length), every model trained from 3 seeds, the scale part's sizes,
// fits and precision check, the verdict table with a row per claim, and the
// plots; and the power-law fits on synthetic data. The executable's path
// comes from meson (env STUDY).
#define BOOST_TEST_MODULE study
#include <boost/test/unit_test.hpp>

#include "programs.h"
#include "examples/study/fit.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <regex>
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
    " --cost-lengths 8,16,32 --cost-tokens 64 --cost-reps 3 --recall-length 12 --recall-steps 10 --recall-batch 8"
    " --recall-tests 20 --context-batches 2 --grad-batch 2 --parallel-steps 3"
    " --scale-dims 8,16,32 --tokens-per-param 0.5,1";

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

// scripts/study_schedule.py rebuilds the scale part's rounds from out's
// scale.csv and deals them over `ranks` ranks as the study does: as many runs
// in each round as the study's log says it ran on that many ranks.
void check_schedule_replay(const fs::path& out, const std::string& log, int ranks) {
  std::string rounds;
  const std::regex round_line(R"(scale: round \d+: (\d+) sweep runs, (\d+) training runs)");
  for (std::sregex_iterator it(log.begin(), log.end(), round_line), end; it != end; ++it)
    rounds += fmt::format("{}{}", rounds.empty() ? "" : ", ", std::stoi((*it)[1]) + std::stoi((*it)[2]));
  BOOST_TEST(std::count(rounds.begin(), rounds.end(), ',') >= 2, log);  // the sweeps went past the grid
  auto [rc, replay] = run(fmt::format("python3 scripts/study_schedule.py {} --lrs 3e-3,1e-2 --ranks {}", out.string(),
                                      ranks));
  BOOST_REQUIRE_MESSAGE(rc == 0, replay);
  BOOST_TEST(std::regex_search(replay, std::regex(fmt::format(R"(\n\| {} \|[^\n]*\| {} \|\n)", ranks, rounds))),
             replay << "\nthe log's rounds: " << rounds);
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_part_writes_its_files_and_the_verdicts) {
  fs::path out = fs::temp_directory_path() / fmt::format("tg_test_study_{}", ::getpid());
  fs::remove_all(out);
  auto [rc, log] = run(exe() + kTiny + " --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  for (const char* part : {"tuning", "cost", "recall", "gradients", "parallel", "scale", "verdicts"})
    BOOST_TEST(log.find(fmt::format("{}: done in", part)) != std::string::npos, part);

  // Part 1: a sweep row per model and rate tried, one chosen per model; curves every 10 steps, from the
  // default 3 seeds (1337, 2337, 3337) at the chosen rate.
  check_sweep(read_csv(out / "sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"}));
  auto curve = read_csv(out / "tuning.csv",
                        {"model", "seed", "lr", "step", "tokens", "seconds", "train_loss", "val_loss", "dtype"});
  BOOST_TEST(curve.size() == 18u);
  std::map<std::string, std::set<std::string>> seeds_of;
  for (auto& r : curve) seeds_of[r["model"]].insert(r["seed"]);
  for (auto& m : kModels) BOOST_TEST((seeds_of[m] == std::set<std::string>{"1337", "2337", "3337"}), m);
  for (auto& r : curve) {
    BOOST_TEST(r["dtype"] == "f32");
    BOOST_TEST(num(r, "tokens") == num(r, "step") * 4 * 16);
    BOOST_TEST(num(r, "seconds") > 0);
    BOOST_TEST(std::isfinite(num(r, "val_loss")));
  }
  for (auto& m : kModels)
    for (int i = 0; i < 3; ++i) BOOST_TEST(fs::file_size(out / fmt::format("{}.seed{}.safetensors", m, i)) > 1000u, m);
  // The seeds differ: three different final losses per model.
  for (auto& m : kModels) {
    std::set<std::string> finals;
    for (auto& r : curve)
      if (r["model"] == m && r["step"] == "20") finals.insert(r["val_loss"]);
    BOOST_TEST(finals.size() == 3u, m);
  }
  BOOST_TEST(read_text(out / "samples.txt").find("=== gpt") != std::string::npos);

  // Part 2: per model and T, batches of 64 tokens; GPT's FLOPs per token grow with T, a
  // recurrence's do not; the prediction is anchored at the shortest T.
  auto cost = read_csv(out / "cost.csv", {"model", "T", "batch", "fwd_us_per_token", "bwd_us_per_token",
                                          "pred_fwd_us_per_token", "pred_bwd_us_per_token", "step_us_q1", "step_us_q3",
                                          "fwd_flops_per_token", "bwd_flops_per_token", "attention_flops_per_token", "fwd_mib", "step_mib",
                                          "ckpt_fwd_us_per_token", "ckpt_bwd_us_per_token", "ckpt_step_mib", "dtype"});
  BOOST_REQUIRE(cost.size() == 9u);
  for (size_t i = 0; i < cost.size(); i += 3) {
    const std::string m = cost[i]["model"];
    BOOST_TEST(cost[i]["T"] == "8");
    BOOST_TEST(num(cost[i], "pred_fwd_us_per_token") == num(cost[i], "fwd_us_per_token"),
               boost::test_tools::tolerance(1e-3));
    for (size_t j = i; j < i + 3; ++j) {
      BOOST_TEST(num(cost[j], "fwd_us_per_token") > 0);
      BOOST_TEST(num(cost[j], "step_us_q1") > 0);  // the quartiles of 3 repetitions
      BOOST_TEST(num(cost[j], "step_us_q1") <= num(cost[j], "step_us_q3"));
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

  // Part 3: distances 1, 2, 4, 8, 9 (3L/4), 11 (L-1) per model and seed; its own learning-rate sweep;
  // the same 8 targets scored with 1, 2, 4, 8 and 16 characters of context by each seed's model.
  auto recall = read_csv(out / "recall.csv", {"model", "seed", "k", "accuracy", "tests", "chance", "dtype"});
  BOOST_TEST(recall.size() == 54u);
  std::set<std::string> ks;
  for (auto& r : recall) {
    ks.insert(r["k"]);
    BOOST_TEST((num(r, "accuracy") >= 0 && num(r, "accuracy") <= 1));
    BOOST_TEST(num(r, "chance") == 0.125);
  }
  BOOST_TEST((ks == std::set<std::string>{"1", "2", "4", "8", "9", "11"}));
  check_sweep(read_csv(out / "recall_sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"}));
  auto context = read_csv(out / "context.csv", {"model", "seed", "context", "val_loss", "targets"});
  BOOST_REQUIRE(context.size() == 45u);
  for (size_t i = 0; i < context.size(); ++i) {
    BOOST_TEST(num(context[i], "context") == double(1 << (i % 5)));
    BOOST_TEST(num(context[i], "targets") == 8.0);
    BOOST_TEST((num(context[i], "val_loss") > 0 && std::isfinite(num(context[i], "val_loss"))));
  }

  // Part 4: every distance 0..15, at init and trained, per seed; norms finite and positive.
  auto grads = read_csv(out / "gradients.csv", {"model", "seed", "state", "k", "grad_norm"});
  BOOST_TEST(grads.size() == 288u);
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

  // Part scale: widths 8, 16 of 8, 16, 32 run (the default: two sizes) at budgets 0.5 and 1 token per
  // parameter, 3 seeds each; the smallest also in bfloat16 (role check, outside the fits); parameters
  // matched across models, growing about 4x, with tokens and counted FLOPs; per model and size a sweep of
  // 2 to 6 rates whose best trains every budget; a fit per model, budget and axis over 6 points.
  auto scale = read_csv(out / "scale.csv", {"model", "size", "gpt_dim", "params", "tokens_per_param", "tokens", "steps",
                                            "train_flops", "seed", "lr", "dtype", "role", "val_loss", "seconds"});
  std::map<std::string, std::map<std::string, double>> params, flops;  // size -> model, at budget 1
  std::map<std::string, std::map<double, double>> sweep_loss;          // model/size -> lr -> loss
  std::map<std::string, std::set<double>> trained_lr;                  // model/size -> rates of its fit runs
  std::map<std::string, int> per_role;
  for (auto& r : scale) {
    ++per_role[r["role"]];
    BOOST_TEST((r["size"] == "1" || r["size"] == "2"));
    BOOST_TEST(r["dtype"] == (r["role"] == "check" ? "bf16" : "f32"));
    if (r["role"] == "check") BOOST_TEST(r["size"] == "1");
    BOOST_TEST(num(r, "tokens") == num(r, "steps") * 64);
    const std::string key = r["model"] + "/" + r["size"];
    if (r["role"] == "sweep") {
      sweep_loss[key][num(r, "lr")] = std::isfinite(num(r, "val_loss")) ? num(r, "val_loss") : INFINITY;
      continue;
    }
    BOOST_TEST((num(r, "val_loss") > 0 && std::isfinite(num(r, "val_loss"))));
    BOOST_TEST((r["tokens_per_param"] == "0.5" || r["tokens_per_param"] == "1"));
    if (r["role"] == "fit") trained_lr[key].insert(num(r, "lr"));
    if (r["tokens_per_param"] == "1") {
      params[r["size"]][r["model"]] = num(r, "params");
      flops[r["size"]][r["model"]] = num(r, "train_flops");
    }
  }
  BOOST_TEST(per_role["fit"] == 36);    // 3 models x 2 sizes x 2 budgets x 3 seeds
  BOOST_TEST(per_role["check"] == 18);  // the smallest size's
  BOOST_TEST(sweep_loss.size() == 6u);
  for (auto& [key, by_lr] : sweep_loss) {
    BOOST_TEST_CONTEXT(key) {
      BOOST_TEST((by_lr.size() >= 2u && by_lr.size() <= 6u));
      BOOST_TEST(by_lr.count(3e-3) == 1u);
      BOOST_TEST(by_lr.count(1e-2) == 1u);
      const auto best = std::min_element(by_lr.begin(), by_lr.end(), [](auto& x, auto& y) { return x.second < y.second; });
      BOOST_TEST(trained_lr[key] == std::set<double>{best->first});
    }
  }
  for (auto& m : kModels) {
    BOOST_TEST(std::fabs(params["1"][m] / params["1"]["gpt"] - 1) < 0.1, m);  // matched to GPT
    BOOST_TEST((params["2"][m] / params["1"][m] > 2.5 && params["2"][m] / params["1"][m] < 4.5), m);
    BOOST_TEST(flops["2"][m] > 4 * flops["1"][m], m);  // more FLOPs per step and more steps
  }
  auto fits = read_csv(out / "scale_fit.csv", {"model", "tokens_per_param", "axis", "exponent", "exponent_se",
                                               "log10_loss_at_mean", "log10_loss_at_mean_se", "log10_x_mean", "points"});
  BOOST_TEST(fits.size() == 12u);
  for (auto& r : fits) {
    BOOST_TEST(num(r, "points") == 6.0);
    BOOST_TEST((std::isfinite(num(r, "exponent")) && num(r, "exponent_se") >= 0));
  }
  // The gaps: GPT minus each recurrence at each size and budget, from the 3 seeds' paired differences.
  auto gaps = read_csv(out / "scale_gap.csv", {"model", "size", "params", "tokens_per_param", "seeds", "gap_mean",
                                               "gap_lo", "gap_hi", "spread_borrowed"});
  BOOST_TEST(gaps.size() == 8u);
  for (auto& r : gaps) {
    BOOST_TEST(r["model"] != "gpt");
    BOOST_TEST(num(r, "seeds") == 3.0);
    BOOST_TEST((num(r, "gap_lo") <= num(r, "gap_mean") && num(r, "gap_mean") <= num(r, "gap_hi")));
  }
  // Each fit run's curve: its evaluations in order, the last one the loss scale.csv gives.
  auto curves = read_csv(out / "scale_curves.csv", {"model", "size", "params", "tokens_per_param", "seed", "step",
                                                    "tokens", "val_loss"});
  std::map<std::string, std::vector<std::pair<double, double>>> run_curve;  // run -> (tokens, loss)
  for (auto& r : curves)
    run_curve[r["model"] + r["size"] + "/" + r["tokens_per_param"] + "/" + r["seed"]].push_back({num(r, "tokens"),
                                                                                             num(r, "val_loss")});
  BOOST_TEST(run_curve.size() == 36u);
  for (auto& r : scale)
    if (r["role"] == "fit") {
      const auto& c = run_curve[r["model"] + r["size"] + "/" + r["tokens_per_param"] + "/" + r["seed"]];
      BOOST_REQUIRE(c.size() >= 2u);
      BOOST_TEST(std::is_sorted(c.begin(), c.end()));
      BOOST_TEST(c.back().first == num(r, "tokens"));
      BOOST_TEST(std::fabs(c.back().second - num(r, "val_loss")) < 1e-6);
    }
  // Context at each size: every fit run at the largest budget scored at
  // block/8 and block characters (block 16 here: 2 and 16).
  auto ctx = read_csv(out / "scale_context.csv", {"model", "size", "params", "tokens_per_param", "seed", "dtype",
                                                  "context", "val_loss", "targets"});
  BOOST_TEST(ctx.size() == 2 * 18u);
  std::map<std::string, int> per_context;
  for (auto& r : ctx) {
    ++per_context[r["context"]];
    BOOST_TEST((num(r, "val_loss") > 0 && std::isfinite(num(r, "val_loss"))));
  }
  BOOST_TEST(per_context.size() == 2u);
  const std::string scale_md = read_text(out / "scale.md");
  BOOST_TEST(scale_md.find("agree within the seed spread") != std::string::npos, scale_md);
  BOOST_TEST(scale_md.find("Estimated time of this part with all 3 sizes (`--scale-sizes 3`)") != std::string::npos);
  check_schedule_replay(out, log, 1);

  // Part 7: a verdict per claim, none missing its measurements.
  const std::string results = read_text(out / "results.md");
  BOOST_TEST(results.find("| claim") != std::string::npos);
  // Headed by when, where and from which commit it was measured (report::provenance).
  BOOST_TEST(results.find(" cores; commit ") != std::string::npos, results.substr(0, 300));
  for (const char* claim : {"long-range dependencies", "neither vanish nor explode", "fewer training steps",
                            "do not grow with sequence length", "O(n^2 d)", "falls faster with parameters",
                            "puts long context to more use"})
    BOOST_TEST(results.find(claim) != std::string::npos, claim);
  BOOST_TEST(results.find("not measured") == std::string::npos, results);
  BOOST_TEST(results.find("## 5. Parallelism") != std::string::npos);
  BOOST_TEST(read_csv(out / "times.csv", {"part", "seconds", "load_start", "load_end", "dtype"}).size() == 6u);
  BOOST_TEST(results.find("| bfloat16 (autocast) |") == std::string::npos);  // only the scale part's check is
  if (std::system("command -v gnuplot >/dev/null 2>&1") == 0)
    for (const char* png : {"loss.png", "cost.png", "recall.png", "context.png", "gradients.png", "parallel.png",
                            "scale.png", "scale_gap.png"})
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
  // One seed: what is checked here is the precision each file names.
  auto [rc, log] = run(exe() + kTiny + " --bf16 --seeds 1 --out " + out.string());
  BOOST_REQUIRE_MESSAGE(rc == 0, log);
  BOOST_TEST(log.find("GEMMs in bfloat16") != std::string::npos, log);
  auto all_bf16 = [](const std::vector<std::map<std::string, std::string>>& rows) {
    return !rows.empty() && std::all_of(rows.begin(), rows.end(), [](auto& r) { return r.at("dtype") == "bf16"; });
  };
  BOOST_TEST(all_bf16(read_csv(out / "sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"})));
  auto curve = read_csv(out / "tuning.csv",
                        {"model", "seed", "lr", "step", "tokens", "seconds", "train_loss", "val_loss", "dtype"});
  BOOST_TEST(all_bf16(curve));
  for (auto& r : curve) BOOST_TEST(std::isfinite(num(r, "val_loss")));
  BOOST_TEST(all_bf16(read_csv(out / "recall_sweep.csv", {"model", "lr", "steps", "val_loss", "chosen", "dtype"})));
  BOOST_TEST(all_bf16(read_csv(out / "cost.csv", {"model", "T", "batch", "fwd_us_per_token", "bwd_us_per_token",
                                                 "pred_fwd_us_per_token", "pred_bwd_us_per_token", "step_us_q1",
                                                 "step_us_q3", "fwd_flops_per_token", "bwd_flops_per_token",
                                                 "attention_flops_per_token", "fwd_mib",
                                                 "step_mib", "ckpt_fwd_us_per_token", "ckpt_bwd_us_per_token",
                                                 "ckpt_step_mib", "dtype"})));
  BOOST_TEST(all_bf16(read_csv(out / "recall.csv", {"model", "seed", "k", "accuracy", "tests", "chance", "dtype"})));
  BOOST_TEST(all_bf16(read_csv(out / "parallel.csv", {"model", "regime", "batch", "T", "threads", "tokens_per_s",
                                                     "tokens_per_s_q1", "tokens_per_s_q3", "dtype"})));
  for (auto& m : kModels)
    BOOST_TEST(read_text(out / (m + ".seed0.safetensors")).find("\"gemm_dtype\":\"bf16\"") != std::string::npos, m);
  std::map<std::string, std::string> part_dtype;
  for (auto& r : read_csv(out / "times.csv", {"part", "seconds", "load_start", "load_end", "dtype"}))
    part_dtype[r["part"]] = r["dtype"];
  BOOST_TEST((part_dtype == std::map<std::string, std::string>{
                  {"tuning", "bf16"}, {"cost", "bf16"}, {"recall", "bf16"}, {"gradients", "f32"}, {"parallel", "bf16"},
                  {"scale", "mixed"}}));
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
  std::string common = kTiny + " --part tuning recall gradients scale --seeds 2";
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
  for (const char* file : {"sweep.csv", "tuning.csv", "recall_sweep.csv", "recall.csv", "context.csv", "gradients.csv",
                           "scale.csv", "scale_context.csv", "scale_fit.csv", "scale_gap.csv", "scale_curves.csv"}) {
    const std::string a = without(outs[0] / file, {"seconds"}), b = without(outs[1] / file, {"seconds"});
    BOOST_TEST(!a.empty(), file);
    BOOST_TEST(a == b, file);
  }
  for (auto& o : outs) fs::remove_all(o);
}

// The scale part over 2 MPI ranks: every run's rows as one process writes
// them (all but the seconds), gathered into one set of files by rank 0. Run
// only by the test "study_mpi" (MPI builds with mpirun), which names it.
BOOST_AUTO_TEST_CASE(scale_over_mpi_ranks_matches_one_process, *boost::unit_test::disabled()) {
  const char* mpirun = std::getenv("MPIRUN");
  BOOST_REQUIRE_MESSAGE(mpirun && *mpirun, "MPIRUN is not set: run this case through meson's study_mpi test");
  const fs::path one = fs::temp_directory_path() / fmt::format("tg_test_study_one_{}", ::getpid());
  const fs::path two = fs::temp_directory_path() / fmt::format("tg_test_study_ranks_{}", ::getpid());
  fs::remove_all(one), fs::remove_all(two);
  // Sweeps at the largest budget: on 2 ranks, some training runs then fit beside a later round's sweeps.
  const std::string config = kTiny + " --scale-sweep-fraction 1";
  auto [rc1, log1] = run(exe() + config + " --part tuning scale --out " + one.string());
  BOOST_REQUIRE_MESSAGE(rc1 == 0, log1);
  // Part 1's files, which the scale part reads on rank 0.
  fs::create_directories(two);
  for (const char* f : {"tokenizer.json", "sweep.csv"}) fs::copy_file(one / f, two / f);
  auto [rc2, log2] = run(fmt::format("{} -np 2 --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism "
                                     "none{} {}{} --part scale --out {}",
                                     mpirun, ::geteuid() == 0 ? " --allow-run-as-root" : "", exe(), config,
                                     two.string()));
  BOOST_REQUIRE_MESSAGE(rc2 == 0, log2);
  BOOST_TEST(log2.find("2 rank(s)") != std::string::npos, log2);
  BOOST_TEST(read_text(two / "scale.md").find("on 2 MPI ranks") != std::string::npos);
  check_schedule_replay(one, log1, 1);
  check_schedule_replay(two, log2, 2);
  BOOST_TEST(std::regex_search(log2, std::regex(R"(scale: round \d+: [1-9]\d* sweep runs, [1-9]\d* training runs)")),
             log2);
  for (const char* file : {"scale.csv", "scale_context.csv", "scale_curves.csv", "scale_gap.csv", "scale_fit.csv"}) {
    // Rows without their last column where that is the seconds.
    auto rows = [&](const fs::path& p) {
      std::istringstream in(read_text(p));
      std::string line, out;
      while (std::getline(in, line)) out += (std::string(file) == "scale.csv" ? line.substr(0, line.rfind(',')) : line) + "\n";
      return out;
    };
    const std::string a = rows(one / file), b = rows(two / file);
    BOOST_TEST(a.size() > 100u, file);
    BOOST_TEST(a == b, file);
  }
  fs::remove_all(one), fs::remove_all(two);
}

// The fit code on synthetic power laws (examples/study/fit.h).
using tg::study::fit_power_law, tg::study::meeting, tg::study::compare, tg::study::Order;

BOOST_AUTO_TEST_CASE(power_law_fit_recovers_exponent_and_error) {
  // Exact data: L = 5 N^-0.3 at four sizes, three copies each; the fit is exact and its error 0.
  std::vector<double> n, l;
  for (double x : {1e5, 4e5, 1.6e6, 6.4e6})
    for (int i = 0; i < 3; ++i) n.push_back(x), l.push_back(5 * std::pow(x, -0.3));
  auto p = fit_power_law(n, l);
  BOOST_TEST(p.b == -0.3, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(p.at(1e6) == 5 * std::pow(1e6, -0.3), boost::test_tools::tolerance(1e-12));
  BOOST_TEST(p.se_b < 1e-12);
  // Multiplicative noise of known size (log10 sd 0.01, a fixed pseudo-random sequence): the
  // standard error is what least squares says, sigma / sqrt(Sxx), within 40 %, and the exponent
  // is within 3 of it of the truth.
  uint64_t state = 12345;
  auto gauss = [&] {  // Box-Muller on a 64-bit LCG
    auto u = [&] { state = state * 6364136223846793005ULL + 1442695040888963407ULL; return ((state >> 11) + 0.5) / 9007199254740992.0; };
    return std::sqrt(-2 * std::log(u())) * std::cos(2 * M_PI * u());
  };
  std::vector<double> nn, ln;
  double sxx = 0, mean = 0;
  for (int i = 0; i < 200; ++i) nn.push_back(std::pow(10.0, 5 + 2.0 * (i % 20) / 19));
  for (double x : nn) mean += std::log10(x) / nn.size();
  for (double x : nn) sxx += std::pow(std::log10(x) - mean, 2), ln.push_back(2 * std::pow(x, -0.1) * std::pow(10.0, 0.01 * gauss()));
  auto q = fit_power_law(nn, ln);
  BOOST_TEST(std::fabs(q.b + 0.1) < 3 * q.se_b);
  BOOST_TEST(q.se_b == 0.01 / std::sqrt(sxx), boost::test_tools::tolerance(0.4));
  // A wrong exponent would not pass: the truth is far outside another law's error.
  BOOST_TEST(std::fabs(q.b + 0.2) > 10 * q.se_b);
  BOOST_CHECK_THROW(fit_power_law({1e5, 1e5}, {1.0, 2.0}), std::invalid_argument);
  BOOST_CHECK_THROW(fit_power_law({1e5, -1}, {1.0, 2.0}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(meeting_of_two_laws_is_where_they_are_equal) {
  // L1 = 4 N^-0.2 and L2 = 2 N^-0.1 meet where N^0.1 = 2: N = 2^10 = 1024.
  std::vector<double> n = {1e2, 1e3, 1e4, 1e5}, a, b;
  for (double x : n) a.push_back(4 * std::pow(x, -0.2)), b.push_back(2 * std::pow(x, -0.1));
  auto m = meeting(fit_power_law(n, a), fit_power_law(n, b));
  BOOST_REQUIRE(m.has_value());
  BOOST_TEST(m->log10x == std::log10(1024.0), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(m->se < 1e-9);  // exact data: no uncertainty
  // Noise in one law's exponent: the meeting's error grows with it.
  std::vector<double> noisy = a;
  noisy[0] *= 1.05, noisy[3] *= 1.05, noisy[1] /= 1.05, noisy[2] /= 1.05;
  auto m2 = meeting(fit_power_law(n, noisy), fit_power_law(n, b));
  BOOST_REQUIRE(m2.has_value());
  BOOST_TEST(m2->se > 0.01);
  BOOST_TEST(std::fabs(m2->log10x - std::log10(1024.0)) < 3 * m2->se);
  // Parallel laws never meet.
  std::vector<double> c;
  for (double x : n) c.push_back(3 * std::pow(x, -0.1));
  BOOST_TEST(!meeting(fit_power_law(n, b), fit_power_law(n, c)).has_value());
}

BOOST_AUTO_TEST_CASE(compare_needs_the_seed_ranges_apart) {
  BOOST_TEST((compare({1.0, 1.1, 1.2}, {1.3, 1.4}, false) == Order::better));  // lower loss, no overlap
  BOOST_TEST((compare({1.0, 1.1, 1.2}, {1.3, 1.4}, true) == Order::worse));
  BOOST_TEST((compare({1.0, 1.35}, {1.3, 1.4}, false) == Order::level));      // the ranges meet
  BOOST_TEST((compare({0.9}, {0.5}, true) == Order::better));
}
