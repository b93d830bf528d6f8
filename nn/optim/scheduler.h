#pragma once
// Learning-rate schedules as pure functions of the step, so a resumed run
// gets the same rate as an uninterrupted one without scheduler state:
//   schedule.step(opt, step);   // before opt.step(): sets lr_at(step) in every group
#include <cstdint>

#include "nn/optim/optimizer.h"

namespace tg::nn {

class LRScheduler {
 public:
  virtual ~LRScheduler() = default;
  virtual double lr_at(int64_t step) const = 0;  // step counts from 0
  void step(Optimizer& opt, int64_t step) const { opt.set_lr(lr_at(step)); }
};

// base at every step.
class ConstantLR : public LRScheduler {
 public:
  explicit ConstantLR(double base);
  double lr_at(int64_t step) const override;

 private:
  double base_;
};

// base * gamma^floor(step / step_size), as torch.optim.lr_scheduler.StepLR.
class StepLR : public LRScheduler {
 public:
  StepLR(double base, int64_t step_size, double gamma = 0.1);
  double lr_at(int64_t step) const override;

 private:
  double base_, gamma_;
  int64_t step_size_;
};

// Linear from base at step 0 to final_lr at total_steps, then final_lr.
class LinearDecayLR : public LRScheduler {
 public:
  LinearDecayLR(double base, double final_lr, int64_t total_steps);
  double lr_at(int64_t step) const override;

 private:
  double base_, final_;
  int64_t total_;
};

// nanoGPT's schedule: linear warmup base * (step + 1) / warmup_steps for
// step < warmup_steps (so the last warmup step reaches base), then a cosine
// from base to min_lr over [warmup_steps, total_steps], then min_lr.
class CosineWarmupLR : public LRScheduler {
 public:
  CosineWarmupLR(double base, int64_t warmup_steps, int64_t total_steps, double min_lr = 0);
  double lr_at(int64_t step) const override;

 private:
  double base_, min_;
  int64_t warmup_, total_;
};

}  // namespace tg::nn
