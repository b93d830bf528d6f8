// Part 6, verdicts: each claim against what the other parts wrote (read back
// from their CSV files, so a verdict can be re-derived by hand), one table,
// printed and written to results.md with every part's section.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <sstream>

#include <fmt/format.h>

#include "data/tokenizer.h"
#include "examples/study/study.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

struct Verdict {
  std::string measured, verdict;
};

// model -> (x, y) of the rows of csv whose `filter` column equals value (all rows if filter is empty).
std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> by_model(
    const Csv& csv, const std::string& x, const std::string& y, const std::string& filter = "",
    const std::string& value = "") {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> out;
  for (size_t r = 0; r < csv.size(); ++r) {
    if (!filter.empty() && csv.str(r, filter) != value) continue;
    auto& [xs, ys] = out[csv.str(r, "model")];
    xs.push_back(csv.num(r, x));
    ys.push_back(csv.num(r, y));
  }
  return out;
}

using XY = std::pair<std::vector<double>, std::vector<double>>;

// model -> seed -> (x, y) of the rows of csv whose `filter` column equals value (all rows if filter is empty).
std::map<std::string, std::map<std::string, XY>> by_model_seed(const Csv& csv, const std::string& x,
                                                                const std::string& y, const std::string& filter = "",
                                                                const std::string& value = "") {
  std::map<std::string, std::map<std::string, XY>> out;
  for (size_t r = 0; r < csv.size(); ++r) {
    if (!filter.empty() && csv.str(r, filter) != value) continue;
    auto& [xs, ys] = out[csv.str(r, "model")][csv.str(r, "seed")];
    xs.push_back(csv.num(r, x));
    ys.push_back(csv.num(r, y));
  }
  return out;
}

// f of every seed's (x, y).
template <class F>
std::vector<double> per_seed(const std::map<std::string, XY>& seeds, F f) {
  std::vector<double> out;
  for (const auto& [seed, xy] : seeds) out.push_back(f(xy));
  return out;
}

// "1.00 (0.98-1.00)": a per-seed value's mean and range.
std::string mean_range(const std::vector<double>& v, int digits) { return format_range(range_of(v), digits); }

// The recurrent models among those measured, in the configured order.
std::vector<std::string> recurrent(const Config& c) {
  std::vector<std::string> out;
  for (const auto& m : c.models)
    if (m != "gpt") out.push_back(m);
  return out;
}

// Part 1's training budget in tokens per GPT parameter: what the verdicts
// judged on part 1's models hold at.
std::string part1_budget(const Study& s) {
  const auto tok = data::load_tokenizer(from_tuning(s, "tokenizer.json"));
  const double params =
      static_cast<double>(make_model(s.c, "gpt", tok->vocab_size(), s.c.block, s.c.seed)->num_parameters());
  return fmt::format("{:.2g} tokens per parameter", static_cast<double>(s.c.steps * s.c.batch * s.c.block) / params);
}

// Joins how GPT's per-seed values compare with each recurrent model's
// (compare(): the min-max ranges over the seeds) into one verdict: "holds",
// "does not hold", "not distinguishable at this budget", or per model when
// they differ.
std::string judge(const std::vector<std::string>& rec, const std::vector<Order>& orders) {
  std::vector<std::string> better, worse, level;
  for (size_t i = 0; i < rec.size(); ++i)
    (orders[i] == Order::better ? better : orders[i] == Order::worse ? worse : level).push_back(rec[i]);
  if (better.size() == rec.size()) return "holds";
  if (worse.size() == rec.size()) return "does not hold";
  if (level.size() == rec.size()) return "not distinguishable at this budget";
  std::vector<std::string> parts;
  if (!better.empty()) parts.push_back(fmt::format("holds against the {}", fmt::join(better, " and ")));
  if (!worse.empty()) parts.push_back(fmt::format("does not hold against the {}", fmt::join(worse, " and ")));
  if (!level.empty())
    parts.push_back(fmt::format("not distinguishable from the {} at this budget", fmt::join(level, " and ")));
  return fmt::format("{}", fmt::join(parts, "; "));
}

// Joins how GPT compares with each recurrent model into one verdict: every
// comparison `better` -> "holds", none -> `otherwise`, a mix names who.
std::string combine(const std::vector<std::string>& rec, const std::vector<bool>& better, const std::string& otherwise) {
  std::vector<std::string> yes, no;
  for (size_t i = 0; i < rec.size(); ++i) (better[i] ? yes : no).push_back(rec[i]);
  if (no.empty()) return "holds";
  if (yes.empty()) return otherwise;
  return fmt::format("holds against the {}, not the {}", fmt::join(yes, " and "), fmt::join(no, " and "));
}

double mean_between(const std::vector<double>& v, size_t begin, size_t end) {
  double s = 0;
  for (size_t i = begin; i < end; ++i) s += v[i];
  return s / static_cast<double>(end - begin);
}

