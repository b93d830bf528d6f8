// The recording side of the tape: the nodes (memory, references), what a
// node saves, record() and forward mode (levels, dual tensors, tangent rules
// run one op behind the forward). The backward pass is in backward.cpp,
// to_dot in to_dot.cpp.
#include "autograd/tape.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "autograd/forward_ad.h"
#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"
#include "autograd/tape_internal.h"

namespace tg {
namespace {

thread_local bool t_grad_enabled = true;
thread_local uint64_t t_fw_level = 0;  // the open forward-AD level; 0: none
thread_local bool t_fw_record = true;  // the open level records its tangent rules (differentiable tangents)
// What forward mode keeps of a node recorded at the open level with a tangent
// flowing in: its inputs' tangents (one per edge, undefined for zero), then,
// once its rule ran unrecorded, its outputs' (output, then side outputs). A
// rule runs when its output's tangent is first read (by the next op that takes
// the output, or by tangent()), once the forward that recorded the node has
// saved what the rule reads.
struct NodeTangents {
  std::vector<Tensor> in, out;
};
// The open level's, by node (null while no level is open): a node's entry
// goes when the node is freed or its backward releases what it saved, and all
// of them when the level closes.
thread_local std::unordered_map<const Node*, NodeTangents>* t_fw_nodes = nullptr;
NodeTangents* tangents_of(const Node* n) {
  if (!t_fw_level || !t_fw_nodes || !n) return nullptr;
  auto it = t_fw_nodes->find(n);
  return it == t_fw_nodes->end() ? nullptr : &it->second;
}
std::atomic<uint64_t> g_next_fw_level{1};
// Leaves given a tangent in place by make_dual (parameters): cleared when the level closes.
thread_local std::vector<std::shared_ptr<TensorImpl>> t_dual_leaves;
// grad_and_tangents(): the backward's ops compute tangents without being
// recorded. Each op's node lives until the next op (or a tangent read) runs
// its rule and gives the output its tangent, then goes.
thread_local bool t_tangents_only = false;
thread_local NodeRef t_pending;
thread_local std::weak_ptr<TensorImpl> t_pending_out;
thread_local std::vector<Tensor>* t_suspended_reads = nullptr;  // see detail::RecordingSuspended
std::atomic<uint64_t> g_next_seq{1};
std::atomic<int64_t> g_live_nodes{0};

// ---------------------------------------------------------------- node memory
// Freed nodes keep their vectors' capacity on a per-thread free list, so a
// steady-state step records without allocating. Freeing is a worklist, not
// recursion: dropping a node's edges may free its inputs' nodes, which are
// queued here instead of being freed inside the destructor that dropped them.
struct NodePool {
  std::vector<Node*> free;
  std::vector<Node*> dying;
  bool draining = false;
  ~NodePool();
};
thread_local bool t_pool_gone = false;  // trivially destructible: valid after ~NodePool
thread_local NodePool t_pool;
constexpr size_t kMaxFreeNodes = 1 << 14;

NodePool::~NodePool() {
  for (Node* n : free) delete n;
  free.clear();
  t_pool_gone = true;
}

void reset(Node& n) {
  reset_attrs(n);
  n.edges.clear();  // may queue the inputs' nodes
  n.saved.clear();
  n.hooks.clear();
  n.retains.reset();
  n.side_outputs = 0;
  n.module_path.clear();
  n.closure.reset();
  n.released = false;
  if (t_fw_nodes) t_fw_nodes->erase(&n);
}

void free_node(Node* n) {
  if (t_pool_gone) {  // thread teardown only: plain (recursive) delete
    g_live_nodes.fetch_sub(1, std::memory_order_relaxed);
    delete n;
    return;
  }
  NodePool& pool = t_pool;
  pool.dying.push_back(n);
  if (pool.draining) return;
  pool.draining = true;
  while (!pool.dying.empty()) {
    Node* d = pool.dying.back();
    pool.dying.pop_back();
    reset(*d);  // releases d's references; freed ones land on pool.dying
    g_live_nodes.fetch_sub(1, std::memory_order_relaxed);
    if (pool.free.size() < kMaxFreeNodes)
      pool.free.push_back(d);
    else
      delete d;
  }
  pool.draining = false;
}

Node* new_node() {
  g_live_nodes.fetch_add(1, std::memory_order_relaxed);
  if (!t_pool_gone && !t_pool.free.empty()) {
    Node* n = t_pool.free.back();
    t_pool.free.pop_back();
    return n;
  }
  return new Node();
}

// A tensor sharing t's data that is output `output` of `node`: how a saved
// output (or a rebuilt one, or a side output) rejoins the graph when a
// backward is itself recorded.
Tensor attached(const Tensor& t, Node* node, uint32_t output) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->offset = t.offset();
  impl->dtype = t.dtype();
  impl->requires_grad = true;
  impl->grad_fn = NodeRef(node);
  impl->output_nr = output;
  return Tensor(std::move(impl));
}

}  // namespace

