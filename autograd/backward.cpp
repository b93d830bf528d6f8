// The backward pass: backward(), grad() and grad_and_tangents() run one
// reverse pass (Pass) over the nodes their roots reach; hooks, gradient
// accumulation and the pass state kept for passes nested in another.
#include <algorithm>
#include <deque>
#include <optional>

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

// The fields of nodes and leaves that hold a running pass's state. A pass
// started inside another (a hook, or a recorded backward that calls grad())
// may touch the same nodes: it keeps their outer state and puts it back.
struct NodeState {
  Node* node;
  Tensor grad;
  std::vector<Tensor> side_grads;
  uint64_t pass;
  bool run;
  int32_t capture;
};
struct LeafState {
  TensorImpl* leaf;
  uint64_t pass;
  int32_t pending, capture;
};

// Per-thread scratch of a pass, one per nesting level: the nodes it collected
// and, below the top level, the outer state to restore.
struct PassScratch {
  std::vector<Node*> nodes;
  std::vector<NodeState> saved_nodes;
  std::vector<LeafState> saved_leaves;
};
struct Scratch {
  std::deque<PassScratch> levels;  // a deque: growing keeps outer levels' references valid
  size_t depth = 0;
};
thread_local Scratch t_scratch;
// The plain pass running on this thread (detail::plain_pass), or 0.
thread_local uint64_t t_plain_pass = 0;

class PassLevel {
 public:
  PassLevel() : s_(enter()), nested_(t_scratch.depth > 1) {}
  ~PassLevel() {
    for (auto it = s_.saved_nodes.rbegin(); it != s_.saved_nodes.rend(); ++it) {
      it->node->grad = std::move(it->grad);
      it->node->side_grads = std::move(it->side_grads);
      it->node->pass = it->pass;
      it->node->run = it->run;
      it->node->capture = it->capture;
    }
    for (auto it = s_.saved_leaves.rbegin(); it != s_.saved_leaves.rend(); ++it) {
      it->leaf->pass = it->pass;
      it->leaf->pending = it->pending;
      it->leaf->capture = it->capture;
    }
    s_.nodes.clear();
    s_.saved_nodes.clear();
    s_.saved_leaves.clear();
    --t_scratch.depth;
  }
  std::vector<Node*>& nodes() { return s_.nodes; }
  // First visit of n in this pass: keeps an outer pass's state, then resets.
  void visit(Node* n, uint64_t pass, bool run) {
    if (nested_ && n->pass != 0)
      s_.saved_nodes.push_back({n, std::move(n->grad), n->side_grads, n->pass, n->run, n->capture});
    n->pass = pass;
    n->grad = Tensor();
    for (Tensor& g : n->side_grads) g = Tensor();
    n->run = run;
    n->capture = -1;
    s_.nodes.push_back(n);
  }
  void visit(TensorImpl* leaf, uint64_t pass) {
    if (nested_ && leaf->pass != 0) s_.saved_leaves.push_back({leaf, leaf->pass, leaf->pending, leaf->capture});
    leaf->pass = pass;
    leaf->pending = 0;
    leaf->capture = -1;
  }

