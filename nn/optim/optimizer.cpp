#include "nn/optim/optimizer.h"

#include <charconv>
#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>

#include "nn/module.h"

namespace tg::nn {

std::vector<ParamGroup> weight_decay_groups(const Module& m, double weight_decay) {
  ParamGroup decay{.params = {}, .weight_decay = weight_decay}, no_decay{.params = {}, .weight_decay = 0.0};
  for (auto& [name, p] : m.named_parameters()) (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double default_lr,
                     double default_weight_decay, std::vector<std::string> buffers)
    : name_(std::move(name)), groups_(std::move(groups)), buffer_names_(std::move(buffers)) {
  if (!(default_lr >= 0)) throw ValueError(fmt::format("{}: invalid learning rate {}", name_, default_lr));
  if (!(default_weight_decay >= 0))
    throw ValueError(fmt::format("{}: invalid weight_decay {}", name_, default_weight_decay));
  std::set<const TensorImpl*> seen;
  size_t count = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    ParamGroup& group = groups_[g];
    if (group.lr == -1) group.lr = default_lr;
    if (group.weight_decay == -1) group.weight_decay = default_weight_decay;
    if (!(group.lr >= 0)) throw ValueError(fmt::format("{}: group {} has an invalid learning rate {}", name_, g, group.lr));
    if (!(group.weight_decay >= 0))
      throw ValueError(fmt::format("{}: group {} has an invalid weight_decay {}", name_, g, group.weight_decay));
    for (size_t i = 0; i < group.params.size(); ++i) {
      const Tensor& p = group.params[i];
      if (!p.defined()) throw ValueError(fmt::format("{}: parameter {}.{} is undefined", name_, g, i));
      if (!is_floating(p.dtype()))
        throw DTypeError(fmt::format("{}: parameter {}.{} {} is {}, expected a floating dtype", name_, g, i,
                                     p.shape(), dtype_name(p.dtype())));
      if (!seen.insert(p.impl()).second)
        throw ValueError(fmt::format("{}: parameter {}.{} {} appears more than once", name_, g, i, p.shape()));
    }
    count += group.params.size();
  }
  if (count == 0) throw ValueError(fmt::format("{}: got an empty parameter list", name_));
  state_.resize(groups_.size());
  for (size_t g = 0; g < groups_.size(); ++g) state_[g].resize(groups_[g].params.size());
}

void Optimizer::zero_grad() {
  for (auto& group : groups_)
    for (auto& p : group.params) p.zero_grad();
}

double Optimizer::lr() const { return groups_.empty() ? 0.0 : groups_[0].lr; }

void Optimizer::set_lr(double lr) {
  if (!(lr >= 0)) throw ValueError(fmt::format("{}.set_lr: invalid learning rate {}", name_, lr));
  for (auto& group : groups_) group.lr = lr;
}

std::vector<Optimizer::Slot> Optimizer::prepare() {
  std::vector<Slot> slots;
  state_.resize(groups_.size());  // param_groups() may have gained parameters
  for (size_t g = 0; g < groups_.size(); ++g) {
    state_[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      const Tensor& p = groups_[g].params[i];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      if (!(grad.shape() == p.shape()))
        throw ShapeError(fmt::format("{}.step: parameter {}.{} is {} but its gradient is {}", name_, g, i, p.shape(),
                                     grad.shape()));
      Slot slot;
      slot.g = g, slot.i = i;
      if (grad.dtype() != p.dtype()) grad = grad.to(p.dtype());
      slot.grad = grad.contiguous();
      slot.param = p.is_contiguous() ? p : p.contiguous();
      const ParamState& st = state_[g][i];
      if (st.step == 0) {
        for (size_t k = 0; k < buffer_names_.size(); ++k) slot.buffers.push_back(zeros(p.shape(), p.dtype()));
      } else {
        for (const Tensor& b : st.buffers) {
          if (!(b.shape() == p.shape()))
            throw ShapeError(fmt::format("{}.step: parameter {}.{} is {} but its state is {}", name_, g, i,
                                         p.shape(), b.shape()));
          // The module was converted (Module::to): the state follows it.
          slot.buffers.push_back(b.dtype() == p.dtype() ? b : b.to(p.dtype()).contiguous());
        }
      }
      slots.push_back(std::move(slot));
    }
  }
  return slots;
}

void Optimizer::finish(const Slot& slot) {
  const Tensor& p = groups_[slot.g].params[slot.i];
  if (slot.param.impl() != p.impl())
    p.copy_(slot.param);
  else
    p.bump_version();  // the tape must see that saved copies of p are stale
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  out.emplace_back("steps", scalar(static_cast<double>(steps_), DType::i64));
  std::vector<int64_t> counts;
  for (auto& group : groups_) counts.push_back(static_cast<int64_t>(group.params.size()));
  out.emplace_back("groups", from_vector(counts, {static_cast<int64_t>(counts.size())}));
  for (size_t g = 0; g < groups_.size(); ++g) {
    out.emplace_back(fmt::format("{}.lr", g), scalar(groups_[g].lr, DType::f64));
    for (size_t i = 0; g < state_.size() && i < state_[g].size(); ++i) {
      const ParamState& st = state_[g][i];
      if (st.step == 0) continue;
      out.emplace_back(fmt::format("{}.{}.step", g, i), scalar(static_cast<double>(st.step), DType::i64));
      for (size_t k = 0; k < buffer_names_.size(); ++k)
        out.emplace_back(fmt::format("{}.{}.{}", g, i, buffer_names_[k]), st.buffers[k]);
    }
  }
  return out;
}

namespace {

// "12" -> 12; false for anything else (signs, spaces, overflow).
bool parse_index(std::string_view s, size_t& out) {
  if (s.empty()) return false;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size();
}

// A non-negative whole number (a step or parameter count), or a scalar holding one.
bool whole_value(double v, int64_t& out) {
  if (!(v >= 0 && v < 9.2e18 && std::floor(v) == v)) return false;  // NaN fails too
  out = static_cast<int64_t>(v);
  return true;
}
bool whole_scalar(const Tensor& t, int64_t& out) { return t.numel() == 1 && whole_value(t.item(), out); }

// A state dict read against an optimizer's groups and buffer names, entry by
// entry, collecting every problem instead of stopping at the first, so that
// load_state_dict can reject it whole (or apply it whole).
struct StateReader {
  const std::vector<ParamGroup>& groups;
  const std::vector<std::string>& buffer_names;
  std::string_view optimizer;  // its name, for messages
  std::vector<std::string> errors;
  std::set<std::string> seen;
  int64_t steps = -1;
  std::vector<double> lrs;                             // per group; -1: none read
  std::vector<std::vector<int64_t>> steps_of;          // per (group, param); -1: none read
  std::vector<std::vector<std::vector<Tensor>>> bufs;  // per (group, param), by buffer index