std::string detail::describe_node(const Node& n) {
  return fmt::format("'{}' (output {} {})", n.op->name, n.out_shape, dtype_name(n.out_dtype));
}
using detail::describe_node;

// ---------------------------------------------------------------- NodeRef
NodeRef::NodeRef(Node* n) : p_(n) {
  if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed);
}
NodeRef::NodeRef(const NodeRef& o) : p_(o.p_) {
  if (p_) p_->refs.fetch_add(1, std::memory_order_relaxed);
}
NodeRef::~NodeRef() {
  if (p_ && p_->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) free_node(p_);
}

// ---------------------------------------------------------------- saving
namespace {
// A slot holding t itself, at its present version.
SavedTensor held(const Tensor& t, int32_t output) {
  SavedTensor s;
  s.tensor = t;
  s.version = t.defined() ? t.version() : 0;
  s.output = output;
  return s;
}
}  // namespace

// Whether a node saving t now keeps a reference to t's producer, which
// rebuilds it for backward, rather than t itself.
static bool saved_by_reference(const Tensor& t) {
  // Only while t still holds what its producer wrote: after an in-place
  // write (even one not recorded, under no_grad) a rebuild would differ.
  // recompute rebuilds the output, not a side output.
  const Node* producer = t.defined() ? t.impl()->grad_fn.get() : nullptr;
  return producer && producer->output_by_reference && !producer->released && t.impl()->output_nr == 0 &&
         t.version() == producer->out_version;
}

void Node::save_slot(const Tensor& t) {
  if (t.defined() && t.impl()->grad_fn.get() == this) {
    // Our own output: held without grad_fn, or the node would own itself.
    saved.push_back(held(t.detach(), static_cast<int32_t>(t.impl()->output_nr)));
    return;
  }
  if (saved_by_reference(t)) {
    SavedTensor& s = saved.emplace_back();
    s.producer = t.impl()->grad_fn;
    return;
  }
  saved.push_back(held(t, -1));
}

void Node::save_autocast_slot(const AutocastInput& t) {
  // A leaf's gradient goes to the leaf itself, which a copy cannot stand
  // for; under an open forward-AD level the input's tangent, which a
  // backward over it reads, would be lost with the input. An input its
  // producer could rebuild (gelu's output, layer_norm's) is kept as the copy
  // all the same, as torch.autocast keeps it: rebuilding would cost the
  // producer's pass and a rounding pass again in every backward, to save
  // half the float32 input's size.
  const bool leaf = t.defined() && t.requires_grad() && !t.impl()->grad_fn;
  if (!t.rounded.defined() || leaf || t_fw_level != 0) return save_slot(t);
  SavedTensor& s = saved.emplace_back(held(t.rounded, static_cast<int32_t>(t.impl()->output_nr)));
  s.rounded = true;
  if (t.requires_grad()) s.source = t.impl()->grad_fn;
}

void Node::save_side_slot(const Tensor& t) {
  if (!t.defined() || t.requires_grad())
    throw AutogradError(fmt::format("'{}': a side output is an intermediate the forward computed, defined and "
                                    "not requiring grad",
                                    op->name));
  ++side_outputs;
  saved.push_back(held(t, static_cast<int32_t>(side_outputs)));
}