Verdict long_range(const Study& s) {
  Verdict v;
  const Csv recall(s.path("recall.csv")), context(s.path("context.csv"));
  auto acc = by_model_seed(recall, "k", "accuracy");
  auto loss = by_model_seed(context, "context", "val_loss");
  const auto rec = recurrent(s.c);
  const double chance = recall.num(0, "chance");
  // Recall: accuracy at the farthest distance tested, per seed; a model whose
  // mean accuracy at the nearest distance is within 0.1 of chance did not
  // learn the task at all, which says nothing about range.
  auto near_acc = [&](const std::string& m) { return per_seed(acc.at(m), [](const XY& xy) { return xy.second.front(); }); };
  auto far_acc = [&](const std::string& m) { return per_seed(acc.at(m), [](const XY& xy) { return xy.second.back(); }); };
  auto learned = [&](const std::string& m) { return range_of(near_acc(m)).mean > chance + 0.1; };
  const XY& gpt_k = acc.at("gpt").begin()->second;
  const double k_near = gpt_k.first.front(), k_far = gpt_k.first.back();
  // Text: what the context from block/16 to block characters is worth, on the same targets, per seed.
  const std::vector<double>& ts = loss.at("gpt").begin()->second.first;
  size_t from = 0;
  while (from + 1 < ts.size() && ts[from + 1] <= std::max(1.0, ts.back() / 16)) ++from;
  auto gain = [&](const std::string& m) {
    return per_seed(loss.at(m), [&](const XY& xy) { return xy.second[from] - xy.second.back(); });
  };
  std::vector<std::string> learnt, not_learnt;
  std::vector<Order> recalls, gains;
  v.measured = fmt::format("recall accuracy at k = {:.0f} / {:.0f} (chance {:.3f}): gpt {} / {}", k_near, k_far,
                           chance, mean_range(near_acc("gpt"), 2), mean_range(far_acc("gpt"), 2));
  for (const auto& m : rec) {
    v.measured += fmt::format(", {} {} / {}", m, mean_range(near_acc(m), 2), mean_range(far_acc(m), 2));
    if (!learned(m)) {
      not_learnt.push_back(m);
      continue;
    }
    learnt.push_back(m);
    recalls.push_back(compare(far_acc("gpt"), far_acc(m), true));
  }
  v.measured += fmt::format("; on text, loss gained by {:.0f} instead of {:.0f} characters of context: gpt {}",
                            ts.back(), ts[from], mean_range(gain("gpt"), 3));
  for (const auto& m : rec) {
    v.measured += fmt::format(", {} {}", m, mean_range(gain(m), 3));
    gains.push_back(compare(gain("gpt"), gain(m), true));
  }
  v.measured += " nats/char";
  std::string a;
  if (!learned("gpt"))
    a = "undecided (GPT did not learn the task)";
  else if (learnt.empty())
    a = "undecided (no recurrent model learned the task)";
  else {
    a = judge(learnt, recalls);
    if (!not_learnt.empty()) a = fmt::format("against the {}: {}", fmt::join(learnt, " and "), a);
  }
  if (!not_learnt.empty())
    a += fmt::format(" (the {} learned it at no distance, not even k = {:.0f})", fmt::join(not_learnt, " and "), k_near);
  const std::string b = judge(rec, gains);
  v.verdict = a == b ? a + " (recall and text agree)" : fmt::format("recall: {}; text: {}", a, b);
  return v;
}

