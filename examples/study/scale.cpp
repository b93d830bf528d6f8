// Part scale: does the transformer's loss fall faster with size than the
// recurrences', and does the answer depend on how long each size trains?
// The models at GPT widths each about twice the last (so about 4x the
// parameters; the recurrent models matched to GPT at each), each trained at
// every budget of --tokens-per-param (training tokens per GPT parameter:
// 20 is where compute-optimal transformers train), from every seed, at the
// learning rate a short sweep chose for that model and size. Per budget:
// validation loss against parameters and against training FLOPs with a power
// law fitted per model on each axis (fit.h), where GPT's fit would meet each
// recurrence's, and the gap GPT minus each recurrence at every size. And at
// every size, what block characters of context are worth over block/8 (16 of
// the default 128) to each trained model (loss_given_context, as part 3
// measures it for part 1's models).
//
// Every training run is a cell (run_cells): under mpirun the cells spread
// over the ranks, and each writes the same rows wherever it runs.
//
// Training FLOPs are counted, not modelled: the GEMM work of one float32
// training step (forward, loss, backward; the optimizer does no GEMM),
// read from the profiler's counter (every GEMM of the library goes through
// autograd/blas.cpp, which adds 2 M N K), times the steps.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/profiler.h"
#include "data/tokenizer.h"
#include "distributed/dist.h"
#include "examples/study/fit.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

// GEMM FLOPs of one float32 training step of m on batch b.
double flops_per_step(models::LanguageModel& m, const data::LMBatch& b) {
  const bool was_on = profiler_enabled();
  profiler_enable(true);
  profiler_reset();
  m.train();
  m.loss(b.inputs, b.targets).backward();
  const double flops = profiler_totals().flops;
  profiler_reset();
  profiler_enable(was_on);
  return flops;
}

// Seconds per training step of m at precision: the median of `steps` timed
// steps after one untimed (what the estimate of the sizes not run uses).
double seconds_per_step(models::LanguageModel& m, const data::LMBatch& b, DType precision, int steps) {
  nn::AdamW opt(m.parameters(), nn::AdamWOptions{.lr = 1e-4});
  std::vector<double> t;
  for (int i = 0; i <= steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    Tensor l = [&] {
      AutocastGuard autocast(precision);
      return m.loss(b.inputs, b.targets);
    }();
    l.backward();
    opt.step();
    opt.zero_grad();
    if (i > 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return spread(t).median;
}

// Rates a size's sweep may try past --lrs while its best sits at an end:
// the best rate moves with size (the LSTM's grows), and one at the edge of
// those tried says nothing about the rates beyond.
constexpr int kMaxExtraRates = 4;

// "bf16" or "f32", as the CSV files say it.
std::string precision_name(DType d) { return d == DType::bf16 ? "bf16" : "f32"; }

// One model at one width: what every cell of it shares.
struct Model {
  std::string kind;
  size_t size = 0;  // index into scale_dims
  Config config;    // gpt_dim set to the size's width
  int64_t params = 0, params_gpt = 0;
  double flops_per_step = 0;
  std::string shape;
  DType precision = DType::f32;
};

// One training run. role "sweep": a rate of the model's sweep, at a fraction
// of its largest budget; "fit": a point of the curves; "check": the smallest
// size again in the other precision.
struct Cell {
  const Model* model = nullptr;
  std::string role;
  double tokens_per_param = 0, lr = 0;
  int64_t seed_index = 0, steps = 0;
  DType precision = DType::f32;
};

// The steps that train on tokens_per_param tokens per GPT parameter.
int64_t steps_for(double tokens_per_param, int64_t params_gpt, int64_t tokens_per_step) {
  return std::max<int64_t>(1, std::llround(tokens_per_param * static_cast<double>(params_gpt) /
                                           static_cast<double>(tokens_per_step)));
}

// The tokenizer part 1 wrote, as rank 0 has it: ranks on other machines
// have no part 1 output, so rank 0's file travels to them.
std::unique_ptr<data::Tokenizer> part1_tokenizer(const Study& s) {
  std::string json;
  if (dist::is_main()) {
    std::ifstream f(from_tuning(s, "tokenizer.json"), std::ios::binary);
    json.assign(std::istreambuf_iterator<char>(f), {});
  }
  json = dist::all_gather(json).front();
  if (dist::is_main()) return data::load_tokenizer(from_tuning(s, "tokenizer.json"));
  const std::string copy = (std::filesystem::temp_directory_path() /
                            fmt::format("tg_study_tokenizer_{}_{}.json", ::getpid(), dist::rank())).string();
  report::write_file(copy, json);
  auto tok = data::load_tokenizer(copy);
  std::filesystem::remove(copy);
  return tok;
}

// A cell's result: lines "<file>\t<row>" for scale.csv, scale_context.csv
// and scale_curves.csv.
void add_row(std::string& out, const std::string& file, const std::string& row) { out += file + "\t" + row + "\n"; }

std::string budget_name(double tpp) { return fmt::format("{:g} tok/param", tpp); }

}  // namespace

std::vector<double> scale_budgets(const Csv& csv) {
  std::set<double> b;
  for (size_t r = 0; r < csv.size(); ++r)
    if (csv.str(r, "role") == "fit") b.insert(csv.num(r, "tokens_per_param"));
  return {b.begin(), b.end()};
}

std::map<std::string, PowerLaw> scale_fits(const Csv& csv, const std::string& x_column, double tokens_per_param) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> points;
  for (size_t r = 0; r < csv.size(); ++r) {
    if (csv.str(r, "role") != "fit" || csv.num(r, "tokens_per_param") != tokens_per_param) continue;
    auto& [x, y] = points[csv.str(r, "model")];
    x.push_back(csv.num(r, x_column));
    y.push_back(csv.num(r, "val_loss"));
  }
  std::map<std::string, PowerLaw> fits;
  for (const auto& [model, xy] : points)
    if (std::set<double>(xy.first.begin(), xy.first.end()).size() >= 2) fits[model] = fit_power_law(xy.first, xy.second);
  return fits;
}