void Node::bad_attrs(const char* asked) const {
  throw AutogradError(fmt::format("backward of '{}': its attributes were {} but are read as {}", op->name,
                                  attrs_type_ ? attrs_type_->name() : "never written", asked));
}

void Node::drop_recomputed() {
  for (SavedTensor& s : saved)
    if (s.producer) s.tensor = Tensor();
}

Tensor Node::read_slot(size_t k) const {
  if (k >= saved.size())
    throw AutogradError(fmt::format("backward of '{}': saved tensor {} of {} asked for", op->name, k, saved.size()));
  const SavedTensor& s = saved[k];
  if (s.rounded) {
    if (!grad_enabled()) return s.tensor;
    NoGradGuard no_grad;  // the float32 values, exact, attached below
    const Tensor values = s.tensor.to(DType::f32);
    return s.source ? attached(values, s.source.get(), static_cast<uint32_t>(s.output)) : values;
  }
  if (s.producer) {
    Node* p = s.producer.get();
    if (!s.tensor.defined()) {
      if (p->released)
        throw AutogradError(fmt::format(
            "backward of '{}': the output of {} it saved by reference cannot be rebuilt: an earlier backward "
            "without retain_graph=true freed that node",
            op->name, describe_node(*p)));
      NoGradGuard no_grad;
      ProfileScope prof(p->op->name, ProfilePhase::recompute);
      s.tensor = p->op->recompute(*p);
    }
    return grad_enabled() ? attached(s.tensor, p, 0) : s.tensor;
  }
  if (s.tensor.defined() && s.tensor.version() != s.version)
    throw AutogradError(fmt::format(
        "backward of '{}': a tensor it saved (shape {}) was modified in place after it was saved "
        "(version {} now, {} when saved); clone it before writing to it",
        op->name, s.tensor.shape(), s.tensor.version(), s.version));
  if (s.output >= 0 && grad_enabled()) {
    // A side output kept in bfloat16 (the LSTM's gates under autocast) is read as its float32 values.
    if (s.tensor.dtype() == DType::bf16 && out_dtype != DType::bf16) {
      NoGradGuard no_grad;
      return attached(s.tensor.to(DType::f32), const_cast<Node*>(this), static_cast<uint32_t>(s.output));
    }
    return attached(s.tensor, const_cast<Node*>(this), static_cast<uint32_t>(s.output));
  }
  return s.tensor;
}

// ---------------------------------------------------------------- forward mode
static void tangent_by_backward(const Node& n, std::span<const Tensor> tangent_in, std::span<Tensor> tangent_out);
namespace {

// Forward mode is off while a tangent rule runs: its ops take primals and
// tangents, no tangent of theirs is wanted, and they record as usual.
class SuspendForwardAD {
 public:
  SuspendForwardAD() : level_(t_fw_level), tangents_only_(t_tangents_only) { t_fw_level = 0, t_tangents_only = false; }
  ~SuspendForwardAD() { t_fw_level = level_, t_tangents_only = tangents_only_; }
  SuspendForwardAD(const SuspendForwardAD&) = delete;
  SuspendForwardAD& operator=(const SuspendForwardAD&) = delete;

