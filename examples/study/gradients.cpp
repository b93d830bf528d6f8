// Part 4, vanishing gradients: how strongly the loss at the last position t
// of a window depends on the input k positions earlier, |dL_t / dx_{t-k}|
// (x: the token embeddings), for every k, at initialisation and after part 1's
// training. tg::grad differentiates with respect to x, a non-leaf tensor.
#include <cmath>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/tokenizer.h"
#include "examples/study/fit.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

// Mean over the windows of |dL_{T-1} / dx_{T-1-k}| for k = 0..T-1. L_t is
// each window's own loss (summed, not averaged, over the batch, so every
// window's gradient is its own).
std::vector<double> gradient_by_distance(models::LanguageModel& m, const data::LMBatch& b) {
  m.eval();  // no dropout: the same function at every call
  const int64_t T = b.inputs.size(1);
  {
    // The split forward must be the model's forward, or the gradients would be of something else.
    NoGradGuard no_grad;
    const double gap = max(abs(m.forward(b.inputs) - logits_from_embedded(m, embed_tokens(m, b.inputs)))).item();
    if (!(gap < 1e-4))
      throw std::logic_error(fmt::format("study: {}'s forward split at the embedding differs from its forward by {}",
                                         m.type_name(), gap));
  }
  Tensor x = embed_tokens(m, b.inputs);  // (B,T,E)
  Tensor logits = logits_from_embedded(m, x);
  Tensor loss = cross_entropy(logits.select(1, T - 1), b.targets.select(1, T - 1), -100, 0.0, Reduction::sum);
  Tensor g = grad({loss}, {x})[0];                                    // (B,T,E)
  std::vector<double> norm = mean(sqrt(sum(g * g, {2})), {0}).to(DType::f64).to_vector<double>();  // (T)
  std::vector<double> by_k(T);
  for (int64_t k = 0; k < T; ++k) by_k[k] = norm[T - 1 - k];
  return by_k;
}

// Mean of v over [begin, end).
double band(const std::vector<double>& v, int64_t begin, int64_t end) {
  double sum = 0;
  for (int64_t k = begin; k < end; ++k) sum += v[k];
  return sum / static_cast<double>(end - begin);
}

}  // namespace

PartOutput run_gradients(Study& s) {
  const Config& c = s.c;
  const auto tok = data::load_tokenizer(from_tuning(s, "tokenizer.json"));
  const data::LMBatches val_set(tok->encode(s.text().val), c.block);
  const data::LMBatch batch = val_set.fixed(0, 1, c.grad_batch);
  const int64_t T = c.block;
  fmt::print("gradients: |dL_t/dx_(t-k)| at t = {} (the last position), mean over {} validation windows, at "
             "initialisation and after part 1's training\n", T - 1, c.grad_batch);

  std::string csv = "model,seed,state,k,grad_norm\n";
  Panel panel{.title = fmt::format("gradient of the loss at the last position with respect to the input k positions "
                                   "back (mean over {} windows)", c.grad_batch),
              .xlabel = "distance k", .ylabel = "|dL_t / dx_(t-k)|", .logy = true,
              .key = "bottom left"};  // the decaying recurrent curves leave the lower left empty
  report::Table table{{"model", "state", "k=0", "k=1..4", fmt::format("k={}..{}", T - T / 4, T - 1),
                         fmt::format("log10(far / near), mean (min to max of {} seeds)", c.seeds), "max / near"}, {}};
  std::string summary;
  report::Progress bar("grads", static_cast<int64_t>(2 * c.models.size()), "models");
  int64_t done = 0;
  for (const std::string& kind : c.models) {
    for (const std::string state : {"init", "trained"}) {
      // Per seed: its initialisation, or part 1's model trained from it.
      std::vector<std::vector<double>> runs;
      std::vector<double> decades;
      for (int64_t i = 0; i < c.seeds; ++i) {
        auto m = state == "init" ? make_model(c, kind, tok->vocab_size(), c.block, run_seed(c, i))
                                 : load_model(from_tuning(s, model_file(kind, i)));
        runs.push_back(gradient_by_distance(*m, batch));
        const std::vector<double>& g = runs.back();
        for (int64_t k = 0; k < T; ++k) csv += fmt::format("{},{},{},{},{:.6e}\n", kind, run_seed(c, i), state, k, g[k]);
        decades.push_back(std::log10(band(g, T - T / 4, T) / band(g, 1, std::min<int64_t>(5, T))));
      }
      // The curve's mean over the seeds; the band their min and max.
      Series series{fmt::format("{} {}", kind, state == "init" ? "at init" : "trained"), {}, {}, kind,
                    state == "init" ? Series::dashed : Series::line};
      std::vector<double> g(T);
      for (int64_t k = 0; k < T; ++k) {
        std::vector<double> at_k;
        for (const auto& r : runs) at_k.push_back(r[k]);
        const Range r = range_of(at_k);
        g[k] = r.mean;
        series.x.push_back(static_cast<double>(k));
        series.y.push_back(r.mean), series.ylo.push_back(r.lo), series.yhi.push_back(r.hi);
      }
      const double near = band(g, 1, std::min<int64_t>(5, T)), far = band(g, T - T / 4, T);
      double peak = 0;
      for (int64_t k = 1; k < T; ++k) peak = std::max(peak, g[k]);
      const Range d = range_of(decades);
      // -inf (far gradients exactly 0 in float32) stays -inf in the mean; "{:+.1f}" prints it as -inf.
      const std::string decades_cell = d.lo == d.hi || !std::isfinite(d.mean)
                                           ? fmt::format("{:+.1f}", d.mean)
                                           : fmt::format("{:+.1f} ({:+.1f} to {:+.1f})", d.mean, d.lo, d.hi);
      table.rows.push_back({kind, state, fmt::format("{:.2e}", g[0]), fmt::format("{:.2e}", near),
                            fmt::format("{:.2e}", far), decades_cell, fmt::format("{:.2f}", peak / near)});
      if (state == "trained") summary += fmt::format("{}{} {:+.1f}", summary.empty() ? "" : ", ", kind, d.mean);
      panel.series.push_back(series);
      ++done;
      bar.update(done, static_cast<double>(done), kind + " " + state);
    }
  }
  bar.finish("");
  report::write_file(s.path("gradients.csv"), csv);
  if (std::string why = plot(s.path("gradients.png"), {panel}, 1000, 560); !why.empty())
    fmt::print("gradients: no plot: {}\n", why);
  fmt::print("\n{}", table.text());
  std::string md = fmt::format(
      "Gradient of the loss at the last position t = {} of a validation window with respect to the token embedding "
      "k positions earlier, |dL_t / dx_(t-k)| (L2 norm over the embedding), mean over {} windows, for each of {} "
      "seeds (at init: the seed's initialisation; trained: part 1's model from that seed). The curves and the "
      "k columns are the mean over the seeds (the plot's bands: min to max). *log10(far / near)* is, "
      "per seed, the log10 of the mean over the last quarter of distances over the mean over k = 1..4: 0 means no decay, -3 means "
      "a thousandfold, -inf that the far gradients are exactly 0 in float32 (the table: the seeds' mean, min and max); "
      "*max / near* is the largest gradient at any "
      "k >= 1 over the near mean (about 2 for a curve that falls from k = 1 on; the verdict calls gradients growing "
      "with distance only above 10).\n\n{}\n"
      "![gradients](gradients.png)\n",
      T - 1, c.grad_batch, c.seeds, table.markdown());
  return {"log10(far / near input gradient), trained (negative: far inputs get less): " + summary, md};
}

}  // namespace tg::study
