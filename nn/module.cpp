#include "nn/module.h"

#include <fmt/format.h>

namespace tg::nn {

void Module::check_name(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw ValueError(fmt::format("{}: invalid name '{}' (must be non-empty, without '.')", type_name_, name));
  auto taken = [&](const auto& v) {
    for (const auto& [n, x] : v)
      if (n == name) return true;
    return false;
  };
  if (taken(params_) || taken(buffers_) || taken(children_))
    throw ValueError(fmt::format("{}: the name '{}' is already registered", type_name_, name));
}

Tensor Module::register_parameter(const std::string& name, Tensor t) {
  check_name(name);
  if (!t.defined()) throw ValueError(fmt::format("{}: parameter '{}' is undefined", type_name_, name));
  if (!t.is_leaf()) t = t.detach();
  t.requires_grad_(true);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name(name);
  if (!t.defined()) throw ValueError(fmt::format("{}: buffer '{}' is undefined", type_name_, name));
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_name(name);
  if (!m) throw ValueError(fmt::format("{}: submodule '{}' is null", type_name_, name));
  m->name_ = name;
  children_.emplace_back(name, std::move(m));
}

void Module::collect(const std::string& prefix, bool recurse, bool buffers,
                     std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : buffers ? buffers_ : params_) out.emplace_back(prefix + n, t);
  if (!recurse) return;
  for (const auto& [n, c] : children_) c->collect(prefix + n + ".", true, buffers, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, false, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters(recurse)) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", recurse, true, out);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (auto& [n, c] : children_) out.push_back(c);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::state_dict() const {
  auto out = named_parameters();
  for (auto& b : named_buffers()) out.push_back(b);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::to(DType dtype) {
  if (!is_floating(dtype)) throw DTypeError(fmt::format("{}.to: parameters must be floating, not {}", type_name_, dtype_name(dtype)));
  NoGradGuard ng;
  for (auto& [n, t] : state_dict())
    if (is_floating(t.dtype()) && t.dtype() != dtype) t.set_data(t.to(dtype).contiguous());
}

void Module::print(std::string& out, int indent) const {
  std::string extra = extra_repr();
  std::vector<std::string> own;
  for (auto& [n, t] : params_) own.push_back(fmt::format("{} {}", n, t.shape()));
  for (auto& [n, t] : buffers_) own.push_back(fmt::format("{} {} (buffer)", n, t.shape()));
  std::string inside = extra;
  if (!own.empty()) inside += (inside.empty() ? "" : "; ") + fmt::format("{}", fmt::join(own, ", "));
  out += type_name_ + "(" + inside;
  if (children_.empty()) {
    out += ")";
    return;
  }
  out += "\n";
  for (auto& [n, c] : children_) {
    out += fmt::format("{:{}}({}): ", "", indent + 2, n);
    c->print(out, indent + 2);
    out += "\n";
  }
  out += fmt::format("{:{}})", "", indent);
}

std::string Module::str() const {
  std::string out;
  print(out, 0);
  return out;
}

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> layers) : UnaryModule("Sequential") {
  for (auto& l : layers) push_back(std::move(l));
}

void Sequential::push_back(std::shared_ptr<UnaryModule> layer) {
  add_child(std::to_string(layers_.size()), layer);
  layers_.push_back(std::move(layer));
}

Tensor Sequential::forward(const Tensor& x) {
  ModulePathScope path(name());
  Tensor h = x;
  for (auto& l : layers_) h = l->forward(h);
  return h;
}

HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  HookHandle h{std::make_shared<bool>(true)};
  pre_hooks_.emplace_back(h.active, std::move(hook));
  return h;
}

HookHandle Module::register_forward_hook(ForwardHook hook) {
  HookHandle h{std::make_shared<bool>(true)};
  hooks_.emplace_back(h.active, std::move(hook));
  return h;
}

}  // namespace tg::nn