Verdict gradients(const Study& s) {
  Verdict v;
  const Csv csv(s.path("gradients.csv"));
  const auto rec = recurrent(s.c);
  std::map<std::string, std::map<std::string, std::map<std::string, XY>>> g;  // state -> model -> seed
  for (const std::string state : {"init", "trained"}) g[state] = by_model_seed(csv, "k", "grad_norm", "state", state);
  // Per seed, log10 of the mean over the last quarter of distances over the mean over k = 1..4 (as part 4's table).
  auto log_far_near = [&](const std::string& m, const std::string& state) {
    return per_seed(g.at(state).at(m), [](const XY& xy) {
      const auto& y = xy.second;
      const size_t T = y.size();
      return std::log10(mean_between(y, T - T / 4, T) / mean_between(y, 1, std::min<size_t>(5, T)));
    });
  };
  // Some seed's gradient somewhere beyond k = 0 above ten times its near mean.
  auto explodes = [&](const std::string& m, const std::string& state) {
    for (const double grows : per_seed(g.at(state).at(m), [](const XY& xy) {
           const auto& y = xy.second;
           const double near = mean_between(y, 1, std::min<size_t>(5, y.size()));
           for (size_t k = 1; k < y.size(); ++k)
             if (y[k] > 10 * near) return 1.0;
           return 0.0;
         }))
      if (grows > 0) return true;
    return false;
  };
  // -inf (far gradients exactly 0 in float32) in any seed: said in words.
  auto cell = [&](const std::string& m, const std::string& state) {
    const std::vector<double> d = log_far_near(m, state);
    const Range r = range_of(d);
    if (std::isinf(r.lo)) return fmt::format("{} -inf in {} of {} seeds (the far gradients are 0 in float32)", m,
                                              std::count_if(d.begin(), d.end(), [](double x) { return std::isinf(x); }),
                                              d.size());
    return fmt::format("{} {}", m, r.lo == r.hi ? fmt::format("{:+.1f}", r.mean)
                                                : fmt::format("{:+.1f} ({:+.1f} to {:+.1f})", r.mean, r.lo, r.hi));
  };
  for (const std::string state : {"init", "trained"}) {
    // Signed log10(far / near): -2 reads "far inputs get a hundredth of the near ones' gradient".
    v.measured += fmt::format("{}log10(far / near input gradient), {}: {}", state == "init" ? "" : "; ",
                              state == "init" ? "at init" : "trained", cell("gpt", state));
    for (const auto& m : rec) v.measured += ", " + cell(m, state);
  }
  std::vector<Order> keeps;
  for (const auto& m : rec) keeps.push_back(compare(log_far_near("gpt", "trained"), log_far_near(m, "trained"), true));
  std::vector<std::string> exploding;
  for (const auto& m : s.c.models)
    for (const std::string state : {"init", "trained"})
      if (explodes(m, state)) exploding.push_back(m + " " + state);
  v.verdict = judge(rec, keeps);
  v.verdict += exploding.empty() ? "; no model's gradients grow with distance"
                                 : fmt::format("; gradients grow with distance for {}", fmt::join(exploding, ", "));
  const double trained = range_of(log_far_near("gpt", "trained")).mean, init = range_of(log_far_near("gpt", "init")).mean;
  if (trained < -1 && init > -0.5)
    v.verdict += fmt::format("; trained GPT's fall {:.0f}x with distance, flat at init: what its attention learnt to "
                             "look at, not a path that vanishes", std::pow(10.0, -trained));
  return v;
}

Verdict training_steps(const Study& s) {
  Verdict v;
  const Csv csv(s.path("tuning.csv"));
  auto curves = by_model_seed(csv, "tokens", "val_loss");
  auto seconds = by_model_seed(csv, "seconds", "val_loss");
  const auto rec = recurrent(s.c);
  auto finals = [&](const std::string& m) { return per_seed(curves.at(m), [](const XY& xy) { return xy.second.back(); }); };
  // The loss every model reached on average: the worst of the models' mean final losses.
  double target = -INFINITY;
  for (const auto& m : s.c.models) target = std::max(target, range_of(finals(m)).mean);
  // Tokens (or seconds) at which a curve first reaches target, linear between
  // evaluations; a curve that never does counts its last point.
  auto reach = [&](const XY& xy) {
    const auto& [x, y] = xy;
    for (size_t i = 0; i < y.size(); ++i)
      if (y[i] <= target) {
        if (i == 0) return x[0];
        return x[i - 1] + (x[i] - x[i - 1]) * (y[i - 1] - target) / (y[i - 1] - y[i]);
      }
    return x.back();
  };
  auto tokens = [&](const std::string& m) { return per_seed(curves.at(m), reach); };
  auto count_range = [](const std::vector<double>& t) {
    const Range r = range_of(t);
    return r.lo == r.hi ? report::format_count(r.mean)
                        : fmt::format("{} ({}-{})", report::format_count(r.mean), report::format_count(r.lo),
                                      report::format_count(r.hi));
  };
  v.measured = fmt::format("tokens to val loss {:.3f} (the worst mean final): gpt {}", target, count_range(tokens("gpt")));
  std::vector<Order> fewer;
  for (const auto& m : rec) {
    v.measured += fmt::format(", {} {}", m, count_range(tokens(m)));
    fewer.push_back(compare(tokens("gpt"), tokens(m), false));
  }
  v.measured += fmt::format("; seconds: gpt {}", mean_range(per_seed(seconds.at("gpt"), reach), 0));
  for (const auto& m : rec) v.measured += fmt::format(", {} {}", m, mean_range(per_seed(seconds.at(m), reach), 0));
  v.measured += fmt::format("; final val loss: gpt {}", mean_range(finals("gpt"), 3));
  for (const auto& m : rec) v.measured += fmt::format(", {} {}", m, mean_range(finals(m), 3));
  v.verdict = judge(rec, fewer);
  // Again on the scale part's curves, at its largest budget and the largest
  // size every model ran at: there the models train far longer than here.
  if (Csv::exists(s.path("scale_curves.csv"))) {
    const Csv sc(s.path("scale_curves.csv"));
    double budget = 0;
    for (size_t r = 0; r < sc.size(); ++r) budget = std::max(budget, sc.num(r, "tokens_per_param"));
    // Per model, its largest size at that budget trained from two seeds or
    // more (one seed's value has no spread to judge against).
    std::map<std::string, std::map<int64_t, std::set<std::string>>> seeds;
    for (size_t r = 0; r < sc.size(); ++r)
      if (sc.num(r, "tokens_per_param") == budget)
        seeds[sc.str(r, "model")][static_cast<int64_t>(sc.num(r, "size"))].insert(sc.str(r, "seed"));
    std::map<std::string, int64_t> largest;
    for (const auto& [m, by_size] : seeds)
      for (const auto& [z, set] : by_size)
        if (set.size() >= 2) largest[m] = std::max(largest[m], z);
    int64_t size = INT64_MAX;
    for (const auto& m : s.c.models) size = std::min(size, largest.count(m) ? largest.at(m) : 0);
    if (size > 0) {
      const std::string at = fmt::format("{:g}", budget);
      std::map<std::string, std::map<std::string, XY>> long_curves;
      for (size_t r = 0; r < sc.size(); ++r)
        if (sc.num(r, "tokens_per_param") == budget && static_cast<int64_t>(sc.num(r, "size")) == size) {
          auto& [xs, ys] = long_curves[sc.str(r, "model")][sc.str(r, "seed")];
          xs.push_back(sc.num(r, "tokens")), ys.push_back(sc.num(r, "val_loss"));
        }
      target = -INFINITY;
      for (const auto& m : s.c.models)
        target = std::max(target, range_of(per_seed(long_curves.at(m), [](const XY& xy) { return xy.second.back(); })).mean);
      auto long_tokens = [&](const std::string& m) { return per_seed(long_curves.at(m), reach); };
      v.measured += fmt::format("; scale part, size {} at {} tok/param: tokens to val loss {:.3f}: gpt {}", size, at,
                                target, count_range(long_tokens("gpt")));
      std::vector<Order> long_fewer;
      for (const auto& m : rec) {
        v.measured += fmt::format(", {} {}", m, count_range(long_tokens(m)));
        long_fewer.push_back(compare(long_tokens("gpt"), long_tokens(m), false));
      }
      v.verdict = fmt::format("part 1 ({}): {}; size {} at {} tok/param: {}", part1_budget(s), v.verdict, size, at,
                              judge(rec, long_fewer));
    }
  }
  return v;
}

