// The backward pass: backward(), grad() and grad_and_tangents() run one
// reverse pass (Pass) over the nodes their roots reach, with hooks and
// gradient accumulation. A pass keeps its working state (each node's
// incoming gradients, whether it runs) to itself, so a pass started inside
// another (a hook, a recorded backward calling grad()) shares nothing with it.
#include <algorithm>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>

#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "autograd/forward_ad.h"
#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/profiler.h"
#include "autograd/tape.h"
#include "autograd/tape_internal.h"

namespace tg {
using detail::describe_node;

namespace {

std::atomic<uint64_t> g_next_pass{1};

Tensor run_hooks(std::vector<HookEntry>& hooks, Tensor g, const char* where) {
  for (HookEntry& h : hooks) {
    if (!*h.active) continue;
    Tensor r = h.fn(g);
    if (!r.defined()) continue;
    if (!(r.shape() == g.shape()) || r.dtype() != g.dtype())
      throw AutogradError(fmt::format("hook on {}: returned a gradient of shape {} {} for one of shape {} {}", where,
                                      r.shape(), dtype_name(r.dtype()), g.shape(), dtype_name(g.dtype())));
    g = std::move(r);
  }
  return g;
}

// A dense tensor that nothing else holds: it can be written in place.
bool exclusive(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.storage().use_count() == 1 && t.is_contiguous();
}

// Adds g into a gradient slot. A leaf owns its .grad and accumulates in place
// (PyTorch semantics); a node's slot may alias a tensor another node also
// received, so it is only written in place when nothing else holds it. When
// the backward is recorded (create_graph) the sum is a recorded op instead.
void accumulate(Tensor& slot, const Tensor& g, bool leaf) {
  if (!slot.defined()) {
    slot = (leaf && !exclusive(g) && !grad_enabled()) ? g.clone() : g;
    return;
  }
  if (grad_enabled()) {
    slot = add(slot, g);
    return;
  }
  // In place only into a dense slot: a strided one (a transposed view a
  // backward returned) is replaced by a dense sum, so that later
  // contributions add at memory speed.
  if ((leaf && !slot.requires_grad()) || exclusive(slot))
    slot.add_(g);
  else
    slot = add(slot, g);
}

// What a pass keeps of a node it reached (the node itself is the record of
// an op): the gradients flowing into its outputs, and whether it runs.
struct NodeInPass {
  Node* node = nullptr;
  Tensor grad;                     // into the output
  std::vector<Tensor> side_grads;  // into side output k, at k-1
  bool run = false;                // this pass runs its backward
  int32_t capture = -1;            // grad(): the index of the input the node produced
};
// And of a leaf: the edges still to deliver a gradient to it (its
// post-accumulate hooks fire at zero), and grad()'s index of it.
struct LeafInPass {
  int32_t pending = 0;
  int32_t capture = -1;
};

class Pass;
// The innermost plain (not create_graph) pass running on this thread, or null.
thread_local const Pass* t_plain_pass = nullptr;
// The side outputs' gradients of the backward running now (Node::side_grad).
thread_local const detail::SideGradsScope* t_side_grads = nullptr;

// One reverse pass, shared by backward() and grad(). With `inputs` given,
// their gradients are collected and no .grad is touched.
class Pass {
 public:
  // cut: the inputs bound the graph (detail::region_grad): the pass follows
  // no edge out of an input's node.
  Pass(const std::vector<Tensor>& roots, const std::vector<Tensor>* inputs, const GradOptions& options,
       const char* api, bool cut = false)
      : roots_(roots), inputs_(inputs), options_(options), api_(api), cut_(cut),
        retain_(options.retain_graph.value_or(options.create_graph)),
        id_(g_next_pass.fetch_add(1, std::memory_order_relaxed)) {}

  uint64_t id() const { return id_; }
  // Whether this pass reached n and runs its backward.
  bool runs(const Node& n) const {
    auto it = nodes_.find(&n);
    return it != nodes_.end() && it->second.run;
  }

