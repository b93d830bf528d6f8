#pragma once
/// \file
/// The optimizer base: parameter groups, per-parameter state (a step count and
/// the optimizer's moment buffers), zero_grad, lr, and a state dict so that
/// training resumes exactly (see nn/checkpoint.h).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../../autograd/tape.h"
#include "../../autograd/tensor.h"

namespace tg::nn {

class Module;

/// Parameters sharing hyperparameters. -1 means the optimizer's default.
struct ParamGroup {
  std::vector<Tensor> params;  ///< the parameters
  double lr = -1;  ///< the group's learning rate
  double weight_decay = -1;  ///< the group's weight decay
};

/// Two groups as nanoGPT: parameters with dim >= 2 (weights, embeddings) decay
/// by weight_decay; biases and LayerNorm parameters (dim < 2) do not.
std::vector<ParamGroup> weight_decay_groups(const Module& m, double weight_decay);

/// The base of every optimizer: parameter groups, per-parameter state (a step
/// count and the optimizer's moment buffers), zero_grad, lr, and a state dict
/// so that training resumes exactly (see nn/checkpoint.h).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter that has a .grad (others are skipped, as
  /// in torch.optim). In place, outside the tape.
  virtual void step() = 0;
  void zero_grad();  ///< drops every parameter's .grad

  double lr() const;          ///< the first group's learning rate
  void set_lr(double lr);     ///< sets every group's
  int64_t steps() const { return steps_; }  ///< step() calls so far
  const std::string& name() const { return name_; }  ///< e.g. "AdamW", as saved in checkpoints
  std::vector<ParamGroup>& param_groups() { return groups_; }  ///< the groups, with their lr filled in
  const std::vector<ParamGroup>& param_groups() const { return groups_; }  ///< the groups, with their lr filled in

  /// The state as named tensors: "steps" (int64 scalar), "groups" (int64 (G,),
  /// parameters per group), "<g>.lr" (float64 scalar) and, for each parameter
  /// i of group g that has been updated, "<g>.<i>.step" (int64 scalar) and
  /// "<g>.<i>.<buffer>" (e.g. "0.3.exp_avg", the parameter's shape and dtype).
  /// The tensors are the live buffers, not copies.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  /// Replaces the state with copies of `state` (buffers converted to each
  /// parameter's dtype). Validates everything first: a ValueError lists every
  /// missing, unexpected and mis-shaped key, and nothing changes.
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state);

 protected:
  /// `buffers` names the per-parameter state tensors (e.g. exp_avg, exp_avg_sq).
  Optimizer(std::string name, std::vector<ParamGroup> groups, double default_lr, double default_weight_decay,
            std::vector<std::string> buffers);

  /// One parameter's state.
  struct ParamState {
    int64_t step = 0;             ///< updates of this parameter (0: no state yet)
    std::vector<Tensor> buffers;  ///< contiguous, the parameter's shape and dtype
  };

  /// The loop every step() runs: under no-grad, for each parameter with a
  /// gradient, increments its step, allocates its buffers (zeros) on its first
  /// update, and calls update(group, param, grad, state) with param and grad
  /// contiguous and of one floating dtype. Whatever allocates (buffers,
  /// contiguous or converted copies) is done for every parameter before the
  /// first one changes, so a step that fails (out of memory) leaves every
  /// parameter and every state as it was. Allocates nothing once the state
  /// exists (unless a parameter or gradient is non-contiguous).
  template <class F>
  void for_each_update(F&& update);

 private:
  // One parameter's update, prepared: its contiguous working views and the
  // buffers its state will hold.
  struct Slot {
    size_t g = 0, i = 0;
    Tensor param, grad;
    std::vector<Tensor> buffers;
  };
  std::vector<Slot> prepare();
  void finish(const Slot& slot);

  std::string name_;
  std::vector<ParamGroup> groups_;
  std::vector<std::string> buffer_names_;
  std::vector<std::vector<ParamState>> state_;  ///< [group][param]
  int64_t steps_ = 0;
};

template <class F>
void Optimizer::for_each_update(F&& update) {
  NoGradGuard no_grad;
  std::vector<Slot> slots = prepare();
  for (Slot& slot : slots) {
    ParamState& st = state_[slot.g][slot.i];
    st.buffers = std::move(slot.buffers);
    ++st.step;
    update(static_cast<const ParamGroup&>(groups_[slot.g]), slot.param, slot.grad, st);
    finish(slot);
  }
  ++steps_;
}

}  // namespace tg::nn