// The highest load average while `part` ran (from times.csv), when it is
// above the cores plus one: other processes then held cores the part's
// threads were timed on, and its timings say little. nullopt when the
// machine was free enough or the part's load was not recorded.
std::optional<std::string> busy_during(const Study& s, const std::string& part) {
  if (!Csv::exists(s.path("times.csv"))) return std::nullopt;
  const Csv t(s.path("times.csv"));
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  for (size_t r = 0; r < t.size(); ++r) {
    if (t.str(r, "part") != part || t.str(r, "load_start") == "?" || t.str(r, "load_end") == "?") continue;
    const double peak = std::max(t.num(r, "load_start"), t.num(r, "load_end"));
    if (peak > cores + 1.0) return fmt::format("load average {:.1f} on {} cores", peak, cores);
  }
  return std::nullopt;
}

Verdict parallelism(const Study& s) {
  Verdict v;
  const Csv steps(s.path("steps.csv"));
  auto depth = by_model(steps, "T", "sequential_steps");
  const auto rec = recurrent(s.c);
  const auto& g = depth.at("gpt");
  const bool gpt_flat = g.second.front() == g.second.back();
  v.measured = fmt::format("sequential steps at T = {:.0f} / {:.0f}: gpt {:.0f} / {:.0f}", g.first.front(),
                           g.first.back(), g.second.front(), g.second.back());
  std::vector<bool> grows;
  for (const auto& m : rec) {
    const auto& d = depth.at(m).second;
    v.measured += fmt::format(", {} {:.0f} / {:.0f}", m, d.front(), d.back());
    grows.push_back(d.back() > 2 * d.front());
  }
  // Speedup from 1 to 2 threads per model and regime: the median of the
  // paired steps' ratios and its quartiles. GPT's is larger (or smaller)
  // than a recurrence's only when the two interquartile ranges do not meet.
  const Csv sp(s.path("speedup.csv"));
  std::map<std::string, std::map<std::string, Spread>> speedup;  // regime -> model
  std::vector<std::string> regimes;
  for (size_t r = 0; r < sp.size(); ++r) {
    const std::string& regime = sp.str(r, "regime");
    if (std::find(regimes.begin(), regimes.end(), regime) == regimes.end()) regimes.push_back(regime);
    speedup[regime][sp.str(r, "model")] = {sp.num(r, "speedup"), sp.num(r, "speedup_q1"), sp.num(r, "speedup_q3")};
  }
  std::vector<std::string> judged;  // per regime: how GPT's speedup compares with the recurrences'
  for (const auto& regime : regimes) {
    auto& by = speedup[regime];
    const Spread g = by.at("gpt");
    v.measured += fmt::format("; 2-thread speedup (median, quartiles), {}: gpt x{:.2f} ({:.2f}-{:.2f})", regime,
                              g.median, g.q1, g.q3);
    std::vector<std::string> larger, smaller, level;
    for (const auto& m : rec) {
      const Spread o = by.at(m);
      v.measured += fmt::format(", {} x{:.2f} ({:.2f}-{:.2f})", m, o.median, o.q1, o.q3);
      (g.q1 > o.q3 ? larger : g.q3 < o.q1 ? smaller : level).push_back(m);
    }
    std::vector<std::string> parts;
    if (!larger.empty()) parts.push_back(fmt::format("larger than the {}'s", fmt::join(larger, " and ")));
    if (!smaller.empty()) parts.push_back(fmt::format("smaller than the {}'s", fmt::join(smaller, " and ")));
    if (!level.empty())
      parts.push_back(fmt::format("not distinguishable from the {}'s at {} pairs", fmt::join(level, " and "),
                                  s.c.parallel_steps));
    judged.push_back(fmt::format("{}: GPT's {}", regime, fmt::join(parts, ", ")));
  }
  const std::string structure = gpt_flat ? combine(rec, grows, "does not hold") : "does not hold (GPT's chain grows with T)";
  const std::optional<std::string> busy = busy_during(s, "parallel");
  const std::string threads = busy ? fmt::format("not judged ({}: other processes held the cores)", *busy)
                                    : fmt::format("{}", fmt::join(judged, "; "));
  v.verdict = fmt::format("step count: {}; speedup at 2 threads: {}", structure, threads);
  return v;
}