  std::vector<Tensor> run(const std::vector<Tensor>& root_grads) {
    std::vector<Tensor> seeds = check_seeds(root_grads);
    check_inputs();
    collect();
    if (inputs_) mark_needed();
    std::optional<NoGradGuard> no_grad;
    std::optional<EnableGradGuard> with_grad;
    struct PlainPass {
      const Pass* outer = t_plain_pass;
      ~PlainPass() { t_plain_pass = outer; }
    } plain_pass;
    t_plain_pass = options_.create_graph ? nullptr : this;
    if (options_.create_graph)  // the backward functions record: their gradients are differentiable
      with_grad.emplace();
    else
      no_grad.emplace();
    seed(seeds);
    std::vector<Tensor> grads;
    for (size_t k = order_.size(); k-- > 0;) {
      NodeInPass& s = *order_[k];
      grads.assign(s.node->edges.size(), Tensor());
      run_node(s, grads);
      deliver(*s.node, grads);
    }
    if (inputs_) finish_inputs();
    return std::move(results_);
  }

 private:
  // The output gradients, checked against their outputs (ones for scalars).
  std::vector<Tensor> check_seeds(const std::vector<Tensor>& root_grads) const {
    if (roots_.empty()) throw AutogradError(fmt::format("{}: no outputs given", api_));
    if (!root_grads.empty() && root_grads.size() != roots_.size())
      throw AutogradError(
          fmt::format("{}: {} outputs but {} output gradients", api_, roots_.size(), root_grads.size()));
    std::vector<Tensor> seeds(roots_.size());
    for (size_t r = 0; r < roots_.size(); ++r) {
      const Tensor& root = roots_[r];
      if (!root.defined()) throw AutogradError(fmt::format("{}: output {} is undefined", api_, r));
      if (!root.requires_grad())
        throw AutogradError(fmt::format(
            "{}: output {} (shape {}) does not require grad (no input has requires_grad, or it was computed under "
            "no_grad)",
            api_, r, root.shape()));
      Tensor g = root_grads.empty() ? Tensor() : root_grads[r];
      if (!g.defined()) {
        if (root.numel() != 1)
          throw AutogradError(fmt::format(
              "{}: output {} of shape {} is not a scalar; pass a gradient of that shape", api_, r, root.shape()));
        g = ones(root.shape(), root.dtype());
      } else if (!(g.shape() == root.shape())) {
        throw ShapeError(fmt::format("{}: gradient of shape {} for output {} of shape {}", api_, g.shape(), r,
                                     root.shape()));
      } else if (g.dtype() != root.dtype()) {
        throw DTypeError(fmt::format("{}: gradient is {} for output {} of {}", api_, dtype_name(g.dtype()), r,
                                     dtype_name(root.dtype())));
      }
      seeds[r] = std::move(g);
    }
    return seeds;
  }

  void check_inputs() {
    if (!inputs_) return;
    results_.resize(inputs_->size());
    for (size_t k = 0; k < inputs_->size(); ++k) {
      const Tensor& x = (*inputs_)[k];
      if (!x.defined() || !x.requires_grad())
        throw AutogradError(fmt::format("{}: input {} does not require grad", api_, k));
      if (x.impl()->output_nr != 0)
        throw AutogradError(fmt::format("{}: input {} is a side output of '{}' (an intermediate its recorded "
                                        "backward reads), not a tensor to differentiate with respect to",
                                        api_, k, x.impl()->grad_fn->op->name));
    }
  }

  // Every node the roots reach (iterative: no recursion), oldest first, and
  // each leaf's count of incoming edges (for the post-accumulate hooks).
  void collect() {
    const bool run_all = !inputs_;
    for (const Tensor& root : roots_)
      if (Node* n = root.impl()->grad_fn.get()) visit(n, run_all);
    for (size_t k = 0; k < order_.size(); ++k) {
      if (is_cut(order_[k]->node)) continue;
      for (Edge& e : order_[k]->node->edges) {
        if (!e.needs_grad) continue;
        if (Node* p = e.node.get())
          visit(p, run_all);
        else if (TensorImpl* leaf = e.leaf.get())
          ++leaves_[leaf].pending;
      }
    }
    std::sort(order_.begin(), order_.end(),
              [](const NodeInPass* a, const NodeInPass* b) { return a->node->seq < b->node->seq; });
  }

  // First visit of n in this pass.
  void visit(Node* n, bool run) {
    auto [it, fresh] = nodes_.try_emplace(n);
    if (!fresh) return;
    NodeInPass& s = it->second;
    s.node = n;
    s.run = run;
    s.side_grads.resize(n->side_outputs);
    order_.push_back(&s);
  }

