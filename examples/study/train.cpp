// The one training recipe every model of the study gets.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "examples/study/study.h"
#include "models/training_state.h"
#include "nn/nn.h"
#include "report/progress.h"

namespace tg::study {

TrainResult train(models::LanguageModel& m, const TrainSpec& spec,
                  const std::function<data::LMBatch(Generator&)>& next,
                  const std::function<Tensor(models::LanguageModel&, const data::LMBatch&)>& loss,
                  const std::function<double()>& validate) {
  nn::AdamW opt(nn::weight_decay_groups(m, 0.01), nn::AdamWOptions{.lr = spec.lr, .weight_decay = 0.01});
  nn::CosineWarmupLR schedule(spec.lr, std::min(spec.warmup, spec.steps), spec.steps, spec.lr * 0.1);
  Generator batches(spec.seed);
  TrainResult r;
  report::Progress bar(spec.label, spec.steps, "tok");
  reset_peak_memory_stats();
  m.train();
  double interval_loss = 0;
  int64_t interval_n = 0;
  for (int64_t step = 0; step < spec.steps;) {
    const auto t0 = std::chrono::steady_clock::now();  // training only: evaluation is not counted
    schedule.step(opt, step);
    // Forward and loss; each node's backward runs at the precision it was
    // recorded with. A non-finite loss ends this run as diverged (NaN
    // validation loss, which the rate sweep ranks last), with the report.
    Tensor l;
    try {
      const data::LMBatch b = next(batches);
      l = models::checked_loss(
          [&] {
            AutocastGuard autocast(spec.precision);
            return loss(m, b);
          },
          fmt::format("{}, step {}", spec.label, step + 1));
    } catch (const AnomalyError& e) {
      fmt::print(stderr, "\n{}\n", e.what());
      r.curve.push_back({step, static_cast<double>(step * spec.tokens_per_step), r.seconds, NAN, NAN});
      break;
    }
    l.backward();
    nn::clip_grad_norm_(m.parameters(), 1.0);
    opt.step();
    opt.zero_grad();
    ++step;
    interval_loss += l.item();
    ++interval_n;
    r.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (step % spec.eval_every == 0 || step == spec.steps) {
      const double v = [&] {
        AutocastGuard autocast(spec.precision);  // the curve's two losses of the same arithmetic
        return validate();
      }();
      m.train();
      r.curve.push_back({step, static_cast<double>(step * spec.tokens_per_step), r.seconds, interval_loss / interval_n, v});
      interval_loss = 0, interval_n = 0;
    }
    bar.update(step, static_cast<double>(step * spec.tokens_per_step),
               r.curve.empty() ? "" : fmt::format("val {:.3f}", r.curve.back().val_loss));
  }
  r.peak_bytes = memory_stats().peak_bytes_in_use;
  bar.finish(r.curve.empty() ? "" : fmt::format("lr {}  val {:.3f}", format_lr(spec.lr), r.curve.back().val_loss));
  return r;
}

void Sweep::add(double lr, double loss) {
  const auto at = std::lower_bound(lrs.begin(), lrs.end(), lr) - lrs.begin();
  lrs.insert(lrs.begin() + at, lr);
  losses.insert(losses.begin() + at, std::isfinite(loss) ? loss : std::numeric_limits<double>::infinity());
  best = std::min_element(losses.begin(), losses.end()) - losses.begin();
}

std::optional<double> Sweep::next(int max_extra) const {
  if (extra >= max_extra || !at_edge() || !std::isfinite(losses[best])) return std::nullopt;
  const size_t n = lrs.size();
  const bool low = best == 0;
  const double step = n < 3 ? lrs[1] / lrs[0] : low ? lrs[2] / lrs[1] : lrs[n - 2] / lrs[n - 3];
  return low ? lrs[0] / step : lrs[n - 1] * step;
}

Sweep sweep_lr(std::vector<double> grid, const std::function<double(double)>& run, int max_extra) {
  std::sort(grid.begin(), grid.end());
  grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
  Sweep s;
  for (double lr : grid) s.add(lr, run(lr));
  while (auto lr = s.next(max_extra)) {
    s.add(*lr, run(*lr));
    ++s.extra;
  }
  return s;
}

double validation_loss(models::LanguageModel& m, const data::LMBatches& val, int64_t count, int64_t batch) {
  NoGradGuard no_grad;
  m.eval();
  double total = 0;
  for (int64_t i = 0; i < count; ++i) {
    data::LMBatch b = val.fixed(i, count, batch);
    total += m.loss(b.inputs, b.targets).item();
  }
  return total / static_cast<double>(count);
}

}  // namespace tg::study