// Within GPT: where attention's n^2 d work passes half its FLOPs, and whether
// its time grows as its FLOPs do. Against the recurrences at matched
// parameters: where GPT becomes the dearer per token, in time and in FLOPs.
Verdict cost(const Study& s) {
  Verdict v;
  const Csv csv(s.path("cost.csv"));
  std::map<std::string, std::vector<double>> T, us, us_q1, us_q3, predicted, flops, attention_share;
  for (size_t r = 0; r < csv.size(); ++r) {
    const std::string m = csv.str(r, "model");
    const double total = csv.num(r, "fwd_flops_per_token") + csv.num(r, "bwd_flops_per_token");
    T[m].push_back(csv.num(r, "T"));
    us[m].push_back(csv.num(r, "fwd_us_per_token") + csv.num(r, "bwd_us_per_token"));
    us_q1[m].push_back(csv.num(r, "step_us_q1"));
    us_q3[m].push_back(csv.num(r, "step_us_q3"));
    predicted[m].push_back(csv.num(r, "pred_fwd_us_per_token") + csv.num(r, "pred_bwd_us_per_token"));
    flops[m].push_back(total);
    attention_share[m].push_back(csv.num(r, "attention_flops_per_token") / total);
  }
  const auto rec = recurrent(s.c);
  const auto& x = T.at("gpt");
  // "from T ≈ x" where a overtakes b, or that it does at every T / at none.
  auto where = [&](const std::vector<double>& a, const std::vector<double>& b) {
    if (auto t = crossing(x, a, b)) return fmt::format("from T ≈ {:.0f}", *t);
    return a.front() > b.front() ? std::string("at every T") : fmt::format("at no T up to {:.0f}", x.back());
  };
  const std::vector<double> half(x.size(), 0.5);
  const std::string attention_half = where(attention_share.at("gpt"), half);
  const double grows = us.at("gpt").back() / us.at("gpt").front();
  // The growth's range from the quartiles: slowest long against fastest short, and the reverse.
  const double grows_lo = us_q1.at("gpt").back() / us_q3.at("gpt").front(),
               grows_hi = us_q3.at("gpt").back() / us_q1.at("gpt").front();
  const double flops_grow = predicted.at("gpt").back() / predicted.at("gpt").front();
  v.measured = fmt::format("GPT's attention (n²·d) is half its FLOPs {}; its time per token grows x{:.2f} "
                           "({:.2f}-{:.2f}) from T = {:.0f} to {:.0f} (FLOPs predict x{:.2f}); us per token at T = "
                           "{:.0f} / {:.0f}: gpt {:.1f} / {:.1f}",
                           attention_half, grows, grows_lo, grows_hi, x.front(), x.back(), flops_grow, x.front(),
                           x.back(), us.at("gpt").front(), us.at("gpt").back());
  for (const auto& m : rec) v.measured += fmt::format(", {} {:.1f} / {:.1f}", m, us.at(m).front(), us.at(m).back());
  std::string in_time, in_flops;
  for (const auto& m : rec) {
    in_time += fmt::format("{}than the {} {}", in_time.empty() ? "" : ", ", m, where(us.at("gpt"), us.at(m)));
    in_flops += fmt::format("{}than the {} {}", in_flops.empty() ? "" : ", ", m, where(flops.at("gpt"), flops.at(m)));
  }
  v.measured += fmt::format("; GPT dearer per token in time {}; in FLOPs {}", in_time, in_flops);
  // "Cheaper while n << d" is judged at the shortest T, in time: GPT is
  // cheaper (or dearer) than a recurrence when the quartiles of their
  // repeated steps do not meet. The FLOP ratio there says why (at matched
  // parameters GPT's MLP and projections, not its attention, set its cost at
  // short T).
  std::vector<Order> cheaper;
  std::string flop_ratios;
  for (const auto& m : rec) {
    cheaper.push_back(us_q3.at("gpt").front() < us_q1.at(m).front()   ? Order::better
                      : us_q1.at("gpt").front() > us_q3.at(m).front() ? Order::worse
                                                                      : Order::level);
    flop_ratios += fmt::format("{}x{:.2f} the {}'s", flop_ratios.empty() ? "" : ", ",
                               flops.at("gpt").front() / flops.at(m).front(), m);
  }
  const std::string growth = grows_hi < flops_grow  ? "less than counted"
                             : grows_lo > flops_grow ? "more than counted"
                                                     : "as counted, within the spread";
  v.verdict = fmt::format("cheaper at short T: {} (at T = {:.0f} GPT does {} FLOPs per token, its attention {:.0f}% of "
                          "them); growth with T: GPT's time x{:.2f} ({:.2f}-{:.2f}) where its n²·d count predicts "
                          "x{:.2f}: {}",
                          judge(rec, cheaper), x.front(), flop_ratios, 100 * attention_share.at("gpt").front(), grows,
                          grows_lo, grows_hi, flops_grow, growth);
  if (auto busy = busy_during(s, "cost")) v.verdict += fmt::format(" (timed at {})", *busy);
  return v;
}