std::vector<Gap> scale_gaps(const Csv& csv) {
  // (model, size, budget) -> seed -> loss, and the GPT's parameters per size
  std::map<std::tuple<std::string, int64_t, double>, std::map<std::string, double>> loss;
  std::map<int64_t, double> params;
  for (size_t r = 0; r < csv.size(); ++r) {
    if (csv.str(r, "role") != "fit") continue;
    const auto size = static_cast<int64_t>(csv.num(r, "size"));
    loss[{csv.str(r, "model"), size, csv.num(r, "tokens_per_param")}][csv.str(r, "seed")] = csv.num(r, "val_loss");
    if (csv.str(r, "model") == "gpt") params[size] = csv.num(r, "params");
  }
  std::vector<Gap> gaps;
  for (const auto& [key, by_seed] : loss) {
    const auto& [model, size, tpp] = key;
    if (model == "gpt" || !loss.count({"gpt", size, tpp})) continue;
    Gap g{.model = model, .size = size, .tokens_per_param = tpp, .params = params.at(size), .per_seed = {}, .range = {}};
    for (const auto& [seed, v] : loss.at({"gpt", size, tpp}))
      if (by_seed.count(seed)) g.per_seed.push_back(v - by_seed.at(seed));
    if (!g.per_seed.empty()) gaps.push_back(g);
  }
  // A gap from one seed has no spread of its own: it borrows the widest
  // spread of the same pair at the same budget among the sizes with seeds.
  for (Gap& g : gaps) {
    const Range r = range_of(g.per_seed);
    g.range = r;
    if (g.per_seed.size() > 1) continue;
    double half = -1;
    for (const Gap& o : gaps)
      if (o.model == g.model && o.tokens_per_param == g.tokens_per_param && o.per_seed.size() > 1) {
        const Range ro = range_of(o.per_seed);
        half = std::max(half, (ro.hi - ro.lo) / 2);
      }
    if (half >= 0) g.range = {r.mean, r.mean - half, r.mean + half}, g.spread_borrowed = true;
  }
  return gaps;
}

std::map<std::string, std::map<int64_t, std::vector<double>>> context_gains(const Csv& csv, double tokens_per_param) {
  // model -> size -> seed -> context -> loss
  std::map<std::string, std::map<int64_t, std::map<std::string, std::map<double, double>>>> loss;
  for (size_t r = 0; r < csv.size(); ++r)
    if (csv.num(r, "tokens_per_param") == tokens_per_param)
      loss[csv.str(r, "model")][static_cast<int64_t>(csv.num(r, "size"))][csv.str(r, "seed")][csv.num(r, "context")] =
          csv.num(r, "val_loss");
  std::map<std::string, std::map<int64_t, std::vector<double>>> gains;
  for (const auto& [model, sizes] : loss)
    for (const auto& [size, seeds] : sizes)
      for (const auto& [seed, by_t] : seeds)
        gains[model][size].push_back(by_t.begin()->second - by_t.rbegin()->second);
  return gains;
}