 private:
  uint64_t level_;
  bool tangents_only_;
};

// The shape of side output k of n (what it saved as that side output).
const Shape& side_output_shape(const Node& n, uint32_t k) {
  for (const SavedTensor& s : n.saved)
    if (s.output == static_cast<int32_t>(k)) return s.tensor.shape();
  throw AutogradError(fmt::format("'{}': side output {} was not saved", n.op->name, k));
}

// Whether n can hand its output out again after the output tensor is gone:
// read_slot() attaches a fresh tensor to n for its own saved output and for
// an output saved by reference (rebuilt by recompute). Such a tensor reads
// its tangent from the node; the output tensor itself keeps its own.
bool hands_out_output(const Node& n) {
  if (n.output_by_reference) return true;
  return std::any_of(n.saved.begin(), n.saved.end(), [](const SavedTensor& s) { return s.output == 0; });
}

// Runs n's tangent rule: the tangents of its output and side outputs. The
// node keeps them only when they are not recorded: a recorded tangent's graph
// reaches back to the node (through the saved tensors its rule read), and
// would own it in a cycle. The tensor that asked keeps it instead (see
// tangent_of), and the node its inputs' tangents, to run the rule again for a
// saved output read later. Not recorded, the node keeps them until its
// output tensor has taken its own (see give_output_tangent).
std::vector<Tensor> compute_tangents(Node& n) {
  // A raw-kernel backward gives a tangent only where it is not recorded.
  if (!n.op->tangent && n.op->once_differentiable && (t_fw_record || !n.op->self_adjoint))
    throw AutogradError(fmt::format("forward-mode AD reached {}, which has no tangent rule (OpDef::tangent) and a "
                                    "once-differentiable backward to derive one from{}",
                                    describe_node(n), n.op->self_adjoint ? " where tangents are recorded" : ""));
  if (n.released)
    throw AutogradError(fmt::format("forward-mode AD: cannot compute the tangent of {}: what it saved was freed by "
                                    "a backward without retain_graph=true",
                                    describe_node(n)));
  std::vector<Tensor> out(1 + n.side_outputs);
  NodeTangents& kept = t_fw_nodes->at(&n);
  {
    SuspendForwardAD off;
    // Recorded, a tangent can be differentiated in reverse; a level that needs
    // no such thing (hvp) keeps no graph of its tangents.
    std::optional<EnableGradGuard> with_grad;
    std::optional<NoGradGuard> no_grad;
    if (t_fw_record)
      with_grad.emplace();
    else
      no_grad.emplace();
    AutocastGuard precision(n.autocast);
    ProfileScope prof(n.op->name, ProfilePhase::tangent);
    TangentFn rule = n.op->tangent         ? n.op->tangent
                     : n.op->self_adjoint ? tangent_by_backward
                                          : tangent_from_backward;
    if (t_fw_record && n.op->recorded_tangent)
      rule = n.op->recorded_tangent;
    else if (t_fw_record && n.op->tangent_once_differentiable)
      rule = tangent_from_backward;
    rule(n, kept.in, out);
  }
  n.drop_recomputed();
  for (size_t k = 0; k < out.size(); ++k) {
    if (!out[k].defined()) continue;
    const Shape& want = k == 0 ? n.out_shape : side_output_shape(n, static_cast<uint32_t>(k));
    if (!(out[k].shape() == want) || out[k].dtype() != n.out_dtype)
      throw AutogradError(fmt::format("tangent rule of '{}' returned a tangent of shape {} {} for output {} of shape {} {}",
                                      n.op->name, out[k].shape(), dtype_name(out[k].dtype()), k, want,
                                      dtype_name(n.out_dtype)));
  }
  if (!t_fw_record) {
    kept.out = out;
    kept.in.clear();  // read once: the inputs' tangents need not outlive the rule
  }
  return out;
}

void flush_pending();

// The output tensor `out` of n takes its tangent. The node then keeps it only
// if it can hand the output out again (hands_out_output): otherwise nothing
// else can ask for it, and an activation's tangent goes with the activation
// instead of living as long as the graph.
void give_output_tangent(TensorImpl& out, Node& n, Tensor t) {
  out.tangent = std::move(t);
  out.tangent_level = t_fw_level;
  if (NodeTangents* kept = tangents_of(&n); kept && !kept->out.empty() && !hands_out_output(n))
    kept->out[0] = Tensor();
}

// The tangent of t at the open level (undefined: zero), kept in t.
Tensor tangent_of(TensorImpl& t) {
  if (!t_fw_level) return Tensor();
  if (t_pending) flush_pending();
  if (t.tangent_level == t_fw_level) return t.tangent;
  Node* n = t.grad_fn.get();
  NodeTangents* kept = tangents_of(n);
  if (!kept) return Tensor();
  Tensor tn = kept->out.empty() ? compute_tangents(*n)[t.output_nr] : kept->out[t.output_nr];
  if (t.output_nr == 0) {
    give_output_tangent(t, *n, std::move(tn));
  } else {
    t.tangent = std::move(tn);
    t.tangent_level = t_fw_level;
  }
  return t.tangent;
}

// record(), under a forward-AD level: the inputs' tangents, kept in n when one
// is not zero. Reading them runs the rules of the ops that made the inputs,
// whose forwards have returned: so tangents follow the forward one op behind.
void keep_tangents(Node& n, std::span<const Tensor* const> inputs) {
  std::vector<Tensor> tangents;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = *inputs[k];
    if (!in.defined() || !in.requires_grad()) continue;
    Tensor t = tangent_of(*in.impl());
    if (!t.defined()) continue;
    if (tangents.empty()) tangents.resize(inputs.size());
    tangents[k] = std::move(t);
  }
  if (!tangents.empty()) (*t_fw_nodes)[&n].in = std::move(tangents);
}