// How the gap GPT − m moves from `from` to `to` (Gap::range): it falls
// when to's whole range lies below from's (GPT gains on m), rises when
// above, and is level when the spreads overlap.
std::string gap_move(const Gap& from, const Gap& to) {
  if (to.range.hi < from.range.lo) return "falls (GPT gains)";
  if (to.range.lo > from.range.hi) return "rises (GPT loses ground)";
  return "stays level within the spread";
}

// Per budget (tokens per parameter): how GPT's fitted power law compares
// with each recurrence's, in loss against parameters and against training
// FLOPs (a steeper fall: exponent larger by more than twice the standard
// error of the difference), and whether the gap GPT − m shrinks with size at
// that budget; at the largest size run at two budgets or more, whether it
// shrinks with tokens. The claim holds at a budget where GPT's exponent is
// the steeper.
Verdict scaling(const Study& s) {
  Verdict v;
  const Csv csv(s.path("scale.csv"));
  const auto rec = recurrent(s.c);
  const auto gaps = scale_gaps(csv);
  auto gap_text = [](const Gap& g) {
    return fmt::format("{:+.3f} ({:+.3f} to {:+.3f}{})", g.range.mean, g.range.lo, g.range.hi,
                       g.spread_borrowed ? "; 1 seed, spread borrowed" : "");
  };
  std::vector<std::string> measured, verdicts;
  for (double b : scale_budgets(csv)) {
    std::vector<std::string> m_parts, v_parts;
    for (const auto& [axis, name] : {std::pair{"params", "parameters"}, std::pair{"train_flops", "training FLOPs"}}) {
      const auto fits = scale_fits(csv, axis, b);
      if (!fits.count("gpt")) continue;
      const PowerLaw& g = fits.at("gpt");
      std::string line = fmt::format("loss ∝ {}^-α: gpt α {:.3f} ± {:.3f}", name, -g.b, g.se_b);
      std::vector<Order> steeper;
      std::vector<std::string> judged;
      for (const auto& m : rec) {
        if (!fits.count(m)) continue;
        const PowerLaw& r = fits.at(m);
        line += fmt::format(", {} {:.3f} ± {:.3f}", m, -r.b, r.se_b);
        const double db = r.b - g.b, se = std::hypot(g.se_b, r.se_b);  // > 0: GPT's loss falls faster
        steeper.push_back(db > 2 * se ? Order::better : db < -2 * se ? Order::worse : Order::level);
        judged.push_back(m);
        if (const auto meet = meeting(g, r); meet && std::string(axis) == "params")
          line += fmt::format(" (GPT's fit meets the {}'s at {:.2g} parameters, 1σ {:.2g} to {:.2g})", m,
                              std::pow(10.0, meet->log10x), std::pow(10.0, meet->log10x - meet->se),
                              std::pow(10.0, meet->log10x + meet->se));
      }
      m_parts.push_back(line);
      if (!judged.empty()) v_parts.push_back(fmt::format("in {}: {}", name, judge(judged, steeper)));
    }
    // The gap from the smallest to the largest size where both models ran at b.
    for (const auto& m : rec) {
      std::vector<const Gap*> at_b;
      for (const Gap& g : gaps)
        if (g.model == m && g.tokens_per_param == b) at_b.push_back(&g);
      if (at_b.size() < 2) continue;
      const Gap& lo = **std::min_element(at_b.begin(), at_b.end(), [](auto x, auto y) { return x->size < y->size; });
      const Gap& hi = **std::max_element(at_b.begin(), at_b.end(), [](auto x, auto y) { return x->size < y->size; });
      m_parts.push_back(fmt::format("GPT − {} size {} → {}: {} → {}", m, lo.size, hi.size, gap_text(lo), gap_text(hi)));
      v_parts.push_back(fmt::format("gap to the {} {} with size", m, gap_move(lo, hi)));
    }
    measured.push_back(fmt::format("at {:g} tok/param: {}", b, fmt::join(m_parts, "; ")));
    verdicts.push_back(fmt::format("at {:g} tok/param: {}", b, fmt::join(v_parts, ", ")));
  }
  // With tokens: at the largest size run at two budgets or more, the gap at
  // the smallest budget against the largest.
  for (const auto& m : rec) {
    std::map<int64_t, std::map<double, const Gap*>> by_size;
    for (const Gap& g : gaps)
      if (g.model == m) by_size[g.size][g.tokens_per_param] = &g;
    for (auto it = by_size.rbegin(); it != by_size.rend(); ++it) {
      if (it->second.size() < 2) continue;
      const Gap& lo = *it->second.begin()->second;
      const Gap& hi = *it->second.rbegin()->second;
      measured.push_back(fmt::format("GPT − {} at size {}, {:g} → {:g} tok/param: {} → {}", m, it->first,
                                     lo.tokens_per_param, hi.tokens_per_param, gap_text(lo), gap_text(hi)));
      verdicts.push_back(fmt::format("at size {}, the gap to the {} {} with tokens", it->first, m, gap_move(lo, hi)));
      break;
    }
  }
  v.measured = fmt::format("{}", fmt::join(measured, "; "));
  v.verdict = fmt::format("{}", fmt::join(verdicts, "; "));
  return v;
}

