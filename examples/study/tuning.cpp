// Part 1, fair tuning: every model gets the same recipe and token budget, and
// its own learning rate, the best of a short sweep. Then the full run, with
// validation loss recorded against tokens and against training seconds.
#include <cmath>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/tokenizer.h"
#include "examples/study/fit.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "models/generate.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {

PartOutput run_tuning(Study& s) {
  const Config& c = s.c;
  const Text& text = s.text();
  const data::CharTokenizer tok = data::CharTokenizer::build(text.train + text.val);
  tok.save(s.path("tokenizer.json"));
  const int64_t V = tok.vocab_size();
  const data::LMBatches train_set(tok.encode(text.train), c.block), val_set(tok.encode(text.val), c.block);
  const int64_t tokens_per_step = c.batch * c.block;
  const std::string dtype = part_dtype(c, "tuning");
  fmt::print("tuning: {} — {} / {} training / validation characters, vocabulary {}; {} steps x {} x {} = {:.2f}M "
             "characters per model and seed, {} seeds; learning rates {} tried for {} steps each\n",
             text.source, train_set.num_tokens(), val_set.num_tokens(), V, c.steps, c.batch, c.block,
             c.steps * tokens_per_step / 1e6, c.seeds, fmt::join(c.lrs, ", "), c.sweep_steps);

  // The same batches for every model and learning rate at a seed (the generator is seeded per run).
  auto next = [&](Generator& g) { return train_set.sample(c.batch, g); };
  auto lm_loss = [](models::LanguageModel& m, const data::LMBatch& b) { return m.loss(b.inputs, b.targets); };
  // Run i of the seeds: its own initialisation and batch order.
  auto run = [&](const std::string& kind, double lr, int64_t steps, const std::string& label, int64_t i) {
    auto m = make_model(c, kind, V, c.block, run_seed(c, i));
    TrainSpec spec{.label = label, .precision = gemm_precision(c), .lr = lr, .steps = steps,
                   .warmup = std::max<int64_t>(1, c.warmup * steps / c.steps),
                   .eval_every = std::min(c.eval_every, steps), .tokens_per_step = tokens_per_step,
                   .seed = run_seed(c, i) + 1};
    TrainResult r = train(*m, spec, next, lm_loss, [&] { return validation_loss(*m, val_set, c.eval_batches, c.batch); });
    return std::make_pair(m, r);
  };

  std::string sweep_csv = "model,lr,steps,val_loss,chosen,dtype\n";
  std::string curve_csv = "model,seed,lr,step,tokens,seconds,train_loss,val_loss,dtype\n";
  std::string samples, chosen_text, final_text, edges;
  report::Table table{{"model", "shape", "params", fmt::format("val loss after {} steps, by lr", c.sweep_steps), "lr",
                         fmt::format("val loss, mean (min-max of {} seeds)", c.seeds), "bits/char", "tokens/s", "peak MiB",
                         "train time"}, {}};
  Panel sweep{.title = "learning-rate sweep", .xlabel = "learning rate",
              .ylabel = fmt::format("val loss after {} steps", c.sweep_steps), .logx = true};
  Panel by_tokens{.title = "validation loss against tokens", .xlabel = "training tokens (millions of characters)",
                  .ylabel = "val loss (nats/char)"};
  Panel by_seconds{.title = "validation loss against training time", .xlabel = "training seconds",
                   .ylabel = "val loss (nats/char)"};
  const std::string prompt = text.val.substr(0, std::min<size_t>(text.val.size(), 24));
  for (const std::string& kind : c.models) {
    const Sweep sw = sweep_lr(c.lrs, [&](double lr) {
      return run(kind, lr, c.sweep_steps, fmt::format("{} lr {}", kind, format_lr(lr)), 0).second.curve.back().val_loss;
    });
    const double lr = sw.lrs[sw.best];
    std::string sweep_cell;
    for (size_t i = 0; i < sw.lrs.size(); ++i) {
      sweep_csv += fmt::format("{},{},{},{:.6f},{},{}\n", kind, sw.lrs[i], c.sweep_steps, sw.losses[i],
                               i == sw.best ? 1 : 0, dtype);
      sweep_cell += fmt::format("{}{} {:.3f}{}", i ? ", " : "", format_lr(sw.lrs[i]), sw.losses[i], i == sw.best ? "*" : "");
    }
    sweep.series.push_back({kind, sw.lrs, sw.losses, kind});

    // The full run from every seed, at the rate the first seed's sweep chose.
    std::vector<TrainResult> runs;
    std::shared_ptr<models::LanguageModel> first;
    for (int64_t i = 0; i < c.seeds; ++i) {
      auto [m, r] = run(kind, lr, c.steps, c.seeds > 1 ? fmt::format("{} seed {}", kind, i) : kind, i);
      for (const CurvePoint& p : r.curve)
        curve_csv += fmt::format("{},{},{},{},{},{:.6f},{:.6f},{:.6f},{}\n", kind, run_seed(c, i), lr, p.step, p.tokens,
                                 p.seconds, p.train_loss, p.val_loss, dtype);
      save_model(*m, s.path(model_file(kind, i)), {{"lr", fmt::format("{}", lr)}, {"steps", std::to_string(c.steps)},
                                                   {"gemm_dtype", dtype}, {"seed", std::to_string(run_seed(c, i))}});
      if (i == 0) first = m;
      runs.push_back(std::move(r));
    }
    // The curves' mean over the seeds, the band their min and max (the runs
    // evaluate at the same steps; seconds are the runs' mean).
    Series st{kind + " (lr " + format_lr(lr) + ")", {}, {}, kind, Series::line}, ss = st;
    for (size_t p = 0; p < runs[0].curve.size(); ++p) {
      std::vector<double> losses, seconds;
      for (const TrainResult& r : runs)
        if (p < r.curve.size()) losses.push_back(r.curve[p].val_loss), seconds.push_back(r.curve[p].seconds);
      const Range l = range_of(losses);
      st.x.push_back(runs[0].curve[p].tokens / 1e6), ss.x.push_back(range_of(seconds).mean);
      for (Series* x : {&st, &ss}) x->y.push_back(l.mean), x->ylo.push_back(l.lo), x->yhi.push_back(l.hi);
    }
    by_tokens.series.push_back(st);
    by_seconds.series.push_back(ss);
    Generator sample_gen(c.seed + 2);
    const auto ids = models::generate(*first, tok.encode(prompt), {.max_new_tokens = 300, .temperature = 0.8}, sample_gen);
    samples += fmt::format("=== {} (lr {}, seed {}) ===\n{}{}\n\n", kind, format_lr(lr), c.seed, prompt, tok.decode(ids));
    std::vector<double> finals, rates, peaks, times;
    for (const TrainResult& r : runs) {
      finals.push_back(r.curve.back().val_loss);
      rates.push_back(c.steps * tokens_per_step / r.seconds);
      peaks.push_back(r.peak_bytes / 1048576.0);
      times.push_back(r.seconds);
    }
    const Range vl = range_of(finals);
    table.rows.push_back({kind, shape_of(*first), std::to_string(first->num_parameters()), sweep_cell, format_lr(lr),
                          format_range(vl, 3), fmt::format("{:.3f}", vl.mean / std::log(2.0)),
                          report::format_count(range_of(rates).mean), fmt::format("{:.1f}", range_of(peaks).hi),
                          report::format_duration(range_of(times).mean)});
    chosen_text += fmt::format("{}{} {}", chosen_text.empty() ? "" : ", ", kind, format_lr(lr));
    final_text += fmt::format("{}{} {}", final_text.empty() ? "" : ", ", kind, format_range(vl, 3));
    if (sw.at_edge()) {
      edges += fmt::format(" {}'s best learning rate, {}, is still the {} tried: a rate beyond it might do better.",
                           kind, format_lr(lr), sw.best == 0 ? "smallest" : "largest");
      fmt::print("tuning: {}'s best learning rate {} is still at the edge of the rates tried {}\n", kind,
                 format_lr(lr), fmt::join(sw.lrs, ", "));
    }
  }
  report::write_file(s.path("sweep.csv"), sweep_csv);
  report::write_file(s.path("tuning.csv"), curve_csv);
  report::write_file(s.path("samples.txt"), samples);
  std::string why = plot(s.path("loss.png"), {sweep, by_tokens, by_seconds}, 1500, 480);
  if (!why.empty()) fmt::print("tuning: no plot: {}\n", why);
  fmt::print("\n{}\n{}", table.text(), samples);

  std::string md = fmt::format(
      "{} characters of {} per model ({} steps of {} x {}), the same batches for every model; validation loss on {} "
      "fixed batches (nats per character; {:.2f} is a uniform guess). Each model trained with AdamW, warm-up + cosine "
      "schedule, clip 1, at each learning rate of the sweep for {} steps from the first seed (a best rate at an end of "
      "the grid sends the sweep one step further, twice at most); the best (*) was used for the full run, from each "
      "of {} seeds (each its own initialisation and batch order). Val loss: mean and, in brackets, min-max over the "
      "seeds; the plot's bands span the same min-max; tokens/s and train time are means per run, peak MiB the "
      "largest.{}\n\n{}\n"
      "![validation loss](loss.png)\n",
      report::format_count(static_cast<double>(c.steps * tokens_per_step)), text.source, c.steps, c.batch, c.block,
      c.eval_batches, std::log(static_cast<double>(V)), c.sweep_steps, c.seeds, edges, table.markdown());
  return {fmt::format("chosen lr {}; final val loss {}", chosen_text, final_text), md};
}

}  // namespace tg::study