  StateReader(const std::vector<ParamGroup>& g, const std::vector<std::string>& b, std::string_view name)
      : groups(g), buffer_names(b), optimizer(name), lrs(g.size(), -1), steps_of(g.size()), bufs(g.size()) {
    for (size_t k = 0; k < g.size(); ++k) {
      steps_of[k].assign(g[k].params.size(), -1);
      bufs[k].assign(g[k].params.size(), std::vector<Tensor>(b.size()));
    }
  }

  // One entry: "steps", "groups", "<g>.lr", "<g>.<i>.step" or "<g>.<i>.<buffer>".
  void read(const std::string& key, const Tensor& t) {
    if (!seen.insert(key).second) {
      errors.push_back(fmt::format("duplicate key '{}'", key));
      return;
    }
    if (!t.defined()) {
      errors.push_back(fmt::format("'{}' is undefined", key));
      return;
    }
    if (key == "steps") {
      if (!whole_scalar(t, steps))
        errors.push_back(fmt::format("'steps' must be a non-negative whole scalar, got {}", t.shape()));
      return;
    }
    if (key == "groups") {
      read_group_sizes(t);
      return;
    }
    size_t dot1 = key.find('.'), dot2 = key.find('.', dot1 == std::string::npos ? dot1 : dot1 + 1);
    size_t g = 0, i = 0;
    std::string_view k(key);
    bool group_ok = dot1 != std::string::npos && parse_index(k.substr(0, dot1), g) && g < groups.size();
    if (group_ok && dot2 == std::string::npos && k.substr(dot1 + 1) == "lr") {
      if (t.numel() != 1 || !is_floating(t.dtype()) || !(t.item() >= 0))
        errors.push_back(fmt::format("'{}' must be a non-negative floating scalar", key));
      else
        lrs[g] = t.item();
      return;
    }
    bool param_ok = group_ok && dot2 != std::string::npos && parse_index(k.substr(dot1 + 1, dot2 - dot1 - 1), i) &&
                    i < groups[g].params.size();
    if (!param_ok) {
      errors.push_back(fmt::format("unexpected key '{}'", key));
      return;
    }
    read_param_entry(key, g, i, k.substr(dot2 + 1), t);
  }

