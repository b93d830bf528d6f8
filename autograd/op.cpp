#include "autograd/op.h"

#include <algorithm>

#include <fmt/format.h>

namespace tg {

namespace {
std::vector<const OpDef*>& registry() {
  static std::vector<const OpDef*> ops;
  return ops;
}
}  // namespace

OpDef::OpDef(const OpSpec& spec) : OpSpec(spec) {
  for (const OpDef* op : registry())
    if (op->name == name)
      throw ValueError(fmt::format("OpDef: an op named '{}' is already registered ({}); op names must be unique",
                                   name, op->signature));
  if (name.empty() || backward == nullptr)
    throw ValueError(fmt::format("OpDef '{}' ({}): an op needs a name and a backward", name, signature));
  if (self_adjoint && (arity != 1 || tangent != nullptr))
    throw ValueError(fmt::format("OpDef '{}': self_adjoint is for an op of one input with no tangent rule (arity {}, "
                                 "{} tangent)", name, arity, tangent ? "a" : "no"));
  if ((linear.transpose != nullptr) != (linear.input >= 0) || linear.input >= std::max(arity, 0))
    throw ValueError(fmt::format("OpDef '{}': linear names input {} of {} and {} transpose", name, linear.input,
                                 arity, linear.transpose ? "a" : "no"));
  registry().push_back(this);
}

OpDef::~OpDef() { std::erase(registry(), this); }

void run_backward(const Node& node, const Tensor& grad_out, std::span<Tensor> grad_in) {
  const OpDef& op = *node.op;
  if (op.backward_with_tangents && detail::fused_backward_tangents()) {
    std::vector<Tensor> tangents(grad_in.size());
    if (op.backward_with_tangents(node, grad_out, grad_in, tangents)) {
      for (size_t k = 0; k < grad_in.size(); ++k) {
        if (!node.needs(k)) grad_in[k] = Tensor();  // the rule may fill every input's
        if (grad_in[k].defined() && tangents[k].defined()) detail::set_tangent(grad_in[k], std::move(tangents[k]));
      }
      return;
    }
  }
  (op.recorded_backward && grad_enabled() ? op.recorded_backward : op.backward)(node, grad_out, grad_in);
  if (op.linear.transpose && node.needs(op.linear.input))
    grad_in[op.linear.input] = op.linear.transpose(node, grad_out);
}

// Every op family's OpDefs are registered before main(): the shared library
// holds every family, and the static one is a single prelinked object (see
// meson.build), so no link drops a family whose ops a program never calls.
std::vector<const OpDef*> op_table() {
  std::vector<const OpDef*> ops = registry();
  std::sort(ops.begin(), ops.end(), [](const OpDef* a, const OpDef* b) { return a->name < b->name; });
  return ops;
}

const OpDef* find_op(std::string_view name) {
  for (const OpDef* op : op_table())
    if (op->name == name) return op;
  return nullptr;
}

}  // namespace tg
