#pragma once
// Where a training run stands, kept as the metadata of its optimizer's
// checkpoint (nn::save(optimizer, path, metadata)) so that a resumed run
// continues exactly as an uninterrupted one: the step, the training clock,
// both generators' positions, the loss summed since the last evaluation and
// the loss curve so far. Metadata is strings:
//   step, model, seconds, batch_seed, batch_offset, dropout_seed,
//   dropout_offset, interval_loss, interval_steps,
//   curve.000000 ... "STEP TRAIN_LOSS VAL_LOSS", one per evaluation.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace tg {
class Tensor;
namespace nn {
class Module;
}
}

namespace tg::models {

struct CurvePoint {
  double step = 0, train_loss = 0, val_loss = 0;
};

struct TrainingState {
  std::string model;  // the kind trained ("gpt", "lstm", ...)
  int64_t step = 0;
  double seconds = 0;  // training time so far (evaluation and checkpoints not counted)
  uint64_t batch_seed = 0, batch_offset = 0;      // the batch generator's state
  uint64_t dropout_seed = 0, dropout_offset = 0;  // the default (dropout) generator's state
  // The training loss summed over the steps since the last evaluation: the
  // next curve point is its mean.
  double interval_loss = 0;
  int64_t interval_steps = 0;
  std::vector<CurvePoint> curve;
};

std::map<std::string, std::string> to_metadata(const TrainingState& s);
// ValueError naming `where` (the checkpoint) and the field when one is
// missing or not a number. interval_loss and interval_steps may be absent:
// checkpoints written before they were kept were all taken at an evaluation,
// where the sum restarts from 0.
TrainingState training_state_from_metadata(const std::map<std::string, std::string>& meta, const std::string& where);

// One training step's loss, checked before its backward: `forward` computes
// it; when it is NaN or infinite, forward is rerun from the same random state
// (the default generator's) under DetectAnomalyGuard, and an AnomalyError is
// thrown that says `what` (e.g. "gpt, step 1200"), the loss, and the anomaly
// report naming the op where the run first went non-finite. Thrown before
// backward and the optimizer step, so the parameters, and any checkpoint
// written after, hold the last finite state.
Tensor checked_loss(const std::function<Tensor()>& forward, const std::string& what);

// AnomalyError naming `what` and the first parameter of m that holds NaN or
// ±inf: called before a checkpoint is written, so that none is written from
// a non-finite state and the last good one stays.
void check_finite_parameters(const nn::Module& m, const std::string& what);

}  // namespace tg::models