  // "groups": the parameter count of every group, which must be the optimizer's.
  void read_group_sizes(const Tensor& t) {
    std::vector<int64_t> want;
    for (auto& group : groups) want.push_back(static_cast<int64_t>(group.params.size()));
    std::vector<int64_t> got;
    if (t.dim() == 1)
      for (int64_t k = 0; k < t.numel(); ++k)
        if (!whole_value(t.at({k}), got.emplace_back())) {
          errors.push_back(fmt::format("'groups' must hold whole non-negative counts, got {} at {}", t.at({k}), k));
          return;
        }
    if (got != want)
      errors.push_back(fmt::format("'groups': the state has {} parameter groups of sizes ({}), the optimizer ({})",
                                   got.size(), fmt::join(got, ","), fmt::join(want, ",")));
  }

  // "<g>.<i>.step" or "<g>.<i>.<buffer>" of parameter i of group g.
  void read_param_entry(const std::string& key, size_t g, size_t i, std::string_view field, const Tensor& t) {
    const Tensor& p = groups[g].params[i];
    if (field == "step") {
      if (!whole_scalar(t, steps_of[g][i]) || steps_of[g][i] == 0) {
        steps_of[g][i] = -1;
        errors.push_back(fmt::format("'{}' must be a positive whole scalar", key));
      }
      return;
    }
    const size_t B = buffer_names.size();
    size_t b = 0;
    while (b < B && buffer_names[b] != field) ++b;
    if (b == B)
      errors.push_back(fmt::format("unexpected key '{}' ({} keeps {})", key, optimizer,
                                   B ? fmt::format("{}", fmt::join(buffer_names, ", ")) : "no buffers"));
    else if (!(t.shape() == p.shape()) || !is_floating(t.dtype()))
      errors.push_back(fmt::format("'{}' is {} {}, the parameter is {} {}", key, t.shape(), dtype_name(t.dtype()),
                                   p.shape(), dtype_name(p.dtype())));
    else
      bufs[g][i][b] = t;
  }

  // After every entry: the keys that must be there, and a parameter's step
  // and buffers present together or not at all.
  void check_complete() {
    if (steps < 0 && !seen.count("steps")) errors.push_back("missing key 'steps'");
    if (!seen.count("groups")) errors.push_back("missing key 'groups'");
    for (size_t g = 0; g < groups.size(); ++g) {
      if (lrs[g] < 0 && !seen.count(fmt::format("{}.lr", g))) errors.push_back(fmt::format("missing key '{}.lr'", g));
      for (size_t i = 0; i < groups[g].params.size(); ++i) {
        bool has_step = seen.count(fmt::format("{}.{}.step", g, i)) > 0;
        for (const std::string& buffer : buffer_names) {
          bool has_buf = seen.count(fmt::format("{}.{}.{}", g, i, buffer)) > 0;
          if (has_step && !has_buf) errors.push_back(fmt::format("missing key '{}.{}.{}'", g, i, buffer));
          if (!has_step && has_buf) errors.push_back(fmt::format("missing key '{}.{}.step'", g, i));
        }
      }
    }
  }
};

// Copies of a parameter's loaded buffers in its dtype: the optimizer never
// shares its state with the caller's tensors.
std::vector<Tensor> owned_copies(const std::vector<Tensor>& buffers, const Tensor& param) {
  std::vector<Tensor> out;
  for (const Tensor& buffer : buffers) {
    Tensor copy = empty(param.shape(), param.dtype());
    copy.copy_(buffer);
    out.push_back(copy);
  }
  return out;
}

}  // namespace

void Optimizer::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& state) {
  StateReader in(groups_, buffer_names_, name_);
  for (const auto& [key, t] : state) in.read(key, t);
  in.check_complete();
  if (!in.errors.empty())
    throw ValueError(
        fmt::format("{}.load_state_dict: {} problem(s): {}", name_, in.errors.size(), fmt::join(in.errors, "; ")));

  NoGradGuard no_grad;
  steps_ = in.steps;
  state_.assign(groups_.size(), {});
  for (size_t g = 0; g < groups_.size(); ++g) {
    groups_[g].lr = in.lrs[g];
    state_[g].resize(groups_[g].params.size());
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      if (in.steps_of[g][i] <= 0) continue;
      ParamState& st = state_[g][i];
      st.step = in.steps_of[g][i];
      st.buffers = owned_copies(in.bufs[g][i], groups_[g].params[i]);
    }
  }
}

}  // namespace tg::nn
