// Part scale: does the transformer's loss fall faster with size than the
// recurrences'? The three models at GPT widths each about twice the last
// (so about 4x the parameters; the recurrent models matched to GPT at each),
// each trained on a token budget proportional to its size, from every seed;
// validation loss against parameters and against training FLOPs, a power
// law fitted per model on each axis (fit.h), and where GPT's fit would meet
// each recurrence's. And at every size, what block characters of context are
// worth over block/8 (16 of the default 128) to each trained model
// (loss_given_context, as part 3 measures it for part 1's models): does the
// gain grow with size, and is GPT's larger than a recurrence's at the largest?
//
// Training FLOPs are counted, not modelled: the GEMM work of one float32
// training step (forward, loss, backward; the optimizer does no GEMM),
// read from the profiler's counter (every GEMM of the library goes through
// autograd/blas.cpp, which adds 2 M N K), times the steps.
#include <chrono>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/profiler.h"
#include "data/tokenizer.h"
#include "examples/study/fit.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

// The learning rate part 1's sweep chose for kind.
double chosen_lr(const Study& s, const std::string& kind) {
  const Csv sweep(from_tuning(s, "sweep.csv"));
  for (size_t r = 0; r < sweep.size(); ++r)
    if (sweep.str(r, "model") == kind && sweep.str(r, "chosen") == "1") return sweep.num(r, "lr");
  throw std::runtime_error(fmt::format("{} has no chosen rate for {}: rerun part 1 with the same --models",
                                       s.path("sweep.csv"), kind));
}

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

struct Size {
  int64_t dim = 0, params_gpt = 0, steps = 0;
  DType precision = DType::f32;
};

// "bf16" or "f32", as the CSV files say it.
std::string precision_name(DType d) { return d == DType::bf16 ? "bf16" : "f32"; }

}  // namespace

std::map<std::string, PowerLaw> scale_fits(const Csv& csv, const std::string& x_column) {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> points;
  for (size_t r = 0; r < csv.size(); ++r) {
    if (csv.str(r, "role") != "fit") continue;
    auto& [x, y] = points[csv.str(r, "model")];
    x.push_back(csv.num(r, x_column));
    y.push_back(csv.num(r, "val_loss"));
  }
  std::map<std::string, PowerLaw> fits;
  for (const auto& [model, xy] : points) fits[model] = fit_power_law(xy.first, xy.second);
  return fits;
}

std::map<std::string, std::map<int64_t, std::vector<double>>> context_gains(const Csv& csv) {
  // model -> size -> seed -> context -> loss
  std::map<std::string, std::map<int64_t, std::map<std::string, std::map<double, double>>>> loss;
  for (size_t r = 0; r < csv.size(); ++r)
    loss[csv.str(r, "model")][static_cast<int64_t>(csv.num(r, "size"))][csv.str(r, "seed")][csv.num(r, "context")] =
        csv.num(r, "val_loss");
  std::map<std::string, std::map<int64_t, std::vector<double>>> gains;
  for (const auto& [model, sizes] : loss)
    for (const auto& [size, seeds] : sizes)
      for (const auto& [seed, by_t] : seeds)
        gains[model][size].push_back(by_t.begin()->second - by_t.rbegin()->second);
  return gains;
}