// At the largest size the scale part ran, at its largest budget: what block
// characters of context are worth over block/8 (scale_context.csv), per
// seed. The claim holds against a recurrence when GPT's gain is larger
// beyond the seeds' ranges; measured also says how each gain moved from the
// smallest size.
Verdict context_at_scale(const Study& s) {
  Verdict v;
  const Csv csv(s.path("scale_context.csv"));
  double t_short = INFINITY, t_long = 0, budget = 0;
  for (size_t r = 0; r < csv.size(); ++r) {
    t_short = std::min(t_short, csv.num(r, "context")), t_long = std::max(t_long, csv.num(r, "context"));
    budget = std::max(budget, csv.num(r, "tokens_per_param"));
  }
  const auto gains = context_gains(csv, budget);
  const auto rec = recurrent(s.c);
  const auto& gpt = gains.at("gpt");
  // The largest size GPT trained from two seeds or more (one seed's gain has no spread to judge against).
  const int64_t first = gpt.begin()->first;
  int64_t last = first;
  for (const auto& [z, by_seed] : gpt)
    if (by_seed.size() >= 2) last = z;
  int64_t params = 0;
  for (size_t r = 0; r < csv.size(); ++r)
    if (csv.str(r, "model") == "gpt" && static_cast<int64_t>(csv.num(r, "size")) == last)
      params = static_cast<int64_t>(csv.num(r, "params"));
  v.measured = fmt::format("at {:g} tok/param, loss gained by {:.0f} instead of {:.0f} characters of context, size {} "
                           "-> size {} ({} parameters):",
                           budget, t_long, t_short, first, last, report::format_count(static_cast<double>(params)));
  std::vector<Order> larger;
  std::vector<std::string> judged;
  for (const auto& m : s.c.models) {
    const auto& g = gains.at(m);
    const auto at_last = g.find(last);
    v.measured += fmt::format("{} {} {} -> {}", m == s.c.models.front() ? "" : ",", m,
                              mean_range(g.begin()->second, 3),
                              at_last == g.end() ? "not run" : mean_range(at_last->second, 3));
    // A recurrence that stopped below that size is not compared there.
    if (m != "gpt" && at_last != g.end()) {
      larger.push_back(compare(gpt.at(last), at_last->second, true));
      judged.push_back(m);
    }
  }
  v.measured += " nats/char";
  v.verdict = judged.empty() ? "no recurrent model ran at GPT's largest size with two seeds or more"
                             : fmt::format("{} (size {}, {:g} tok/param)", judge(judged, larger), last, budget);
  return v;
}