// Tangents only: runs the pending node's rule into its output's tangent (when
// the output is still held), then drops the node.
void flush_pending() {
  NodeRef n = std::move(t_pending);
  t_pending = NodeRef();
  std::shared_ptr<TensorImpl> out = t_pending_out.lock();
  t_pending_out.reset();
  if (!n || !out) return;
  give_output_tangent(*out, *n.get(), compute_tangents(*n.get())[0]);
}

// A fresh node for op's output out: what record() and the tangents-only
// pass both set before the edges.
Node* new_op_node(const OpDef& op, const Tensor& out) {
  Node* n = new_node();
  reset_attrs(*n);
  n->op = &op;
  n->out_shape = out.shape();
  n->out_dtype = out.dtype();
  n->out_version = out.version();
  n->seq = g_next_seq.fetch_add(1, std::memory_order_relaxed);
  n->autocast = autocast_dtype();
  n->output_by_reference = op.recompute != nullptr;
  return n;
}

// record() in tangents-only mode: a node, not linked into any graph, for the
// op to save what its tangent rule reads, when an input has a tangent.
Node* record_tangent(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out) {
  flush_pending();
  std::vector<Tensor> tangents(inputs.size());
  bool any = false;
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k]->defined()) any |= (tangents[k] = tangent_of(*inputs[k]->impl())).defined();
  if (!any || !is_floating(out.dtype())) return nullptr;
  NodeRef ref(new_op_node(op, out));  // owned from the start, as in record()
  Node* n = ref.get();
  for (size_t k = 0; k < inputs.size(); ++k) {
    Edge& e = n->edges.emplace_back();
    if (!inputs[k]->defined()) continue;
    e.shape = inputs[k]->shape();
    e.dtype = inputs[k]->dtype();
    e.needs_grad = tangents[k].defined();
  }
  (*t_fw_nodes)[n].in = std::move(tangents);
  t_pending = std::move(ref);
  t_pending_out = out.impl_ptr();
  return n;
}

// Whether out is a view of one of the inputs. Anomaly detection checks only
// values an op computed: a view shows values checked where they were made, or
// none yet (concat and stack fill their output through views of it).
bool aliases_an_input(std::span<const Tensor* const> inputs, const Tensor& out) {
  return std::any_of(inputs.begin(), inputs.end(),
                     [&](const Tensor* in) { return in->defined() && in->storage() == out.storage(); });
}

}  // namespace

ForwardADGuard::ForwardADGuard(bool differentiable_tangents) {
  if (t_fw_level)
    throw AutogradError("ForwardADGuard: a forward-AD level is already open on this thread (one level at a time)");
  t_fw_level = g_next_fw_level.fetch_add(1, std::memory_order_relaxed);
  t_fw_record = differentiable_tangents;
  t_fw_nodes = new std::unordered_map<const Node*, NodeTangents>();
}
ForwardADGuard::~ForwardADGuard() {
  for (const auto& leaf : t_dual_leaves) {
    leaf->tangent = Tensor();
    leaf->tangent_level = 0;
  }
  t_dual_leaves.clear();
  t_fw_level = 0;
  t_fw_record = true;
  // Detached first: the tangents dropped with it may free nodes, which then find no level.
  delete std::exchange(t_fw_nodes, nullptr);
}

void detail::forget_tangents(const Node& n) {
  if (t_fw_nodes) t_fw_nodes->erase(&n);
}

bool forward_ad_enabled() { return t_fw_level != 0; }

bool detail::carries_tangent(const TensorImpl& t) {
  return t_fw_level != 0 && (t.tangent_level == t_fw_level || tangents_of(t.grad_fn.get()) != nullptr);
}

