#include "models/training_state.h"

#include <cmath>
#include <cstdio>

#include <fmt/format.h>

#include "autograd/anomaly.h"
#include "autograd/error.h"
#include "autograd/generator.h"
#include "autograd/tensor.h"
#include "nn/module.h"

namespace tg::models {
namespace {

// The whole value of field key as a number: std::stoll, std::stoull or std::stod.
template <class T, class Parse>
T number(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& where,
         Parse&& parse) {
  auto it = meta.find(key);
  if (it == meta.end()) throw ValueError(fmt::format("{}: training state field '{}' is missing", where, key));
  try {
    size_t used = 0;
    T v = parse(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw ValueError(fmt::format("{}: training state field '{}' is '{}', not a number", where, key, it->second));
}

int64_t integer(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& where) {
  return number<int64_t>(meta, key, where, [](const std::string& s, size_t* used) { return std::stoll(s, used); });
}
uint64_t unsigned_integer(const std::map<std::string, std::string>& meta, const std::string& key,
                          const std::string& where) {
  return number<uint64_t>(meta, key, where, [](const std::string& s, size_t* used) { return std::stoull(s, used); });
}
double real(const std::map<std::string, std::string>& meta, const std::string& key, const std::string& where) {
  return number<double>(meta, key, where, [](const std::string& s, size_t* used) { return std::stod(s, used); });
}

}  // namespace

std::map<std::string, std::string> to_metadata(const TrainingState& s) {
  std::map<std::string, std::string> meta = {
      {"step", std::to_string(s.step)},
      {"model", s.model},
      {"seconds", fmt::format("{}", s.seconds)},
      {"batch_seed", std::to_string(s.batch_seed)},
      {"batch_offset", std::to_string(s.batch_offset)},
      {"dropout_seed", std::to_string(s.dropout_seed)},
      {"dropout_offset", std::to_string(s.dropout_offset)},
      {"interval_loss", fmt::format("{:.17g}", s.interval_loss)},
      {"interval_steps", std::to_string(s.interval_steps)}};
  for (size_t i = 0; i < s.curve.size(); ++i)
    meta[fmt::format("curve.{:06}", i)] =
        fmt::format("{} {:.17g} {:.17g}", s.curve[i].step, s.curve[i].train_loss, s.curve[i].val_loss);
  return meta;
}

TrainingState training_state_from_metadata(const std::map<std::string, std::string>& meta, const std::string& where) {
  TrainingState s;
  if (auto it = meta.find("model"); it != meta.end()) s.model = it->second;
  s.step = integer(meta, "step", where);
  s.seconds = real(meta, "seconds", where);
  s.batch_seed = unsigned_integer(meta, "batch_seed", where);
  s.batch_offset = unsigned_integer(meta, "batch_offset", where);
  s.dropout_seed = unsigned_integer(meta, "dropout_seed", where);
  s.dropout_offset = unsigned_integer(meta, "dropout_offset", where);
  if (meta.count("interval_loss")) s.interval_loss = real(meta, "interval_loss", where);
  if (meta.count("interval_steps")) s.interval_steps = integer(meta, "interval_steps", where);
  // The curve's keys sort in order (six digits).
  for (const auto& [key, value] : meta) {
    if (!key.starts_with("curve.")) continue;
    CurvePoint p;
    char rest = 0;
    if (std::sscanf(value.c_str(), "%lf %lf %lf %c", &p.step, &p.train_loss, &p.val_loss, &rest) != 3)
      throw ValueError(fmt::format("{}: training state field '{}' is '{}', not \"STEP TRAIN_LOSS VAL_LOSS\"", where,
                                   key, value));
    s.curve.push_back(p);
  }
  return s;
}

Tensor checked_loss(const std::function<Tensor()>& forward, const std::string& what) {
  Generator& gen = default_generator();
  const uint64_t seed = gen.seed(), offset = gen.offset();
  Tensor loss = forward();
  const double value = loss.item();
  if (std::isfinite(value)) return loss;
  loss = Tensor();  // its graph goes before the rerun builds another
  gen.set_state(seed, offset);
  std::string report =
      "anomaly detection found no op that made it on a rerun of the step (it depends on state the rerun does not "
      "restore)";
  try {
    DetectAnomalyGuard anomaly;
    forward();
  } catch (const AnomalyError& e) {
    report = e.what();
  }
  throw AnomalyError(fmt::format("{}: the loss is {}; stopped before its backward, so the parameters and the last "
                                 "checkpoint hold the last finite state\n{}",
                                 what, std::isnan(value) ? "NaN" : fmt::format("{}", value), report));
}

void check_finite_parameters(const nn::Module& m, const std::string& what) {
  for (const auto& [name, p] : m.named_parameters()) {
    const NonFiniteCount bad = count_non_finite(p);
    if (bad.any())
      throw AnomalyError(fmt::format("{}: parameter {} {} holds {} NaN and {} infinite value(s); nothing written, the "
                                     "last checkpoint stays",
                                     what, name, p.shape(), bad.nan, bad.inf));
  }
}

}  // namespace tg::models