struct Claim {
  std::string part;  // whose files it reads
  Verdict (*judge)(const Study&);
  std::string claim;
};

}  // namespace

PartOutput run_verdicts(Study& s) {
  const std::vector<Claim> claims = {
      {"recall", long_range, "Attention uses dependencies far back in the context (long-range dependencies)"},
      {"gradients", gradients, "Gradients neither vanish nor explode with distance"},
      {"tuning", training_steps, "A transformer needs fewer training steps"},
      {"parallel", parallelism, "Its work parallelises: the steps that must run in order do not grow with sequence length"},
      {"cost", cost, "Self-attention costs O(n^2 d) per layer against a recurrence's O(n d^2): cheaper while n << d"},
      {"scale", scaling, "Transformers scale better: their loss falls faster with parameters and compute"},
      {"scale", context_at_scale,
       "At the largest size, a transformer gains more than a recurrence from its whole context over an eighth of it "
       "(it puts long context to more use)"}};
  const bool has_gpt = std::find(s.c.models.begin(), s.c.models.end(), "gpt") != s.c.models.end();
  report::Table table{{"claim", "measured", "verdict"}, {}};
  for (const Claim& cl : claims) {
    Verdict v;
    if (!has_gpt || recurrent(s.c).empty()) {
      v.measured = "not measured";
      v.verdict = "needs gpt and a recurrent model in --models";
    } else {
      try {
        v = cl.judge(s);
        // The budget the verdict holds at (the scale part's verdicts and part 1's own name theirs).
        if (cl.part == "recall")
          v.verdict += fmt::format(" (recall task: {} steps of {} sequences; text: part 1's models, {})",
                                   s.c.recall_steps, s.c.recall_batch, part1_budget(s));
        if (cl.part == "gradients") v.verdict += fmt::format(" (part 1's models, {})", part1_budget(s));
      } catch (const std::exception& e) {  // a part not run (or run with other models): say which
        v.measured = fmt::format("not measured: {}", e.what());
        v.verdict = fmt::format("run --part {}", cl.part);
      }
    }
    table.rows.push_back({cl.claim, v.measured, v.verdict});
  }

  std::string times = "| part | time | load average (start → end) | GEMMs |\n|------|-----:|------|------|\n";
  if (Csv::exists(s.path("times.csv"))) {
    const Csv t(s.path("times.csv"));
    for (size_t r = 0; r < t.size(); ++r)
      times += fmt::format("| {} | {} | {} → {} | {} |\n", t.str(r, "part"), report::format_duration(t.num(r, "seconds")),
                           t.str(r, "load_start"), t.str(r, "load_end"),
                           // a times.csv from before the column: float32
                           !t.has("dtype") || t.str(r, "dtype") == "f32" ? "float32"
                           : t.str(r, "dtype") == "bf16"                ? "bfloat16 (autocast)"
                                                                        : "float32 and bfloat16 (see the part)");
  }
  // The verdicts alone first (the README shows this table as it is), then
  // with what each rests on.
  report::Table verdicts{{"claim", "verdict"}, {}};
  for (const auto& row : table.rows) verdicts.rows.push_back({row[0], row[2]});
  std::string md = "# Transformers against recurrent networks: what holds at this scale\n\n" + report::provenance() +
                   fmt::format("Every model is trained from {} seeds. A verdict comparing two models says *holds* or "
                               "*does not hold* when the models' results over the seeds do not overlap (min to max), "
                               "*not distinguishable at this budget* when they do; a verdict on timings compares "
                               "quartiles of repeated steps, and one on scaling compares fitted exponents with twice "
                               "their standard error.\n\n",
                               s.c.seeds) +
                   verdicts.markdown() + "\n## What the verdicts rest on\n\n" + table.markdown() +
                   "\n## Time per part\n\n" + times;
  for (const std::string& part : part_names()) {
    std::ifstream f(s.path(part + ".md"));
    if (!f || part == "verdicts") continue;
    std::stringstream body;
    body << f.rdbuf();
    md += "\n" + body.str();
  }
  report::write_file(s.path("results.md"), md);
  // On the terminal: one block per claim (the cells are too long for aligned columns).
  for (const auto& row : table.rows) fmt::print("\n* {}\n  measured: {}\n  verdict:  {}\n", row[0], row[1], row[2]);
  return {fmt::format("{} claims judged; the table and every part's results are in {}", table.rows.size(),
                      s.path("results.md")),
          table.markdown()};
}

}  // namespace tg::study
