#include "autograd/tape.h"

#include <fmt/format.h>

#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

thread_local bool t_grad_enabled = true;

// Adds g into a gradient slot. A leaf owns its .grad and accumulates in place
// (PyTorch semantics); a node's slot may alias a tensor another node also
// received, so it is only written in place when nothing else holds it.
void accumulate(Tensor& slot, const Tensor& g, bool leaf) {
  if (!slot.defined()) {
    bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.is_contiguous();
    slot = (leaf && !exclusive) ? g.clone() : g;
    return;
  }
  bool exclusive = slot.impl_ptr().use_count() == 1 && slot.storage().use_count() == 1;
  if (leaf || exclusive)
    slot.add_(g);
  else
    slot = add(slot, g);
}

}  // namespace

void Node::save(const Tensor& t) {
  if (t.defined()) {
    const TensorImpl* impl = t.impl();
    Tape& tp = tape();
    // Only while t still holds what its producer wrote: after an in-place
    // write (even one not recorded, under no_grad) a rebuild would differ.
    if (impl->node >= 0 && impl->epoch == tp.epoch() && static_cast<size_t>(impl->node) < tp.size() &&
        tp.node(impl->node).op->recompute && &tp.node(impl->node) != this &&
        t.version() == tp.node(impl->node).out_version) {
      saved.push_back({Tensor(), 0, impl->node});
      return;
    }
  }
  saved.push_back({t, t.defined() ? t.version() : 0, -1});
}

void Node::drop_recomputed() {
  for (SavedTensor& s : saved)
    if (s.producer >= 0) s.tensor = Tensor();
}

const Tensor& Node::saved_tensor(size_t k) const {
  const SavedTensor& s = saved.at(k);
  if (s.producer >= 0) {
    // The producer is earlier on the tape, so its backward (which frees what
    // it saved) has not run yet. Rebuilt without recording.
    if (!s.tensor.defined()) {
      const Node& p = tape().node(static_cast<size_t>(s.producer));
      NoGradGuard no_grad;
      ProfileScope prof(p.op->name, ProfilePhase::recompute);
      s.tensor = p.op->recompute(p);
    }
    return s.tensor;
  }
  if (s.tensor.defined() && s.tensor.version() != s.version)
    throw AutogradError(fmt::format(
        "backward of '{}': a tensor it saved (shape {}) was modified in place after it was saved "
        "(version {} now, {} when saved); clone it before writing to it",
        op->name, s.tensor.shape(), s.tensor.version(), s.version));
  return s.tensor;
}

Node& Tape::push(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out) {
  if (size_ == nodes_.size()) nodes_.emplace_back();
  Node& n = nodes_[size_];
  n.op = &op;
  n.edges.clear();
  n.saved.clear();
  std::fill(std::begin(n.f), std::end(n.f), 0.0);
  std::fill(std::begin(n.i), std::end(n.i), 0);
  n.shape_attr = Shape();
  n.out_shape = out.shape();
  n.out_dtype = out.dtype();
  n.out_version = out.version();
  n.grad = Tensor();
  for (const Tensor* in : inputs) {
    Edge& e = n.edges.emplace_back();
    e.leaf.reset();
    if (!in->defined()) continue;
    e.shape = in->shape();
    e.dtype = in->dtype();
    TensorImpl* impl = in->impl();
    if (!impl->requires_grad) continue;
    e.needs_grad = true;
    if (impl->node < 0)
      e.leaf = in->impl_ptr();
    else if (impl->epoch == epoch_)
      e.node = impl->node;
    else
      e.freed = true;
  }
  TensorImpl* o = out.impl();
  o->requires_grad = true;
  o->node = static_cast<int32_t>(size_);
  o->epoch = epoch_;
  ++size_;
  return n;
}

void Tape::clear() {
  for (size_t k = 0; k < size_; ++k) {
    Node& n = nodes_[k];
    n.edges.clear();  // keeps capacity for the next step
    n.saved.clear();
    n.grad = Tensor();
  }
  size_ = 0;
  ++epoch_;
}