PartOutput run_scale(Study& s) {
  const Config& c = s.c;
  const auto tok = data::load_tokenizer(from_tuning(s, "tokenizer.json"));
  const int64_t V = tok->vocab_size();
  const Text& text = s.text();
  const std::vector<int64_t> val_ids = tok->encode(text.val);
  const data::LMBatches train_set(tok->encode(text.train), c.block), val_set(val_ids, c.block);
  const int64_t short_context = std::max<int64_t>(1, c.block / 8), n_targets = c.context_batches * c.batch;
  const int64_t tokens_per_step = c.batch * c.block;
  const size_t n_run = std::min<size_t>(static_cast<size_t>(c.scale_sizes), c.scale_dims.size());
  if (n_run < 2 && c.scale_dims.size() >= 2)
    throw std::invalid_argument("scale: --scale-sizes must be 2 or more (a power law needs two sizes)");
  std::map<std::string, double> lr;
  for (const std::string& kind : c.models) lr[kind] = chosen_lr(s, kind);

  std::vector<Size> sizes;
  for (size_t j = 0; j < c.scale_dims.size(); ++j) {
    Config cj = c;
    cj.gpt_dim = c.scale_dims[j];
    Size z{.dim = cj.gpt_dim, .params_gpt = make_model(cj, "gpt", V, c.block, c.seed)->num_parameters()};
    z.steps = std::max<int64_t>(1, std::llround(c.scale_tokens_per_param * static_cast<double>(z.params_gpt) /
                                                static_cast<double>(tokens_per_step)));
    z.precision = c.bf16 || static_cast<int64_t>(j) >= c.scale_bf16_from ? DType::bf16 : DType::f32;
    sizes.push_back(z);
  }
  fmt::print("scale: GPT widths {} ({} layers x {} heads; recurrent models matched), {} of them run; {} tokens per "
             "GPT parameter in steps of {} x {}; {} seeds; learning rates part 1's\n",
             fmt::join(c.scale_dims, ", "), c.gpt_layers, c.gpt_heads, n_run, c.scale_tokens_per_param, c.batch,
             c.block, c.seeds);

  auto next = [&](Generator& g) { return train_set.sample(c.batch, g); };
  auto lm_loss = [](models::LanguageModel& m, const data::LMBatch& b) { return m.loss(b.inputs, b.targets); };
  Generator probe_gen(c.seed + 7);
  const data::LMBatch probe = train_set.sample(c.batch, probe_gen);

  std::string csv = "model,size,gpt_dim,params,tokens,steps,train_flops,seed,dtype,role,val_loss,seconds\n";
  report::Table table{{"model", "size", "shape", "params", "tokens", "train FLOPs", "GEMMs",
                         fmt::format("val loss, mean (min-max of {} seeds)", c.seeds), "time per run"}, {}};
  std::string check_md, check_summary;
  std::string context_csv = "model,size,params,seed,dtype,context,val_loss,targets\n";
  report::Table context_table{{"model"}, {}};
  for (size_t j = 0; j < n_run; ++j)
    context_table.header.push_back(fmt::format("size {} ({})", j + 1,
                                               report::format_count(static_cast<double>(sizes[j].params_gpt))));
  double full_seconds = 0;  // the estimate of every size, seeds and check runs included
  std::vector<std::string> estimate_rows;
  for (const std::string& kind : c.models) {
    for (size_t j = 0; j < sizes.size(); ++j) {
      const Size& z = sizes[j];
      Config cj = c;
      cj.gpt_dim = z.dim;
      auto probe_model = make_model(cj, kind, V, c.block, c.seed);
      const int64_t params = probe_model->num_parameters();
      const double flops = flops_per_step(*probe_model, probe) * static_cast<double>(z.steps);
      const std::string shape = shape_of(*probe_model);
      if (j >= n_run) {
        // Not run: its time from a few timed steps, for the estimate of --full.
        const double per_run = seconds_per_step(*probe_model, probe, z.precision, 3) * static_cast<double>(z.steps);
        full_seconds += per_run * static_cast<double>(c.seeds);
        estimate_rows.push_back(fmt::format("{} size {} ({} parameters, {}): {} per run (from 3 timed steps)", kind,
                                            j + 1, report::format_count(static_cast<double>(params)),
                                            precision_name(z.precision), report::format_duration(per_run)));
        continue;
      }
      // Run i of the seeds at precision p: its final validation loss and seconds.
      auto train_run = [&](int64_t i, DType p, const std::string& role) {
        auto m = make_model(cj, kind, V, c.block, run_seed(c, i));
        TrainSpec spec{.label = fmt::format("{} {} {} seed {}", kind, report::format_count(static_cast<double>(params)),
                                            precision_name(p), i),
                       .precision = p, .lr = lr.at(kind), .steps = z.steps,
                       .warmup = std::max<int64_t>(1, z.steps / 10), .eval_every = z.steps,
                       .tokens_per_step = tokens_per_step, .seed = run_seed(c, i) + 1};
        TrainResult r = train(*m, spec, next, lm_loss, [&] { return validation_loss(*m, val_set, c.eval_batches, c.batch); });
        const double v = r.curve.back().val_loss;
        if (role == "fit")
          for (int64_t t : {short_context, c.block})
            context_csv += fmt::format("{},{},{},{},{},{},{:.6f},{}\n", kind, j + 1, params, run_seed(c, i),
                                       precision_name(p), t, loss_given_context(*m, val_ids, t, c.block, n_targets),
                                       n_targets);
        csv += fmt::format("{},{},{},{},{},{},{:.6e},{},{},{},{:.6f},{:.2f}\n", kind, j + 1, z.dim, params,
                           z.steps * tokens_per_step, z.steps, flops, run_seed(c, i), precision_name(p), role, v, r.seconds);
        full_seconds += r.seconds;
        return std::make_pair(v, r.seconds);
      };
      std::vector<double> losses, seconds;
      for (int64_t i = 0; i < c.seeds; ++i) {
        auto [v, sec] = train_run(i, z.precision, "fit");
        losses.push_back(v), seconds.push_back(sec);
      }
      const Range l = range_of(losses);
      table.rows.push_back({kind, std::to_string(j + 1), shape, report::format_count(static_cast<double>(params)),
                            report::format_count(static_cast<double>(z.steps * tokens_per_step)),
                            fmt::format("{:.2e}", flops), z.precision == DType::bf16 ? "bfloat16 (autocast)" : "float32",
                            format_range(l, 3), report::format_duration(range_of(seconds).mean)});
      if (j == 0) {
        // The smallest size again in the other precision: bfloat16's rounding
        // must change the loss by less than the seeds do.
        const DType other = z.precision == DType::bf16 ? DType::f32 : DType::bf16;
        std::vector<double> other_losses;
        for (int64_t i = 0; i < c.seeds; ++i) other_losses.push_back(train_run(i, other, "check").first);
        const Range o = range_of(other_losses);
        const Range& f32 = z.precision == DType::f32 ? l : o;
        const Range& bf16 = z.precision == DType::f32 ? o : l;
        const double gap = std::fabs(bf16.mean - f32.mean), spread_max = std::max(f32.hi - f32.lo, bf16.hi - bf16.lo);
        const bool agree = gap <= spread_max;
        const std::string line = fmt::format(
            "{}: float32 {}, bfloat16 {}; means {:.3f} apart, the larger seed range {:.3f}: {}", kind,
            format_range(f32, 3), format_range(bf16, 3), gap, spread_max,
            agree ? "agree within the seed spread" : "DO NOT agree within the seed spread");
        fmt::print("scale: smallest size, {}\n", line);
        check_md += "- " + line + "\n";
        check_summary += fmt::format("{}{} {}", check_summary.empty() ? "" : ", ", kind, agree ? "agree" : "differ");
      }
    }
  }
  report::write_file(s.path("scale.csv"), csv);
  report::write_file(s.path("scale_context.csv"), context_csv);

  // The context gains, from the file just written: per model and size, the
  // loss at short_context minus the loss at block, per seed.
  std::string context_summary;
  {
    const Csv ctx(s.path("scale_context.csv"));
    const auto gains = context_gains(ctx);
    for (const std::string& kind : c.models) {
      std::vector<std::string> row{kind};
      for (const auto& [size, by_seed] : gains.at(kind)) row.push_back(format_range(range_of(by_seed), 3));
      context_table.rows.push_back(row);
      context_summary += fmt::format("{}{} {}", context_summary.empty() ? "" : ", ", kind, row.back());
    }
  }

  // The fits, from the file just written (as the verdicts read them).
  const Csv back(s.path("scale.csv"));
  const auto by_params = scale_fits(back, "params"), by_flops = scale_fits(back, "train_flops");
  std::string fit_csv = "model,axis,exponent,exponent_se,log10_loss_at_mean,log10_loss_at_mean_se,log10_x_mean,points\n";
  report::Table fit_table{{"model", "loss against parameters: exponent", "loss against training FLOPs: exponent"}, {}};
  Panel p_panel{.title = "validation loss against parameters", .xlabel = "parameters", .ylabel = "val loss (nats/char)",
                .logx = true, .logy = true};
  Panel f_panel{.title = "validation loss against training FLOPs", .xlabel = "training FLOPs (GEMMs)",
                .ylabel = "val loss (nats/char)", .logx = true, .logy = true};
  std::string summary;
  for (const std::string& kind : c.models) {
    for (auto [axis, fits, panel] : {std::tuple{"params", &by_params, &p_panel}, std::tuple{"train_flops", &by_flops, &f_panel}}) {
      const PowerLaw& f = fits->at(kind);
      fit_csv += fmt::format("{},{},{:.6f},{:.6f},{:.6f},{:.6f},{:.6f},{}\n", kind, axis, -f.b, f.se_b, f.a, f.se_a,
                             f.xbar, f.n);
      // Points: each size's mean with its seeds' min-max; the fit as a line over the sizes run.
      std::map<double, std::vector<double>> at_x;
      for (size_t r = 0; r < back.size(); ++r)
        if (back.str(r, "model") == kind && back.str(r, "role") == "fit")
          at_x[back.num(r, axis)].push_back(back.num(r, "val_loss"));
      Series pts{"", {}, {}, kind, Series::points}, line{fmt::format("{}: L ∝ x^-{:.3f}", kind, -f.b), {}, {}, kind, Series::line};
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
    fit_table.rows.push_back({kind, fmt::format("{:.3f} ± {:.3f}", -by_params.at(kind).b, by_params.at(kind).se_b),
                              fmt::format("{:.3f} ± {:.3f}", -by_flops.at(kind).b, by_flops.at(kind).se_b)});
    summary += fmt::format("{}{} α {:.3f}±{:.3f}", summary.empty() ? "" : ", ", kind, -by_params.at(kind).b,
                           by_params.at(kind).se_b);
  }
  report::write_file(s.path("scale_fit.csv"), fit_csv);
  if (std::string why = plot(s.path("scale.png"), {p_panel, f_panel}, 1300, 520); !why.empty())
    fmt::print("scale: no plot: {}\n", why);

  // Where GPT's fits meet the recurrences' (log10 x with its standard error).
  std::string meetings;
  if (by_params.count("gpt"))
    for (const std::string& kind : c.models) {
      if (kind == "gpt") continue;
      for (auto [name, fits] : {std::pair{"parameters", &by_params}, std::pair{"training FLOPs", &by_flops}}) {
        const auto m = meeting(fits->at("gpt"), fits->at(kind));
        meetings += m ? fmt::format("- GPT and the {} in {}: the fits meet at 10^{:.2f} ± {:.2f} = {:.2g} {} (1σ {:.2g} "
                                    "to {:.2g})\n", kind, name, m->log10x, m->se, std::pow(10.0, m->log10x), name,
                                    std::pow(10.0, m->log10x - m->se), std::pow(10.0, m->log10x + m->se))
                       : fmt::format("- GPT and the {} in {}: equal exponents, the fits never meet\n", kind, name);
      }
    }

  // What --full would take here: the other parts as they took now, every size.
  double other_parts = 0;
  if (Csv::exists(s.path("times.csv"))) {
    const Csv t(s.path("times.csv"));
    for (size_t r = 0; r < t.size(); ++r)
      if (t.str(r, "part") != "scale") other_parts += t.num(r, "seconds");
  }
  std::string estimate;
  if (n_run < sizes.size()) {
    estimate = fmt::format("Estimated time of `scripts/main.sh --full` (all {} sizes, {} seeds) on this machine at "
                           "load average {}: {} for this part (the sizes run as they took now; {}), {} with the other "
                           "parts as they took in this output directory.",
                           sizes.size(), c.seeds, load_average(), report::format_duration(full_seconds),
                           fmt::join(estimate_rows, "; "), report::format_duration(full_seconds + other_parts));
    fmt::print("scale: {}\n", estimate);
  }

  fmt::print("\n{}\n{}\n{}\nloss at {} characters of context minus the loss at {} (nats/char; > 0: the longer "
             "context helps):\n{}",
             table.text(), fit_table.text(), meetings, short_context, c.block, context_table.text());
  std::string md = fmt::format(
      "GPT at widths {} ({} blocks x {} heads; each about 4x the parameters of the last), the RNN and LSTM matched to "
      "its parameter count at each; {} of these sizes run. Each size is trained on {} tokens per GPT parameter "
      "(steps of {} x {} characters), from each of {} seeds, at the learning rate part 1's sweep chose for the model "
      "(no sweep per size), warm-up a tenth of the steps then cosine; val loss on {} fixed validation batches. "
      "*train FLOPs* are the GEMM FLOPs of one float32 training step, counted by the profiler, times the steps. "
      "{}\n\n{}\n"
      "**float32 against bfloat16 at the smallest size** (the same seeds in the other precision):\n\n{}\n"
      "**Power laws** L = A x^-α fitted by least squares on log L against log x, every seed's run a point; "
      "± is the standard error of α from the residuals (0 with one point per size and two sizes).\n\n{}\n{}\n{}\n"
      "![scale](scale.png)\n\n"
      "**Context at each size.** Every run above of role fit predicts the same {} validation characters given {} and "
      "given {} characters of its true context (the rest of the window from elsewhere, as part 3 does for part 1's models); the table gives the loss at {} minus the "
      "loss at {} in nats/char, mean and min-max over the seeds (> 0: the longer context helps).\n\n{}",
      fmt::join(c.scale_dims, ", "), c.gpt_layers, c.gpt_heads, n_run, c.scale_tokens_per_param, c.batch, c.block,
      c.seeds, c.eval_batches,
      c.bf16 ? "Every size trains under bfloat16 autocast (--bf16)."
             : c.scale_bf16_from < static_cast<int64_t>(sizes.size())
                   ? fmt::format("Sizes {} and up train under bfloat16 autocast (*GEMMs*), float32 master weights.",
                                 c.scale_bf16_from + 1)
                   : std::string("Every size trains in float32."),
      table.markdown(), check_md, fit_table.markdown(), meetings,
      estimate.empty() ? "" : estimate + "\n", n_targets, short_context, c.block, short_context, c.block,
      context_table.markdown());
  return {fmt::format("loss ∝ params^-α: {}; float32 and bfloat16 at the smallest size: {}; context {}->{} at the "
                      "largest size: {}",
                      summary, check_summary, short_context, c.block, context_summary),
          md};
}

}  // namespace tg::study