namespace {

// The part's tables, plots and section of results.md, from the files just
// written (as the verdicts read them). estimate: what the sizes not run
// would take, or empty.
PartOutput scale_report(Study& s, const std::vector<Model>& models, const std::map<size_t, Sweep>& sweeps,
                        const std::vector<double>& budgets, size_t n_run, double sweep_budget, int64_t short_context,
                        const std::string& estimate) {
  const Config& c = s.c;
  const Csv csv(s.path("scale.csv"));
  const auto rec = [&] {
    std::vector<std::string> r;
    for (const auto& m : c.models)
      if (m != "gpt") r.push_back(m);
    return r;
  }();

  report::Table sweep_table{{"model", "size", "params", "val loss per rate (bold: chosen)"}, {}};
  std::string edges;
  for (const auto& [k, sw] : sweeps) {
    const Model& m = models[k];
    std::vector<std::string> tried;
    for (size_t i = 0; i < sw.lrs.size(); ++i)
      tried.push_back(fmt::format(fmt::runtime(i == sw.best ? "**{} {:.3f}**" : "{} {:.3f}"), format_lr(sw.lrs[i]), sw.losses[i]));
    sweep_table.rows.push_back({m.kind, std::to_string(m.size + 1), report::format_count(static_cast<double>(m.params)),
                                fmt::format("{}", fmt::join(tried, ", "))});
    if (sw.at_edge()) edges += fmt::format("{}{} size {}", edges.empty() ? "" : ", ", m.kind, m.size + 1);
  }

  // Per model, size and budget: the seeds' losses and times.
  struct Runs {
    std::vector<double> loss, seconds;
    std::string lr, dtype, tokens, flops;
  };
  std::map<std::tuple<std::string, int64_t, double>, Runs> fit, check;
  for (size_t r = 0; r < csv.size(); ++r) {
    const std::string role = csv.str(r, "role");
    if (role == "sweep") continue;
    Runs& x = (role == "fit" ? fit : check)[{csv.str(r, "model"), static_cast<int64_t>(csv.num(r, "size")),
                                             csv.num(r, "tokens_per_param")}];
    x.loss.push_back(csv.num(r, "val_loss")), x.seconds.push_back(csv.num(r, "seconds"));
    x.lr = format_lr(csv.num(r, "lr")), x.dtype = csv.str(r, "dtype");
    x.tokens = report::format_count(csv.num(r, "tokens")), x.flops = fmt::format("{:.2e}", csv.num(r, "train_flops"));
  }
  report::Table table{{"model", "size", "shape", "params", "tok/param", "tokens", "train FLOPs", "GEMMs", "lr",
                       "val loss, mean (min-max over seeds)", "seeds", "time per run"}, {}};
  for (const std::string& kind : c.models)
    for (const auto& [key, x] : fit) {
      const auto& [model, size, b] = key;
      if (model != kind) continue;
      const Model& m = *std::find_if(models.begin(), models.end(),
                                     [&](const Model& mm) { return mm.kind == kind && static_cast<int64_t>(mm.size) + 1 == size; });
      table.rows.push_back({kind, std::to_string(size), m.shape, report::format_count(static_cast<double>(m.params)),
                            fmt::format("{:g}", b), x.tokens, x.flops,
                            x.dtype == "bf16" ? "bfloat16 (autocast)" : "float32", x.lr,
                            format_range(range_of(x.loss), 3), std::to_string(x.loss.size()),
                            report::format_duration(range_of(x.seconds).mean)});
    }

  // bfloat16's rounding must change the loss by less than the seeds do.
  std::string check_md, check_summary;
  for (const auto& [key, o] : check) {
    const Runs& f = fit.at(key);
    const Range a = range_of(f.loss), b = range_of(o.loss);
    const Range& f32 = f.dtype == "f32" ? a : b;
    const Range& bf16 = f.dtype == "f32" ? b : a;
    const double gap = std::fabs(bf16.mean - f32.mean), spread_max = std::max(f32.hi - f32.lo, bf16.hi - bf16.lo);
    const bool agree = gap <= spread_max;
    check_md += fmt::format("- {} at {}: float32 {}, bfloat16 {}; means {:.3f} apart, the larger seed range {:.3f}: {}\n",
                            std::get<0>(key), budget_name(std::get<2>(key)), format_range(f32, 3), format_range(bf16, 3),
                            gap, spread_max, agree ? "agree within the seed spread" : "DO NOT agree within the seed spread");
    check_summary += fmt::format("{}{} {:g} {}", check_summary.empty() ? "" : ", ", std::get<0>(key), std::get<2>(key),
                                 agree ? "agree" : "differ");
  }

  // The fits, per budget: only runs at the same tokens per parameter.
  std::string fit_csv = "model,tokens_per_param,axis,exponent,exponent_se,log10_loss_at_mean,log10_loss_at_mean_se,"
                        "log10_x_mean,points\n";
  report::Table fit_table{{"model", "tok/param", "loss against parameters: exponent",
                           "loss against training FLOPs: exponent"}, {}};
  Panel p_panel{.title = "validation loss against parameters", .xlabel = "parameters", .ylabel = "val loss (nats/char)",
                .logx = true, .logy = true};
  Panel f_panel{.title = "validation loss against training FLOPs", .xlabel = "training FLOPs (GEMMs)",
                .ylabel = "val loss (nats/char)", .logx = true, .logy = true};
  std::string meetings, summary;
  for (double b : budgets) {
    const auto by_params = scale_fits(csv, "params", b), by_flops = scale_fits(csv, "train_flops", b);
    for (const std::string& kind : c.models) {
      if (!by_params.count(kind)) continue;
      for (auto [axis, fits, panel] :
           {std::tuple{"params", &by_params, &p_panel}, std::tuple{"train_flops", &by_flops, &f_panel}}) {
        const PowerLaw& f = fits->at(kind);
        fit_csv += fmt::format("{},{:g},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{}\n", kind, b, axis, -f.b, f.se_b, f.a,
                               f.se_a, f.xbar, f.n);
        // Points: each size's mean with its seeds' min-max; the fit as a line
        // over the sizes run, dashed below the largest budget.
        std::map<double, std::vector<double>> at_x;
        for (size_t r = 0; r < csv.size(); ++r)
          if (csv.str(r, "model") == kind && csv.str(r, "role") == "fit" && csv.num(r, "tokens_per_param") == b)
            at_x[csv.num(r, axis)].push_back(csv.num(r, "val_loss"));
        Series pts{"", {}, {}, kind, Series::points},
            line{fmt::format("{}, {}: α {:.3f}", kind, budget_name(b), -f.b), {}, {}, kind,
                 b == budgets.back() ? Series::line : Series::dashed};
        for (const auto& [x, ys] : at_x) {
          const Range r = range_of(ys);
          pts.x.push_back(x), pts.y.push_back(r.mean), pts.ylo.push_back(r.lo), pts.yhi.push_back(r.hi);
        }
        const double lo = at_x.begin()->first, hi = at_x.rbegin()->first;
        for (int k = 0; k <= 10; ++k) {
          const double x = lo * std::pow(hi / lo, k / 10.0);
          line.x.push_back(x), line.y.push_back(f.at(x));
        }
        panel->series.push_back(pts);
        panel->series.push_back(line);
      }
      fit_table.rows.push_back({kind, fmt::format("{:g}", b),
                                fmt::format("{:.3f} ± {:.3f}", -by_params.at(kind).b, by_params.at(kind).se_b),
                                fmt::format("{:.3f} ± {:.3f}", -by_flops.at(kind).b, by_flops.at(kind).se_b)});
      if (b == budgets.back())
        summary += fmt::format("{}{} α {:.3f}±{:.3f}", summary.empty() ? "" : ", ", kind, -by_params.at(kind).b,
                               by_params.at(kind).se_b);
    }
    // Where GPT's fits meet the recurrences' (log10 x with its standard error).
    if (by_params.count("gpt"))
      for (const std::string& kind : rec) {
        if (!by_params.count(kind)) continue;
        for (auto [name, fits] : {std::pair{"parameters", &by_params}, std::pair{"training FLOPs", &by_flops}}) {
          const auto m = meeting(fits->at("gpt"), fits->at(kind));
          meetings += m ? fmt::format("- At {}, GPT and the {} in {}: the fits meet at 10^{:.2f} ± {:.2f} = {:.2g} {} "
                                      "(1σ {:.2g} to {:.2g})\n", budget_name(b), kind, name, m->log10x, m->se,
                                      std::pow(10.0, m->log10x), name, std::pow(10.0, m->log10x - m->se),
                                      std::pow(10.0, m->log10x + m->se))
                         : fmt::format("- At {}, GPT and the {} in {}: equal exponents, the fits never meet\n",
                                       budget_name(b), kind, name);
        }
      }
  }
  report::write_file(s.path("scale_fit.csv"), fit_csv);
  if (std::string why = plot(s.path("scale.png"), {p_panel, f_panel}, 1300, 560); !why.empty())
    fmt::print("scale: no plot: {}\n", why);

  // The gaps GPT minus each recurrence, per size and budget.
  const std::vector<Gap> gaps = scale_gaps(csv);
  std::string gap_csv = "model,size,params,tokens_per_param,seeds,gap_mean,gap_lo,gap_hi,spread_borrowed\n";
  std::map<std::pair<int64_t, double>, std::map<std::string, const Gap*>> gap_at;
  std::vector<Panel> gap_panels;
  for (double b : budgets) {
    Panel p{.title = fmt::format("GPT's val loss minus each recurrence's, {}", budget_name(b)), .xlabel = "parameters",
            .ylabel = "gap (nats/char; < 0: GPT better)", .logx = true};
    for (const std::string& kind : rec) {
      Series sr{fmt::format("GPT - {}", kind), {}, {}, kind, Series::linepoints};
      for (const Gap& g : gaps)
        if (g.model == kind && g.tokens_per_param == b) {
          sr.x.push_back(g.params), sr.y.push_back(g.range.mean), sr.ylo.push_back(g.range.lo);
          sr.yhi.push_back(g.range.hi);
        }
      if (!sr.x.empty()) p.series.push_back(sr);
    }
    gap_panels.push_back(p);
  }
  for (const Gap& g : gaps) {
    gap_csv += fmt::format("{},{},{:.0f},{:g},{},{:.6f},{:.6f},{:.6f},{}\n", g.model, g.size, g.params,
                           g.tokens_per_param, g.per_seed.size(), g.range.mean, g.range.lo, g.range.hi,
                           g.spread_borrowed ? 1 : 0);
    gap_at[{g.size, g.tokens_per_param}][g.model] = &g;
  }
  report::write_file(s.path("scale_gap.csv"), gap_csv);
  if (std::string why = plot(s.path("scale_gap.png"), gap_panels, 650 * static_cast<int>(budgets.size()), 520);
      !why.empty())
    fmt::print("scale: no plot: {}\n", why);
  report::Table gap_table{{"size", "GPT params", "tok/param"}, {}};
  for (const auto& kind : rec) gap_table.header.push_back(fmt::format("GPT − {}", kind));
  for (const auto& [key, by_model] : gap_at) {
    std::vector<std::string> row{std::to_string(key.first),
                                 report::format_count(by_model.begin()->second->params), fmt::format("{:g}", key.second)};
    for (const auto& kind : rec) {
      const auto it = by_model.find(kind);
      row.push_back(it == by_model.end() ? "not run"
                    : it->second->spread_borrowed
                        ? fmt::format("{:+.3f} (1 seed; ± half the widest seed range at this budget: {:+.3f} to {:+.3f})",
                                      it->second->range.mean, it->second->range.lo, it->second->range.hi)
                        : fmt::format("{:+.3f} ({:+.3f} to {:+.3f})", it->second->range.mean, it->second->range.lo,
                                      it->second->range.hi));
    }
    gap_table.rows.push_back(row);
  }

  // The context gains at the largest budget: per model and size, the loss at
  // short_context minus the loss at block, per seed.
  std::string context_summary;
  report::Table context_table{{"model"}, {}};
  {
    const Csv ctx(s.path("scale_context.csv"));
    const auto gains = context_gains(ctx, budgets.back());
    for (size_t j = 0; j < n_run; ++j) context_table.header.push_back(fmt::format("size {}", j + 1));
    for (const std::string& kind : c.models) {
      std::vector<std::string> row{kind};
      for (size_t j = 0; j < n_run; ++j) {
        const auto it = gains.at(kind).find(static_cast<int64_t>(j + 1));
        row.push_back(it == gains.at(kind).end() ? "not run" : format_range(range_of(it->second), 3));
      }
      context_table.rows.push_back(row);
      context_summary += fmt::format("{}{} {}", context_summary.empty() ? "" : ", ", kind, row.back());
    }
  }

  std::vector<std::string> limits;
  for (const auto& [kind, size] : c.scale_max_size)
    if (static_cast<size_t>(size) < n_run) limits.push_back(fmt::format("the {} stops at size {}", kind, size));
  fmt::print("\n{}\n{}\n{}\n{}\n{}\nloss at {} characters of context minus the loss at {} (nats/char; > 0: the longer "
             "context helps), at {}:\n{}",
             sweep_table.text(), table.text(), fit_table.text(), meetings, gap_table.text(), short_context, c.block,
             budget_name(budgets.back()), context_table.text());
  std::string md = fmt::format(
      "GPT at widths {} ({} blocks x {} heads; each about 4x the parameters of the last), the recurrent models "
      "matched to its parameter count at each; {} of these sizes run{}. Each size trains at {} {} tokens per GPT "
      "parameter (steps of {} x {} characters), from {} seeds ({} at the largest size), warm-up a tenth of the steps "
      "then cosine; val loss on {} fixed validation batches. {}\n\n"
      "**Learning rates.** Per model and size, a sweep from the first seed at {:g} tokens per parameter ({:g} of the "
      "largest budget), over {} and a grid step past an end while the best sits there ({} at most); the best "
      "rate trains every budget. {}\n\n{}\n"
      "*train FLOPs* are the GEMM FLOPs of one float32 training step, counted by the profiler, times the steps.\n\n{}\n"
      "**float32 against bfloat16 at the smallest size** (the same seeds in the other precision):\n\n{}\n"
      "**Power laws** L = A x^-α fitted per budget by least squares on log L against log x, every seed's run a "
      "point, only runs at the same tokens per parameter; ± is the standard error of α from the residuals.\n\n{}\n{}\n"
      "![scale](scale.png)\n\n"
      "**The gap** GPT's val loss minus each recurrence's, per seed (the same seed index), mean and min-max over the "
      "seeds (< 0: GPT better). Transformers scale better where the gap falls with size at a fixed budget.\n\n{}\n"
      "![gap](scale_gap.png)\n\n{}"
      "**Context at each size** (at {}). Every run above of the largest budget predicts the same {} validation "
      "characters given {} and given {} characters of its true context (the rest of the window from elsewhere, as "
      "part 3 does for part 1's models); the table gives the loss at {} minus the loss at {} in nats/char, mean and "
      "min-max over the seeds (> 0: the longer context helps).\n\n{}",
      fmt::join(c.scale_dims, ", "), c.gpt_layers, c.gpt_heads, n_run,
      limits.empty() ? "" : fmt::format(" ({})", fmt::join(limits, ", ")), budgets.size() > 1 ? "each of" : "",
      fmt::join(budgets, ", "), c.batch, c.block, c.seeds,
      std::min(c.scale_largest_seeds > 0 ? c.scale_largest_seeds : c.seeds, c.seeds), c.eval_batches,
      c.bf16 ? "Every size trains under bfloat16 autocast (--bf16)."
             : c.scale_bf16_from < static_cast<int64_t>(c.scale_dims.size())
                   ? fmt::format("Sizes {} and up train under bfloat16 autocast (*GEMMs*), float32 master weights.",
                                 c.scale_bf16_from + 1)
                   : std::string("Every size trains in float32."),
      sweep_budget, c.scale_sweep_fraction, fmt::join(c.lrs, ", "), kMaxExtraRates,
      edges.empty() ? "No chosen rate sits at an edge of the rates tried."
                    : fmt::format("At an edge of the rates tried even so: {}.", edges),
      sweep_table.markdown(), table.markdown(), check_md, fit_table.markdown(), meetings, gap_table.markdown(),
      estimate.empty() ? "" : estimate + "\n\n", budget_name(budgets.back()), c.context_batches * c.batch,
      short_context, c.block, short_context, c.block, context_table.markdown());
  return {fmt::format("at {}: loss ∝ params^-α: {}; float32 and bfloat16 at the smallest size: {}; context {}->{} at "
                      "the largest size: {}",
                      budget_name(budgets.back()), summary, check_summary, short_context, c.block, context_summary),
          md};
}

}  // namespace