  // What this pass keeps of n, or null if it did not reach n.
  NodeInPass* find(const Node* n) {
    auto it = nodes_.find(n);
    return it == nodes_.end() ? nullptr : &it->second;
  }
  // Whether the gradient reaching n is wanted: its backward runs, or it is grad()'s.
  NodeInPass* wanted(const Node* n) {
    NodeInPass* s = find(n);
    return s && (s->run || s->capture >= 0) ? s : nullptr;
  }
  int32_t leaf_capture(const TensorImpl* leaf) const {
    auto it = leaves_.find(leaf);
    return it == leaves_.end() ? -1 : it->second.capture;
  }

  // grad(): a node runs only when one of its edges leads to an input. Oldest
  // first, so an edge's producer is decided before its consumer.
  void mark_needed() {
    for (size_t k = 0; k < inputs_->size(); ++k) {
      TensorImpl* x = (*inputs_)[k].impl();
      if (Node* n = x->grad_fn.get()) {
        if (NodeInPass* s = find(n)) s->capture = static_cast<int32_t>(k);
      } else {
        leaves_[x].capture = static_cast<int32_t>(k);
      }
    }
    for (NodeInPass* s : order_)
      for (const Edge& e : is_cut(s->node) ? std::span<const Edge>() : std::span<const Edge>(s->node->edges)) {
        if (!e.needs_grad) continue;
        if (e.node ? wanted(e.node.get()) != nullptr : (e.leaf && leaf_capture(e.leaf.get()) >= 0)) s->run = true;
      }
  }

  // Whether the pass stops at n: a cut pass's input was made by it.
  bool is_cut(const Node* n) const {
    auto made_by_n = [&](const Tensor& x) { return x.impl()->grad_fn.get() == n; };
    return cut_ && std::any_of(inputs_->begin(), inputs_->end(), made_by_n);
  }

  // A root with a node gets its seed there; a root that is a leaf (or an input) directly.
  void seed(const std::vector<Tensor>& seeds) {
    for (size_t r = 0; r < roots_.size(); ++r) {
      TensorImpl* root = roots_[r].impl();
      if (Node* n = root->grad_fn.get())
        accumulate(slot(*find(n), root->output_nr), seeds[r], false);
      else if (inputs_)
        capture(leaf_capture(root), seeds[r]);
      else
        accumulate(root->grad, seeds[r], true);
    }
  }

  // Where the gradient of output `output` of n accumulates.
  static Tensor& slot(NodeInPass& s, uint32_t output) { return output == 0 ? s.grad : s.side_grads[output - 1]; }

  void capture(int32_t slot, const Tensor& g) {
    if (slot >= 0) accumulate(results_[static_cast<size_t>(slot)], g, false);
  }

  // Hooks, retain_grad and grad()'s capture, then the node's backward into grads.
  void run_node(NodeInPass& s, std::vector<Tensor>& grads) {
    Node& n = *s.node;
    // The node's gradient is handed over, not shared: a backward that holds
    // the only reference may write its result into it (fused_grad).
    Tensor g = std::move(s.grad);
    s.grad = Tensor();
    bool side = false;
    for (const Tensor& sg : s.side_grads) side |= sg.defined();
    if (!(g.defined() || side) || !(s.run || s.capture >= 0)) return s.side_grads.clear();
    if (g.defined()) {
      if (!n.hooks.empty()) g = run_hooks(n.hooks, std::move(g), describe_node(n).c_str());
      if (auto kept = n.retains.lock()) kept->grad = options_.create_graph ? g : g.detach();
      capture(s.capture, g);
    }
    if (!s.run) return s.side_grads.clear();
    check_runnable(n);
    // Checked against the output's gradient only: with side outputs, an
    // input's gradient may depend on that one alone, and be a constant when
    // only a side output was reached (it is zero then).
    const bool g_records = options_.create_graph && g.defined() && g.requires_grad();
    if (!g.defined()) g = zeros(n.out_shape, n.out_dtype);  // only a side output was reached
    if (Tensor* into = accumulating_slot(n)) {
      ProfileScope prof(n.op->name, ProfilePhase::backward);
      n.op->accumulate(n, g, *into);
      s.side_grads.clear();
      release_saved(n);
      return;  // grads stay undefined: nothing more to deliver
    }
    // Counted before backward runs: it may write its result into g's buffer.
    const bool anomaly = anomaly_enabled();
    const NonFiniteCount incoming = anomaly ? count_non_finite(g) : NonFiniteCount{};
    {
      ProfileScope prof(n.op->name, ProfilePhase::backward);
      AutocastGuard precision(n.autocast);
      detail::SideGradsScope side_grads(n, s.side_grads);
      run_backward(n, g, grads);
    }
    if (anomaly) [[unlikely]]
      detail::check_backward(n, incoming, grads, api_);
    s.side_grads.clear();
    release_saved(n);
    check_input_grads(n, grads, g_records);
  }

