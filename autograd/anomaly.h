#pragma once
/// \file
/// Anomaly detection (torch.autograd.detect_anomaly): where a run first goes
/// NaN or infinite.
///
/// While it is on, every op's forward checks its output as it records it
/// (record(), tape.h), and every backward checks the gradients it returns.
/// The first op whose output holds NaN or ±inf throws an AnomalyError naming
/// it, its inputs' shapes and dtypes, which of them were already non-finite,
/// and the module path it ran under ("blocks.1.attn"); in backward, the first
/// node whose gradient turns non-finite is named the same way, with the op
/// that recorded it and the module path it was recorded under. Off (the
/// default), each op pays one load of a flag.
///
///     tg::DetectAnomalyGuard anomaly;      // or run with TAPEGRAD_DETECT_ANOMALY=1
///     Tensor loss = model.loss(x, y);      // throws AnomalyError at the first NaN
///     loss.backward();                     // and here, at the first NaN gradient
///
/// The module path comes from nn::Module: a module's forward, and its
/// forward hooks (forward_with_hooks), run inside a ModulePathScope with the
/// name its parent registered it under.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tg {

class Tensor;
struct OpDef;
struct Node;

/// Whether anomaly detection is on: a DetectAnomalyGuard is alive, or the
/// environment had TAPEGRAD_DETECT_ANOMALY=1 when the process started.
bool anomaly_enabled();

/// Turns anomaly detection on (for every thread) for its lifetime.
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard();   ///< turns it on
  ~DetectAnomalyGuard();  ///< back to how it was, once no other guard is alive
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;
};

/// The number of NaN and of ±inf elements of a floating tensor (0, 0 for an
/// integer one).
struct NonFiniteCount {
  int64_t nan = 0;  ///< NaN elements
  int64_t inf = 0;  ///< +inf and -inf elements
  bool any() const { return nan + inf > 0; }  ///< whether it holds any
};
/// Counts t's NaN and infinite elements.
NonFiniteCount count_non_finite(const Tensor& t);

/// Names the module whose forward runs on this thread for its lifetime,
/// while anomaly detection is on: ops recorded inside report the path of the
/// open scopes joined by '.', e.g. "blocks.1.attn" (the root module's own
/// name is empty and left out).
class ModulePathScope {
 public:
  /// Enters `name` (a view of a string that outlives the scope).
  explicit ModulePathScope(std::string_view name);
  ~ModulePathScope();  ///< leaves it
  ModulePathScope(const ModulePathScope&) = delete;
  ModulePathScope& operator=(const ModulePathScope&) = delete;

 private:
  bool entered_ = false;
};
/// The open ModulePathScopes' path on this thread ("" at the top level).
std::string module_path();

namespace detail {
/// record() under anomaly detection: AnomalyError if out holds NaN or ±inf
/// (NaN only inside an InfinityAsked scope).
void check_forward(const OpDef& op, std::span<const Tensor* const> inputs, const Tensor& out);
/// While one lives on this thread, the forward check takes ±inf for a value
/// the caller asked for, not an anomaly: masked_fill(x, mask, -inf), the way
/// attention hides keys, records its output inside one. NaN is still reported.
class InfinityAsked {
 public:
  InfinityAsked();
  ~InfinityAsked();
  InfinityAsked(const InfinityAsked&) = delete;
  InfinityAsked& operator=(const InfinityAsked&) = delete;

 private:
  bool prev_;
};
/// After a node's backward under anomaly detection: AnomalyError if a
/// gradient it returned holds NaN or ±inf. `incoming` counts the gradient the
/// backward received, taken before it ran (a backward may write its result
/// into that buffer). `api` is "backward" or "grad".
void check_backward(const Node& node, const NonFiniteCount& incoming, std::span<const Tensor> grad_in,
                    const char* api);
}  // namespace detail

}  // namespace tg
