#pragma once
/// \file
/// Learning-rate schedules.
#include <cstdint>

#include "optimizer.h"

namespace tg::nn {

/// A learning-rate schedule as a pure function of the step, so a resumed run
/// gets the same rate as an uninterrupted one without scheduler state:
///
///     schedule.step(opt, step);   // before opt.step(): sets lr_at(step) in every group
class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  virtual double lr_at(int64_t step) const = 0;  ///< step counts from 0
  /// Sets lr_at(step) as the learning rate of every group of opt.
  void step(Optimizer& opt, int64_t step) const { opt.set_lr(lr_at(step)); }
};

/// base at every step.
class ConstantLR : public LRScheduler {
 public:
  /// The rate base, always.
  explicit ConstantLR(double base);
  double lr_at(int64_t step) const override;

 private:
  double base_;
};

/// base * gamma^floor(step / step_size), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  /// Decays base by gamma every step_size steps.
  StepLR(double base, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  double base_, gamma_;
  int64_t step_size_;
};

/// Linear from base at step 0 to final_lr at total_steps, then final_lr.
class LinearDecayLR : public LRScheduler {
 public:
  /// From base down to final_lr over total_steps.
  LinearDecayLR(double base, double final_lr, int64_t total_steps);
  double lr_at(int64_t step) const override;

 private:
  double base_, final_;
  int64_t total_;
};

/// nanoGPT's schedule: linear warmup base * (step + 1) / warmup_steps for
/// step < warmup_steps (so the last warmup step reaches base), then a cosine
/// from base to min_lr over [warmup_steps, total_steps], then min_lr.
class CosineWarmupLR : public LRScheduler {
 public:
  /// Warms up over warmup_steps, then decays to min_lr at total_steps.
  CosineWarmupLR(double base, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  double lr_at(int64_t step) const override;

 private:
  double base_, min_;
  int64_t warmup_, total_;
};

}  // namespace tg::nn