  // For an op with an accumulate function (OpDef::accumulate), on a plain
  // pass: its input's slot, when that already holds a buffer the op can add
  // into. Anomaly detection checks each backward's result, and forward mode
  // computes the tangents of what a backward returns, so both take the
  // general path.
  Tensor* accumulating_slot(Node& n) {
    if (!n.op->accumulate || options_.create_graph || anomaly_enabled() || forward_ad_enabled()) return nullptr;
    Edge& e = n.edges[0];
    NodeInPass* p = e.needs_grad ? wanted(e.node.get()) : nullptr;
    if (!p) return nullptr;
    Tensor& s = slot(*p, e.output);
    return s.defined() && exclusive(s) && s.dtype() == n.out_dtype ? &s : nullptr;
  }

  // n's backward can run: what it saved is still there, and it is
  // differentiable when this pass is recorded.
  void check_runnable(const Node& n) const {
    if (n.released)
      throw AutogradError(fmt::format(
          "{}: cannot run the backward of {} again: what it saved was freed by an earlier backward() or grad() "
          "that ran without retain_graph=true (pass retain_graph=true to that call to backpropagate through "
          "this graph twice)",
          api_, describe_node(n)));
    if (options_.create_graph && n.op->once_differentiable)
      throw AutogradError(fmt::format(
          "{}: create_graph through {}: its backward is declared once-differentiable, so its gradient cannot "
          "be differentiated again",
          api_, describe_node(n)));
  }

  // After n's backward ran: unless the graph is retained it never runs again,
  // so what it saved goes now, with the tangents it keeps for forward over
  // reverse, and activations are freed as the reverse pass goes instead of
  // all at the end.
  void release_saved(Node& n) const {
    if (retain_) {
      n.drop_recomputed();
      return;
    }
    if (!n.saved.empty()) {
      n.saved.clear();
      n.released = true;
    }
    detail::forget_tangents(n);
  }

  // The gradients n's backward returned, one per input edge: each of its
  // input's shape and dtype, and recorded when the incoming one (`g_records`) was.
  void check_input_grads(const Node& n, const std::vector<Tensor>& grads, bool g_records) const {
    for (size_t e = 0; e < n.edges.size(); ++e) {
      const Edge& edge = n.edges[e];
      const Tensor& gi = grads[e];
      if (!edge.needs_grad || !gi.defined()) continue;
      if (!(gi.shape() == edge.shape) || gi.dtype() != edge.dtype)
        throw AutogradError(fmt::format(
            "backward of '{}' returned a gradient of shape {} {} for input {} of shape {} {}", n.op->name,
            gi.shape(), dtype_name(gi.dtype()), e, edge.shape, dtype_name(edge.dtype)));
      // A gradient is linear in the incoming one: if that was recorded and
      // this one is not, the backward ran raw kernels and a second
      // derivative through it would silently be zero.
      if (g_records && !gi.requires_grad())
        throw AutogradError(fmt::format(
            "{}: create_graph through {}: its backward is not differentiable (gradient {} was computed outside "
            "the graph); write it with tensor ops, or declare the op once-differentiable",
            api_, describe_node(n), e));
    }
  }

  // Into the producers' slots and the leaves' .grad (or grad()'s results).
  // Each leaf's pending edges count down even where no gradient flows, so a
  // post-accumulate hook fires exactly once per pass.
  void deliver(Node& n, std::vector<Tensor>& grads) {
    for (size_t e = 0; e < n.edges.size(); ++e) {
      Edge& edge = n.edges[e];
      if (!edge.needs_grad) continue;
      Tensor& gi = grads[e];
      if (Node* p = edge.node.get()) {
        if (NodeInPass* into = gi.defined() ? wanted(p) : nullptr) accumulate(slot(*into, edge.output), gi, false);
        continue;
      }
      TensorImpl* leaf = edge.leaf.get();
      if (!leaf) continue;
      LeafInPass& l = leaves_[leaf];
      if (gi.defined()) {
        if (leaf->hooks && !leaf->hooks->grad.empty()) gi = run_hooks(leaf->hooks->grad, std::move(gi), "a leaf");
        if (inputs_)
          capture(l.capture, gi);
        else
          accumulate(leaf->grad, gi, true);
      }
      if (--l.pending == 0 && !inputs_ && leaf->hooks && !leaf->hooks->post_accumulate.empty()) {
        Tensor handle(edge.leaf);
        for (auto& [active, fn] : leaf->hooks->post_accumulate)
          if (*active) fn(handle);
      }
    }
  }