void Tape::backward(const Tensor& root, const Tensor& grad_in, bool retain_graph) {
  if (!root.defined()) throw AutogradError("backward: tensor is undefined");
  if (!root.requires_grad())
    throw AutogradError(fmt::format(
        "backward: tensor of shape {} does not require grad (no input has requires_grad, or it was computed under no_grad)",
        root.shape()));
  Tensor grad = grad_in;
  if (!grad.defined()) {
    if (root.numel() != 1)
      throw AutogradError(fmt::format(
          "backward: output of shape {} is not a scalar; pass a gradient of that shape", root.shape()));
    grad = ones(root.shape(), root.dtype());
  } else {
    if (!(grad.shape() == root.shape()))
      throw ShapeError(fmt::format("backward: gradient of shape {} for an output of shape {}", grad.shape(), root.shape()));
    if (grad.dtype() != root.dtype())
      throw DTypeError(fmt::format("backward: gradient is {} for an output of {}", dtype_name(grad.dtype()),
                                   dtype_name(root.dtype())));
  }
  NoGradGuard no_grad;
  TensorImpl* r = root.impl();
  if (r->node < 0) {  // a leaf: d root / d root = grad
    accumulate(r->grad, grad, true);
    return;
  }
  if (r->epoch != epoch_)
    throw AutogradError(
        "backward: the graph of this tensor was already freed by an earlier backward "
        "(pass retain_graph=true to the first backward to run another one)");

  const size_t start = static_cast<size_t>(r->node);
  nodes_[start].grad = grad;
  std::vector<Tensor> grads;
  try {
    for (size_t k = start + 1; k-- > 0;) {
      Node& n = nodes_[k];
      if (!n.grad.defined()) continue;
      grads.assign(n.edges.size(), Tensor());
      {
        ProfileScope prof(n.op->name, ProfilePhase::backward);
        // The node's gradient is handed over, not shared: a backward that
        // holds the only reference may write its result into it (fused_grad).
        const Tensor g = std::move(n.grad);
        n.op->backward(n, g, grads);
      }
      // Without retain_graph this node is never run again: drop what it saved
      // now, so activations are freed as the reverse pass goes instead of all
      // at the end (lowers the peak by the gradients that backward allocates).
      if (retain_graph)
        n.drop_recomputed();
      else
        n.saved.clear();
      for (size_t e = 0; e < n.edges.size(); ++e) {
        Edge& edge = n.edges[e];
        Tensor& g = grads[e];
        if (!edge.needs_grad || !g.defined()) continue;
        if (!(g.shape() == edge.shape) || g.dtype() != edge.dtype)
          throw AutogradError(fmt::format(
              "backward of '{}' returned a gradient of shape {} {} for input {} of shape {} {}", n.op->name,
              g.shape(), dtype_name(g.dtype()), e, edge.shape, dtype_name(edge.dtype)));
        if (edge.freed)
          throw AutogradError(fmt::format(
              "backward: input {} of '{}' was produced on a graph already freed by an earlier backward "
              "(detach() it, or pass retain_graph=true to the earlier backward)",
              e, n.op->name));
        if (edge.node >= 0)
          accumulate(nodes_[edge.node].grad, g, false);
        else if (edge.leaf)
          accumulate(edge.leaf->grad, g, true);
      }
      n.grad = Tensor();
    }
  } catch (...) {
    // Some nodes may already have dropped their saved tensors: without
    // retain_graph the graph is freed, so a retry says so instead of misbehaving.
    if (retain_graph)
      for (size_t k = 0; k < size_; ++k) nodes_[k].grad = Tensor();
    else
      clear();
    throw;
  }
  if (!retain_graph) clear();
}

std::string Tape::to_dot() const {
  std::string out = "digraph tape {\n  rankdir=BT;\n  node [shape=box, fontname=\"monospace\"];\n";
  int leaves = 0;
  for (size_t k = 0; k < size_; ++k) {
    const Node& n = nodes_[k];
    out += fmt::format("  n{} [label=\"#{} {}\\n{} {}\"];\n", k, k, n.op->name, n.out_shape, dtype_name(n.out_dtype));
    for (size_t e = 0; e < n.edges.size(); ++e) {
      const Edge& edge = n.edges[e];
      if (edge.node >= 0) {
        out += fmt::format("  n{} -> n{};\n", edge.node, k);
      } else if (edge.leaf) {
        out += fmt::format("  leaf{} [shape=ellipse, label=\"leaf\\n{} {}\"];\n  leaf{} -> n{};\n", leaves,
                           edge.shape, dtype_name(edge.dtype), leaves, k);
        ++leaves;
      }
    }
  }
  return out + "}\n";
}

Tape& tape() {
  thread_local Tape t;
  return t;
}

std::string to_dot() { return tape().to_dot(); }

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

Node* record(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out) {
  if (!t_grad_enabled) return nullptr;
  bool any = false;
  for (const Tensor* in : inputs) any |= in->defined() && in->requires_grad();
  if (!any) return nullptr;
  if (!is_floating(out.dtype()))
    throw AutogradError(fmt::format("{}: an integer output cannot require grad", op.name));
  return &tape().push(op, inputs, out);
}

}  // namespace tg
