#pragma once
/// \file
/// Optimizers, learning-rate schedules and gradient clipping, as torch.optim:
///
///   nn::AdamW opt(nn::weight_decay_groups(model, 0.1), {.lr = 3e-4});
///   nn::CosineWarmupLR schedule(3e-4, /*warmup_steps=*/100, /*total_steps=*/5000);
///   for (int64_t step = 0; step < 5000; ++step) {
///     schedule.step(opt, step);
///     model.loss(x, y).backward();
///     nn::clip_grad_norm_(model.parameters(), 1.0);
///     opt.step();
///     opt.zero_grad();
///   }
#include "optim/adagrad.h"
#include "optim/adam.h"
#include "optim/clip.h"
#include "optim/optimizer.h"
#include "optim/rmsprop.h"
#include "optim/scheduler.h"
#include "optim/sgd.h"