Tensor make_dual(const Tensor& primal, const Tensor& tangent) {
  if (!t_fw_level) throw AutogradError("make_dual: no forward-AD level is open (make a ForwardADGuard)");
  if (!primal.defined() || !tangent.defined()) throw ValueError("make_dual: primal and tangent must be defined");
  if (!is_floating(primal.dtype()))
    throw DTypeError(fmt::format("make_dual: primal {} is {}, not floating", primal.shape(), dtype_name(primal.dtype())));
  if (!(primal.shape() == tangent.shape()))
    throw ShapeError(fmt::format("make_dual: tangent of shape {} for a primal of shape {}", tangent.shape(),
                                 primal.shape()));
  if (primal.dtype() != tangent.dtype())
    throw DTypeError(fmt::format("make_dual: tangent is {} for a primal of {}", dtype_name(tangent.dtype()),
                                 dtype_name(primal.dtype())));
  Tensor dual;
  if (primal.requires_grad() && primal.is_leaf()) {
    // A parameter carries the tangent itself: a module that holds it sees it.
    dual = primal;
    t_dual_leaves.push_back(primal.impl_ptr());
  } else if (primal.requires_grad()) {
    EnableGradGuard with_grad;
    dual = view(primal, primal.shape());
  } else {
    dual = make_view(primal, primal.shape(), primal.strides(), primal.offset());
    dual.requires_grad_();
  }
  dual.impl()->tangent = tangent;
  dual.impl()->tangent_level = t_fw_level;
  return dual;
}

Tensor tangent(const Tensor& t) {
  if (!t.defined()) throw ValueError("tangent: tensor is undefined");
  return tangent_of(*t.impl());
}

Dual unpack_dual(const Tensor& t) { return {t, tangent(t)}; }

detail::TangentsOnlySuspended::TangentsOnlySuspended() : prev_(t_tangents_only) { t_tangents_only = false; }
detail::TangentsOnlySuspended::~TangentsOnlySuspended() { t_tangents_only = prev_; }
std::vector<Tensor> detail::TangentsOnlySuspended::grad(const std::vector<Tensor>& outputs,
                                                        const std::vector<Tensor>& inputs,
                                                        const std::vector<Tensor>& grad_outputs,
                                                        const GradOptions& options) const {
  if (!prev_) return region_grad(outputs, inputs, grad_outputs, options);
  std::vector<Tensor> seeds;
  for (const Tensor& g : grad_outputs) {
    const Tensor t = g.defined() ? tangent(g) : Tensor();
    seeds.push_back(t.defined() ? make_dual(g.detach(), t) : g);
  }
  std::vector<Tensor> grads = region_grad(outputs, inputs, seeds, options);
  for (Tensor& gi : grads) {
    if (!gi.defined()) continue;
    Tensor value = gi.detach();
    set_tangent(value, tangent(gi));
    gi = std::move(value);
  }
  return grads;
}
detail::TangentsOnly::TangentsOnly() { t_tangents_only = true; }
detail::TangentsOnly::~TangentsOnly() {
  t_tangents_only = false;
  t_pending = NodeRef();
  t_pending_out.reset();
}
bool detail::fused_backward_tangents() { return t_tangents_only && t_fw_level && !t_fw_record && t_grad_enabled; }
void detail::set_tangent(const Tensor& t, Tensor tangent) {
  t.impl()->tangent = std::move(tangent);
  t.impl()->tangent_level = t_fw_level;
}

// J t = J^T t for an op whose Jacobian is symmetric (OpSpec::self_adjoint):
// its backward, in the form the pass's grad mode picks, run on the tangent.
static void tangent_by_backward(const Node& n, std::span<const Tensor> tangent_in, std::span<Tensor> tangent_out) {
  if (tangent_in[0].defined()) run_backward(n, tangent_in[0], tangent_out);
}

