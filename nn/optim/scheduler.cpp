#include "nn/optim/scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include <fmt/format.h>

namespace tg::nn {

namespace {

void check_lr(const char* name, const char* what, double lr) {
  if (!(lr >= 0) || std::isinf(lr)) throw ValueError(fmt::format("{}: invalid {} {}", name, what, lr));
}

void check_step(const char* name, int64_t step) {
  if (step < 0) throw ValueError(fmt::format("{}: step must be >= 0, got {}", name, step));
}

}  // namespace

ConstantLR::ConstantLR(double base) : base_(base) { check_lr("ConstantLR", "base learning rate", base); }

double ConstantLR::lr_at(int64_t step) const {
  check_step("ConstantLR", step);
  return base_;
}

StepLR::StepLR(double base, int64_t step_size, double gamma) : base_(base), gamma_(gamma), step_size_(step_size) {
  check_lr("StepLR", "base learning rate", base);
  check_lr("StepLR", "gamma", gamma);
  if (step_size <= 0) throw ValueError(fmt::format("StepLR: step_size must be positive, got {}", step_size));
}

double StepLR::lr_at(int64_t step) const {
  check_step("StepLR", step);
  return base_ * std::pow(gamma_, static_cast<double>(step / step_size_));
}

LinearDecayLR::LinearDecayLR(double base, double final_lr, int64_t total_steps)
    : base_(base), final_(final_lr), total_(total_steps) {
  check_lr("LinearDecayLR", "base learning rate", base);
  check_lr("LinearDecayLR", "final learning rate", final_lr);
  if (total_steps <= 0) throw ValueError(fmt::format("LinearDecayLR: total_steps must be positive, got {}", total_steps));
}

double LinearDecayLR::lr_at(int64_t step) const {
  check_step("LinearDecayLR", step);
  const double frac = static_cast<double>(std::min(step, total_)) / static_cast<double>(total_);
  return base_ + (final_ - base_) * frac;
}

CosineWarmupLR::CosineWarmupLR(double base, int64_t warmup_steps, int64_t total_steps, double min_lr)
    : base_(base), min_(min_lr), warmup_(warmup_steps), total_(total_steps) {
  check_lr("CosineWarmupLR", "base learning rate", base);
  check_lr("CosineWarmupLR", "min_lr", min_lr);
  if (warmup_steps < 0 || total_steps <= 0 || warmup_steps > total_steps)
    throw ValueError(fmt::format("CosineWarmupLR: need 0 <= warmup_steps <= total_steps and total_steps > 0, got "
                                 "warmup_steps {}, total_steps {}",
                                 warmup_steps, total_steps));
}

double CosineWarmupLR::lr_at(int64_t step) const {
  check_step("CosineWarmupLR", step);
  if (step < warmup_) return base_ * static_cast<double>(step + 1) / static_cast<double>(warmup_);
  if (step >= total_) return min_;
  const double ratio = static_cast<double>(step - warmup_) / static_cast<double>(total_ - warmup_);
  return min_ + 0.5 * (1 + std::cos(std::numbers::pi * ratio)) * (base_ - min_);
}

}  // namespace tg::nn