 private:
  static PassScratch& enter() {
    if (t_scratch.levels.size() <= t_scratch.depth) t_scratch.levels.resize(t_scratch.depth + 1);
    return t_scratch.levels[t_scratch.depth++];
  }
  PassScratch& s_;
  bool nested_;
};

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
        id_(g_next_pass.fetch_add(1, std::memory_order_relaxed)), order_(level_.nodes()) {}

  std::vector<Tensor> run(const std::vector<Tensor>& root_grads) {
    std::vector<Tensor> seeds = check_seeds(root_grads);
    check_inputs();
    collect();
    if (inputs_) mark_needed();
    std::optional<NoGradGuard> no_grad;
    std::optional<EnableGradGuard> with_grad;
    struct PlainPass {
      uint64_t outer = t_plain_pass;
      ~PlainPass() { t_plain_pass = outer; }
    } plain_pass;
    t_plain_pass = options_.create_graph ? 0 : id_;
    if (options_.create_graph)  // the backward functions record: their gradients are differentiable
      with_grad.emplace();
    else
      no_grad.emplace();
    seed(seeds);
    std::vector<Tensor> grads;
    for (size_t k = order_.size(); k-- > 0;) {
      Node& n = *order_[k];
      grads.assign(n.edges.size(), Tensor());
      run_node(n, grads);
      deliver(n, grads);
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
      if (Node* n = root.impl()->grad_fn.get(); n && n->pass != id_) level_.visit(n, id_, run_all);
    for (size_t k = 0; k < order_.size(); ++k) {
      if (is_cut(order_[k])) continue;
      for (Edge& e : order_[k]->edges) {
        if (!e.needs_grad) continue;
        if (Node* p = e.node.get()) {
          if (p->pass != id_) level_.visit(p, id_, run_all);
        } else if (TensorImpl* leaf = e.leaf.get()) {
          if (leaf->pass != id_) level_.visit(leaf, id_);
          ++leaf->pending;
        }
      }
    }
    std::sort(order_.begin(), order_.end(), [](const Node* a, const Node* b) { return a->seq < b->seq; });
  }

  // grad(): a node runs only when one of its edges leads to an input. Oldest
  // first, so an edge's producer is decided before its consumer.
  void mark_needed() {
    for (size_t k = 0; k < inputs_->size(); ++k) {
      TensorImpl* x = (*inputs_)[k].impl();
      if (Node* n = x->grad_fn.get()) {
        if (n->pass == id_) n->capture = static_cast<int32_t>(k);
      } else {
        if (x->pass != id_) level_.visit(x, id_);
        x->capture = static_cast<int32_t>(k);
      }
    }
    for (Node* n : order_)
      for (const Edge& e : is_cut(n) ? std::span<const Edge>() : std::span<const Edge>(n->edges)) {
        if (!e.needs_grad) continue;
        if (e.node ? (e.node->capture >= 0 || e.node->run) : (e.leaf && e.leaf->capture >= 0)) n->run = true;
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
        accumulate(slot(*n, root->output_nr), seeds[r], false);
      else if (inputs_)
        capture(root->capture, seeds[r]);
      else
        accumulate(root->grad, seeds[r], true);
    }
  }

  // Where the gradient of output `output` of n accumulates.
  static Tensor& slot(Node& n, uint32_t output) { return output == 0 ? n.grad : n.side_grads[output - 1]; }

  void capture(int32_t slot, const Tensor& g) {
    if (slot >= 0) accumulate(results_[static_cast<size_t>(slot)], g, false);
  }

  // Hooks, retain_grad and grad()'s capture, then the node's backward into grads.
  void run_node(Node& n, std::vector<Tensor>& grads) {
    // The node's gradient is handed over, not shared: a backward that holds
    // the only reference may write its result into it (fused_grad).
    Tensor g = std::move(n.grad);
    n.grad = Tensor();
    bool side = false;
    for (const Tensor& s : n.side_grads) side |= s.defined();
    if (!(g.defined() || side) || !(n.run || n.capture >= 0)) return clear_side_grads(n);
    if (g.defined()) {
      if (!n.hooks.empty()) g = run_hooks(n.hooks, std::move(g), describe_node(n).c_str());
      if (auto kept = n.retains.lock()) kept->grad = options_.create_graph ? g : g.detach();
      capture(n.capture, g);
    }
    if (!n.run) return clear_side_grads(n);
    check_runnable(n);
    // Checked against the output's gradient only: with side outputs, an
    // input's gradient may depend on that one alone, and be a constant when
    // only a side output was reached (it is zero then).
    const bool g_records = options_.create_graph && g.defined() && g.requires_grad();
    if (!g.defined()) g = zeros(n.out_shape, n.out_dtype);  // only a side output was reached
    if (Tensor* into = accumulating_slot(n)) {
      ProfileScope prof(n.op->name, ProfilePhase::backward);
      n.op->accumulate(n, g, *into);
      clear_side_grads(n);
      release_saved(n);
      return;  // grads stay undefined: nothing more to deliver
    }
    // Counted before backward runs: it may write its result into g's buffer.
    const bool anomaly = anomaly_enabled();
    const NonFiniteCount incoming = anomaly ? count_non_finite(g) : NonFiniteCount{};
    {
      ProfileScope prof(n.op->name, ProfilePhase::backward);
      AutocastGuard precision(n.autocast);
      run_backward(n, g, grads);
    }
    if (anomaly) [[unlikely]]
      detail::check_backward(n, incoming, grads, api_);
    clear_side_grads(n);
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
    Node* p = e.node.get();
    if (!e.needs_grad || !p || !(p->run || p->capture >= 0)) return nullptr;
    Tensor& s = slot(*p, e.output);
    return s.defined() && exclusive(s) && s.dtype() == n.out_dtype ? &s : nullptr;
  }

  static void clear_side_grads(Node& n) {
    for (Tensor& s : n.side_grads) s = Tensor();
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
    n.tangents_in.clear();
    n.tangents.clear();
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
        if (gi.defined() && (p->run || p->capture >= 0)) accumulate(slot(*p, edge.output), gi, false);
        continue;
      }
      TensorImpl* leaf = edge.leaf.get();
      if (!leaf) continue;
      if (gi.defined()) {
        if (leaf->hooks && !leaf->hooks->grad.empty()) gi = run_hooks(leaf->hooks->grad, std::move(gi), "a leaf");
        if (inputs_)
          capture(leaf->capture, gi);
        else
          accumulate(leaf->grad, gi, true);
      }
      if (--leaf->pending == 0 && !inputs_ && leaf->hooks && !leaf->hooks->post_accumulate.empty()) {
        Tensor handle(edge.leaf);
        for (auto& [active, fn] : leaf->hooks->post_accumulate)
          if (*active) fn(handle);
      }
    }
  }

  void finish_inputs() {
    for (size_t k = 0; k < inputs_->size(); ++k) {
      TensorImpl* x = (*inputs_)[k].impl();
      x->capture = -1;
      if (Node* n = x->grad_fn.get(); n && n->pass == id_) n->capture = -1;
      if (!results_[k].defined() && !options_.allow_unused)
        throw AutogradError(fmt::format(
            "{}: input {} (shape {}) is not reached from the outputs; pass allow_unused=true to get an undefined "
            "gradient for it",
            api_, k, x->shape));
    }
    for (Node* n : order_) n->capture = -1;
  }

  const std::vector<Tensor>& roots_;
  const std::vector<Tensor>* inputs_;
  const GradOptions& options_;
  const char* api_;
  const bool cut_;
  const bool retain_;
  const uint64_t id_;
  PassLevel level_;
  std::vector<Node*>& order_;
  std::vector<Tensor> results_;
};

}  // namespace

uint64_t detail::plain_pass() { return t_plain_pass; }

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