  void finish_inputs() {
    for (size_t k = 0; k < inputs_->size(); ++k) {
      const TensorImpl* x = (*inputs_)[k].impl();
      if (!results_[k].defined() && !options_.allow_unused)
        throw AutogradError(fmt::format(
            "{}: input {} (shape {}) is not reached from the outputs; pass allow_unused=true to get an undefined "
            "gradient for it",
            api_, k, x->shape));
    }
  }

  const std::vector<Tensor>& roots_;
  const std::vector<Tensor>* inputs_;
  const GradOptions& options_;
  const char* api_;
  const bool cut_;
  const bool retain_;
  const uint64_t id_;
  // Every node reached, oldest first, and their state; the leaves' state.
  std::unordered_map<const Node*, NodeInPass> nodes_;
  std::vector<NodeInPass*> order_;
  std::unordered_map<const TensorImpl*, LeafInPass> leaves_;
  std::vector<Tensor> results_;
};

}  // namespace

uint64_t detail::plain_pass() { return t_plain_pass ? t_plain_pass->id() : 0; }
bool detail::plain_pass_runs(const Node& n) { return t_plain_pass && t_plain_pass->runs(n); }

detail::SideGradsScope::SideGradsScope(const Node& n, std::span<const Tensor> grads)
    : node_(&n), grads_(grads), outer_(t_side_grads) {
  t_side_grads = this;
}
detail::SideGradsScope::~SideGradsScope() { t_side_grads = outer_; }

const Tensor& detail::side_grad(const Node& n, uint32_t k) {
  static const Tensor none;
  const SideGradsScope* s = t_side_grads;
  return s && s->node_ == &n && k >= 1 && k <= s->grads_.size() ? s->grads_[k - 1] : none;
}

// ---------------------------------------------------------------- API
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, const GradOptions& options) {
  if (inputs.empty()) throw AutogradError("grad: no inputs given");
  return Pass(outputs, &inputs, options, "grad").run(grad_outputs);
}

std::vector<Tensor> detail::region_grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                        const std::vector<Tensor>& grad_outputs, const GradOptions& options) {
  return Pass(outputs, &inputs, options, "grad", true).run(grad_outputs);
}

void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs, const GradOptions& options) {
  Pass(outputs, nullptr, options, "backward").run(grad_outputs);
}

void Tensor::backward(const Tensor& grad, std::optional<bool> retain_graph, bool create_graph) const {
  const std::vector<Tensor> roots{*this};
  const GradOptions options{.retain_graph = retain_graph, .create_graph = create_graph, .allow_unused = false};
  Pass(roots, nullptr, options, "backward").run({grad});
}

GradTangents grad_and_tangents(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& grad_outputs, bool retain_graph) {
  if (!forward_ad_enabled())
    throw AutogradError("grad_and_tangents: no forward-AD level is open (make a ForwardADGuard)");
  if (inputs.empty()) throw AutogradError("grad_and_tangents: no inputs given");
  detail::TangentsOnly only;
  // create_graph: the backward functions take their forms in ops, whose
  // record() computes tangents here instead of recording. Nothing of this
  // pass is recorded, so unless retained the graph is freed as it goes, as by
  // a plain backward: each node's saved tensors and their tangents.
  const GradOptions options{.retain_graph = retain_graph, .create_graph = true, .allow_unused = true};
  std::vector<Tensor> g = Pass(outputs, &inputs, options, "grad_and_tangents").run(grad_outputs);
  GradTangents r;
  for (Tensor& gk : g) {
    r.tangents.push_back(gk.defined() ? tangent(gk) : Tensor());
    r.grads.push_back(std::move(gk));
  }
  return r;
}

}  // namespace tg