void tangent_from_backward(const Node& n, std::span<const Tensor> tangent_in, std::span<Tensor> tangent_out) {
  EnableGradGuard with_grad;  // the backward in ops, differentiated in u (detached below unless recorded)
  // u: cotangents of the output and of each side output, which the backward reads as their gradients
  std::vector<Tensor> u{zeros(n.out_shape, n.out_dtype).requires_grad_()};
  for (uint32_t k = 1; k <= n.side_outputs; ++k) u.push_back(zeros(side_output_shape(n, k), n.out_dtype).requires_grad_());
  std::vector<Tensor> vjp(n.edges.size());
  {
    detail::SideGradsScope side(n, std::span<const Tensor>(u).subspan(1));
    run_backward(n, u[0], vjp);
  }
  Tensor inner;  // <J^T u, v>
  for (size_t k = 0; k < vjp.size(); ++k) {
    if (k >= tangent_in.size() || !tangent_in[k].defined() || !vjp[k].defined()) continue;
    Tensor term = sum(mul(vjp[k], tangent_in[k]));
    inner = inner.defined() ? add(inner, term) : term;
  }
  if (!inner.defined() || !inner.requires_grad()) return;  // no tangent reaches an output
  std::vector<Tensor> jv = grad({inner}, u, {}, {.create_graph = t_fw_record, .allow_unused = true});
  for (size_t k = 0; k < jv.size(); ++k) tangent_out[k] = std::move(jv[k]);
}

// ---------------------------------------------------------------- recording
Node* record(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out) {
  if (anomaly_enabled() && !aliases_an_input(inputs, out)) [[unlikely]]
    detail::check_forward(op, inputs, out);
  if (!t_grad_enabled) return nullptr;
  if (t_tangents_only) return record_tangent(op, inputs, out);
  bool any = false;
  for (const Tensor* in : inputs) any |= in->defined() && in->requires_grad();
  if (!any) return nullptr;
  if (t_suspended_reads) [[unlikely]] {
    for (const Tensor* in : inputs) {
      if (!in->defined() || !in->requires_grad()) continue;
      auto same = [&](const Tensor& r) { return r.impl() == in->impl(); };
      if (std::none_of(t_suspended_reads->begin(), t_suspended_reads->end(), same))
        t_suspended_reads->push_back(*in);
    }
    return nullptr;
  }
  if (!is_floating(out.dtype()))
    throw AutogradError(fmt::format("{}: an integer output cannot require grad", op.name));
  // Owned from the start: reading the inputs' tangents and keeping autocast's
  // copies allocate, and a failure there must free the node and its edges.
  NodeRef ref(new_op_node(op, out));
  Node* n = ref.get();
  if (anomaly_enabled()) [[unlikely]]
    n->module_path = module_path();
  for (const Tensor* in : inputs) {
    Edge& e = n->edges.emplace_back();
    if (!in->defined()) continue;
    e.shape = in->shape();
    e.dtype = in->dtype();
    TensorImpl* impl = in->impl();
    if (!impl->requires_grad) continue;
    e.needs_grad = true;
    if (impl->grad_fn) {
      e.node = impl->grad_fn;
      e.output = impl->output_nr;
    } else {
      e.leaf = in->impl_ptr();
      // A parameter: autocast's GEMMs keep its bfloat16 copy until it changes.
      if (n->autocast == DType::bf16) detail::autocast_keep(*in);
    }
  }
  if (t_fw_level) keep_tangents(*n, inputs);
  TensorImpl* o = out.impl();
  o->requires_grad = true;
  o->grad_fn = std::move(ref);
  o->output_nr = 0;
  return n;
}

detail::RecordingSuspended::RecordingSuspended(std::vector<Tensor>& reads) : outer_(t_suspended_reads) {
  t_suspended_reads = &reads;
}
detail::RecordingSuspended::~RecordingSuspended() { t_suspended_reads = outer_; }
int64_t live_nodes() { return g_live_nodes.load(std::memory_order_relaxed); }

bool grad_enabled() { return t_grad_enabled; }
NoGradGuard::NoGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = false; }
NoGradGuard::~NoGradGuard() { t_grad_enabled = prev_; }
EnableGradGuard::EnableGradGuard() : prev_(t_grad_enabled) { t_grad_enabled = true; }
EnableGradGuard::~EnableGradGuard() { t_grad_enabled = prev_; }

}  // namespace tg