PartOutput run_scale(Study& s) {
  const Config& c = s.c;
  const auto tok = part1_tokenizer(s);
  const int64_t V = tok->vocab_size();
  const Text& text = s.text();
  const std::vector<int64_t> val_ids = tok->encode(text.val);
  const data::LMBatches train_set(tok->encode(text.train), c.block), val_set(val_ids, c.block);
  const int64_t short_context = std::max<int64_t>(1, c.block / 8), n_targets = c.context_batches * c.batch;
  const int64_t tokens_per_step = c.batch * c.block;
  const size_t n_run = std::min<size_t>(static_cast<size_t>(c.scale_sizes), c.scale_dims.size());
  if (n_run < 2 && c.scale_dims.size() >= 2)
    throw std::invalid_argument("scale: --scale-sizes must be 2 or more (a power law needs two sizes)");
  std::vector<double> budgets = c.scale_tokens_per_param;
  std::sort(budgets.begin(), budgets.end());
  budgets.erase(std::unique(budgets.begin(), budgets.end()), budgets.end());
  if (budgets.empty()) throw std::invalid_argument("scale: --tokens-per-param needs at least one budget");
  for (const auto& [kind, size] : c.scale_max_size)
    if (size < 1 || std::find(c.models.begin(), c.models.end(), kind) == c.models.end())
      throw std::invalid_argument(fmt::format("scale: --scale-max-size {}={}: needs a model of --models and a size of 1 "
                                              "or more", kind, size));
  const double sweep_budget = c.scale_sweep_fraction * budgets.back();
  const int64_t largest_seeds = c.scale_largest_seeds > 0 ? std::min(c.scale_largest_seeds, c.seeds) : c.seeds;
  auto seeds_at = [&](size_t j) { return j + 1 == n_run ? largest_seeds : c.seeds; };
  // Whether kind trains at size j (--scale-max-size leaves the dearest out).
  auto runs = [&](const std::string& kind, size_t j) {
    const auto it = c.scale_max_size.find(kind);
    return j < n_run && (it == c.scale_max_size.end() || static_cast<int64_t>(j) < it->second);
  };
  const bool main_rank = dist::is_main();
  auto say = [&](const std::string& line) {
    if (main_rank) fmt::print("scale: {}\n", line);
  };

  Generator probe_gen(c.seed + 7);
  const data::LMBatch probe = train_set.sample(c.batch, probe_gen);
  std::vector<Model> models;  // every kind at every size; sizes not run only for the estimate
  for (const std::string& kind : c.models)
    for (size_t j = 0; j < c.scale_dims.size(); ++j) {
      Model m;
      m.kind = kind, m.size = j, m.config = c;
      m.config.gpt_dim = c.scale_dims[j];
      m.params_gpt = make_model(m.config, "gpt", V, c.block, c.seed)->num_parameters();
      auto probe_model = make_model(m.config, kind, V, c.block, c.seed);
      m.params = probe_model->num_parameters();
      m.shape = shape_of(*probe_model);
      if (j < n_run) m.flops_per_step = flops_per_step(*probe_model, probe);  // the sizes not run need none
      m.precision = c.bf16 || static_cast<int64_t>(j) >= c.scale_bf16_from ? DType::bf16 : DType::f32;
      models.push_back(m);
    }
  say(fmt::format("GPT widths {} ({} layers x {} heads; recurrent models matched), {} of them run; budgets {} tokens "
                  "per GPT parameter in steps of {} x {}; {} seeds ({} at the largest size run); learning rates swept "
                  "per model and size at {:g} tokens per parameter; {} rank(s)",
                  fmt::join(c.scale_dims, ", "), c.gpt_layers, c.gpt_heads, n_run, fmt::join(budgets, ", "), c.batch,
                  c.block, c.seeds, largest_seeds, sweep_budget, dist::world_size()));

  auto next = [&](Generator& g) { return train_set.sample(c.batch, g); };
  auto lm_loss = [](models::LanguageModel& m, const data::LMBatch& b) { return m.loss(b.inputs, b.targets); };
  const std::string rank_prefix = dist::world_size() > 1 ? fmt::format("[{}] ", dist::rank()) : "";
  auto run_cell = [&](const Cell& cell) {
    const Model& m = *cell.model;
    const uint64_t seed = run_seed(c, cell.seed_index);
    auto model = make_model(m.config, m.kind, V, c.block, seed);
    const bool fit = cell.role == "fit";
    TrainSpec spec{.label = fmt::format("{}{} {} {} {} {}", rank_prefix, m.kind, report::format_count(
                                            static_cast<double>(m.params)), budget_name(cell.tokens_per_param),
                                        precision_name(cell.precision),
                                        cell.role == "sweep" ? "lr " + format_lr(cell.lr)
                                                             : fmt::format("seed {}", cell.seed_index)),
                   .precision = cell.precision, .lr = cell.lr, .steps = cell.steps,
                   .warmup = std::max<int64_t>(1, cell.steps / 10),
                   .eval_every = fit ? std::max<int64_t>(1, cell.steps / c.scale_evals) : cell.steps,
                   .tokens_per_step = tokens_per_step, .seed = seed + 1};
    TrainResult r = train(*model, spec, next, lm_loss, [&] { return validation_loss(*model, val_set, c.eval_batches, c.batch); });
    std::string out;
    add_row(out, "scale.csv", fmt::format("{},{},{},{},{:g},{},{},{:.6e},{},{:.6g},{},{},{:.6f},{:.2f}", m.kind,
                                          m.size + 1, m.config.gpt_dim, m.params, cell.tokens_per_param,
                                          cell.steps * tokens_per_step, cell.steps,
                                          m.flops_per_step * static_cast<double>(cell.steps), seed, cell.lr,
                                          precision_name(cell.precision), cell.role, r.curve.back().val_loss, r.seconds));
    if (fit) {
      // Scored at the largest budget only: the one the gains are read at.
      if (cell.tokens_per_param == budgets.back())
        for (int64_t t : {short_context, c.block})
          add_row(out, "scale_context.csv",
                  fmt::format("{},{},{},{:g},{},{},{},{:.6f},{}", m.kind, m.size + 1, m.params, cell.tokens_per_param,
                              seed, precision_name(cell.precision), t,
                              loss_given_context(*model, val_ids, t, c.block, n_targets), n_targets));
      for (const CurvePoint& p : r.curve)
        add_row(out, "scale_curves.csv", fmt::format("{},{},{},{:g},{},{},{:.0f},{:.6f}", m.kind, m.size + 1, m.params,
                                                     cell.tokens_per_param, seed, p.step, p.tokens, p.val_loss));
    }
    return out;
  };
  // A cell's cost when dealt over the ranks: parameters x steps, proportional to its FLOPs.
  auto cost_of = [](const Cell& cl) { return static_cast<double>(cl.model->params) * static_cast<double>(cl.steps); };
  // The val loss of a cell's result (scale.csv's 13th column).
  auto val_loss_of = [](const std::string& result) {
    std::string row = result.substr(result.find('\t') + 1);
    row = row.substr(0, row.find('\n'));
    size_t pos = 0;
    for (int k = 0; k < 12; ++k) pos = row.find(',', pos) + 1;
    return std::stod(row.substr(pos, row.find(',', pos) - pos));
  };

  // The learning rates and the training runs, in rounds of cells. Per model
  // and size, a sweep over --lrs from the first seed, extended past an end
  // while the best sits there; once its sweep has settled, the model trains
  // at every budget from its seeds at the rate chosen, and the smallest size
  // also in the other precision. A round deals its sweep runs first; while
  // sweeps remain undecided, training runs join a round only where they fit
  // beside its sweep runs on a rank that would otherwise wait for the round's
  // longest rank, and the last round runs all that are left. So a late sweep
  // does not hold a long training run back to a round of its own, and on one
  // rank the rounds are the sweeps' alone. The rows go out in an order no
  // deal changes: the sweeps' round by round, then the training runs in the
  // order their models settled.
  std::map<size_t, Sweep> sweeps;  // by index into models
  std::vector<std::pair<size_t, double>> pending;
  std::vector<Cell> training;                     // every training run planned so far
  std::vector<std::string> sweep_results, trained;  // trained: by index into training
  std::vector<size_t> waiting;                    // indices into training not yet run
  std::vector<double> grid = c.lrs;
  std::sort(grid.begin(), grid.end());
  grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
  for (size_t k = 0; k < models.size(); ++k)
    if (runs(models[k].kind, models[k].size))
      for (double lr : grid) pending.push_back({k, lr});
  auto settle = [&](size_t k) {
    const Model& m = models[k];
    const double lr = sweeps.at(k).lrs[sweeps.at(k).best];
    const size_t first = training.size();
    for (double b : budgets) {
      const int64_t steps = steps_for(b, m.params_gpt, tokens_per_step);
      for (int64_t i = 0; i < seeds_at(m.size); ++i)
        training.push_back({.model = &m, .role = "fit", .tokens_per_param = b, .lr = lr, .seed_index = i,
                            .steps = steps, .precision = m.precision});
      if (m.size == 0)
        for (int64_t i = 0; i < seeds_at(m.size); ++i)
          training.push_back({.model = &m, .role = "check", .tokens_per_param = b, .lr = lr, .seed_index = i,
                              .steps = steps, .precision = m.precision == DType::bf16 ? DType::f32 : DType::bf16});
    }
    for (size_t t = first; t < training.size(); ++t) waiting.push_back(t);
  };
  for (int round = 0; !pending.empty() || !waiting.empty(); ++round) {
    std::vector<Cell> cells;
    for (const auto& [k, lr] : pending)
      cells.push_back({.model = &models[k], .role = "sweep", .tokens_per_param = sweep_budget, .lr = lr,
                       .steps = steps_for(sweep_budget, models[k].params_gpt, tokens_per_step),
                       .precision = models[k].precision});
    std::vector<double> cost, load(static_cast<size_t>(dist::world_size()), 0.0);
    for (const Cell& cl : cells) cost.push_back(cost_of(cl));
    std::vector<size_t> rank_of = deal_cells(cost, load);
    const double cap = pending.empty() ? std::numeric_limits<double>::infinity()
                                       : *std::max_element(load.begin(), load.end());
    std::vector<double> waiting_cost;
    for (size_t t : waiting) waiting_cost.push_back(cost_of(training[t]));
    const std::vector<size_t> waiting_rank = deal_cells(waiting_cost, load, cap);
    std::vector<size_t> taken, still_waiting;
    for (size_t i = 0; i < waiting.size(); ++i)
      if (waiting_rank[i] == kUndealt) {
        still_waiting.push_back(waiting[i]);
      } else {
        cells.push_back(training[waiting[i]]), rank_of.push_back(waiting_rank[i]), taken.push_back(waiting[i]);
      }
    say(fmt::format("round {}: {} sweep runs, {} training runs", round + 1, pending.size(), taken.size()));
    const auto out = run_cells(rank_of, [&](size_t i) { return run_cell(cells[i]); });
    for (size_t i = 0; i < pending.size(); ++i) {
      sweeps[pending[i].first].add(pending[i].second, val_loss_of(out[i]));
      sweep_results.push_back(out[i]);
    }
    trained.resize(training.size());
    for (size_t i = 0; i < taken.size(); ++i) trained[taken[i]] = out[pending.size() + i];
    waiting = still_waiting;
    std::set<size_t> was_pending;
    for (const auto& p : pending) was_pending.insert(p.first);
    pending.clear();
    for (size_t k : was_pending) {
      Sweep& sw = sweeps.at(k);
      if (auto lr = sw.next(kMaxExtraRates))
        pending.push_back({k, *lr}), ++sw.extra;
      else
        settle(k);
    }
  }
  std::vector<std::string> results = sweep_results;
  results.insert(results.end(), trained.begin(), trained.end());

  // Seconds per step of the sizes not run (for the estimate below), timed
  // on the ranks as the cells are.
  std::vector<const Model*> not_run;
  std::vector<double> not_run_cost;
  for (const Model& m : models)
    if (m.size >= n_run) not_run.push_back(&m), not_run_cost.push_back(static_cast<double>(m.params));
  const auto per_step_of = run_cells(not_run_cost, [&](size_t i) {
    auto timed = make_model(not_run[i]->config, not_run[i]->kind, V, c.block, c.seed);
    return fmt::format("{:.9g}", seconds_per_step(*timed, probe, not_run[i]->precision, 3));
  });
  if (!main_rank) return {};

  std::map<std::string, std::string> files = {
      {"scale.csv", "model,size,gpt_dim,params,tokens_per_param,tokens,steps,train_flops,seed,lr,dtype,role,val_loss,"
                    "seconds\n"},
      {"scale_context.csv", "model,size,params,tokens_per_param,seed,dtype,context,val_loss,targets\n"},
      {"scale_curves.csv", "model,size,params,tokens_per_param,seed,step,tokens,val_loss\n"}};
  for (const std::string& result : results) {
    std::istringstream in(result);
    for (std::string line; std::getline(in, line);) {
      const size_t tab = line.find('\t');
      files.at(line.substr(0, tab)) += line.substr(tab + 1) + "\n";
    }
  }
  for (const auto& [name, body] : files) report::write_file(s.path(name), body);

  // What every size would take here: the sizes run as they took now (in one
  // process: the seconds of every rank's runs added), the others from a few
  // timed steps.
  std::string estimate;
  if (n_run < c.scale_dims.size()) {
    double seconds = 0;
    const Csv back(s.path("scale.csv"));
    for (size_t r = 0; r < back.size(); ++r) seconds += back.num(r, "seconds");
    std::vector<std::string> parts;
    for (size_t i = 0; i < not_run.size(); ++i) {
      const Model& m = *not_run[i];
      const double per_step = std::stod(per_step_of[i]);
      const int64_t seeds = m.size + 1 == c.scale_dims.size() ? largest_seeds : c.seeds;
      int64_t steps = static_cast<int64_t>(grid.size()) * steps_for(sweep_budget, m.params_gpt, tokens_per_step);
      for (double b : budgets) steps += seeds * steps_for(b, m.params_gpt, tokens_per_step);
      seconds += per_step * static_cast<double>(steps);
      parts.push_back(fmt::format("{} size {} ({} parameters, {}): {}", m.kind, m.size + 1,
                                  report::format_count(static_cast<double>(m.params)), precision_name(m.precision),
                                  report::format_duration(per_step * static_cast<double>(steps))));
    }
    estimate = fmt::format("Estimated time of this part with all {} sizes (`--scale-sizes {}`) at these budgets and "
                           "seeds, in one process on this machine at load average {}: {} (the sizes run as they took "
                           "now; from 3 timed steps, the sweeps' {} rates and every seed: {}).",
                           c.scale_dims.size(), c.scale_dims.size(), load_average(), report::format_duration(seconds),
                           grid.size(), fmt::join(parts, "; "));
    say(estimate);
  }
  return scale_report(s, models, sweeps, budgets, n_run, sweep_budget, short_context, estimate);
}

}  // namespace tg::study
