#pragma once
/// \file
/// The autograd graph.
///
/// Recording. Every op whose inputs require grad (in grad mode) records one
/// Node: its OpDef, one Edge per tensor input (to the node that produced that
/// input, or to a leaf), and what its backward needs. The output tensor holds
/// its node (TensorImpl::grad_fn) and every node holds the nodes of its
/// inputs, so a graph is owned by the tensors that depend on it: it lives as
/// long as one of them does and is freed, iteratively (a 10,000-step unroll
/// does not recurse), when the last one goes away. Nodes are recycled through
/// a per-thread free list, so a steady-state step records without allocating.
///
/// Differentiating. backward() and grad() collect the nodes reachable from
/// their roots, order them by creation (a node is recorded after the nodes of
/// its inputs, so that is a topological order) and run their backward
/// functions newest first, in a plain loop. Nothing else recorded on the
/// thread is touched. Without retain_graph a node drops what it saved right
/// after its backward, so activations are freed as the pass goes; running a
/// backward through it again is an AutogradError that names the op.
///
/// Higher order. With create_graph the backward functions run in grad mode:
/// the gradients are recorded like any forward and can be differentiated
/// again, to any order. A saved output is stored without its node (no cycle)
/// and reattached to it when backward reads it in that mode.
///
/// Side outputs. A fused op may save an intermediate its recorded backward
/// reads (the LSTM's gate activations) as a side output of its node: read in
/// grad mode it is attached to the node like the output, and the gradient a
/// later pass sends to it comes back to the node's own backward
/// (Node::side_grad), which adds it where the intermediate was computed. A
/// second-order pass then runs the fused backward once, instead of once for
/// the output and again for a recomputation of the intermediate.
#include <atomic>
#include <cstdint>
#include <cstddef>
#include <functional>
#include <new>
#include <type_traits>
#include <typeinfo>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "saved.h"
#include "tensor.h"

namespace tg {

struct OpDef;
struct Node;
class SavedList;

namespace detail {
/// The gradient that reached side output k (1-based) of n in the backward
/// running now (see SideGradsScope), or an undefined tensor.
const Tensor& side_grad(const Node& n, uint32_t k);
}  // namespace detail

/// Where the gradient of one input goes.
struct Edge {
  NodeRef node;                       ///< the input's producer, or null
  uint32_t output = 0;                ///< which output of node: 0, or a side output
  std::shared_ptr<TensorImpl> leaf;   ///< a leaf requiring grad: its .grad (or grad()'s result)
  Shape shape;                        ///< the input's shape (backward must return exactly this)
  DType dtype = DType::f32;           ///< the input's dtype
  bool needs_grad = false;            ///< false: backward skips this input entirely
};

/// One slot of what a node saved for its backward (Node::save), read back
/// with Node::saved_tensor.
struct SavedTensor {
  mutable Tensor tensor;   ///< the tensor; empty while saved by reference and not rebuilt
  uint64_t version = 0;    ///< storage version when saved
  NodeRef producer;        ///< saved by reference: producer->op->recompute rebuilds it
  /// -1: an input or a stat; 0: the saving node's own output, k > 0: its
  /// side output k; both held without grad_fn. For a rounded slot: the
  /// input's output number at its producer.
  int32_t output = -1;
  /// An AutocastInput kept as its bfloat16 copy (tensor), read as float32 in grad mode.
  bool rounded = false;
  /// For a rounded slot: the input's producer (null for a constant or a
  /// tensor that does not require grad), to which the float32 values read in
  /// grad mode are attached.
  NodeRef source;
};

/// One recorded op: what its backward needs (record() returns it to the
/// op's forward) and the edges to its inputs' producers.
struct Node {
  const OpDef* op = nullptr;          ///< the op recorded
  std::vector<Edge> edges;            ///< one per tensor input, in argument order
  std::vector<SavedTensor> saved;     ///< what backward reads (inputs, output, stats), see save()
  Shape out_shape;                    ///< the output's shape
  DType out_dtype = DType::f32;       ///< the output's dtype
  uint64_t out_version = 0;           ///< the output's storage version when recorded
  uint64_t seq = 0;                   ///< creation order: inputs' nodes have smaller seq
  bool released = false;              ///< saved tensors dropped by a backward without retain_graph
  /// Ops that save the output keep a reference to this node instead of the
  /// tensor, and read it rebuilt by op->recompute (see save). record() sets it
  /// for an op that has one; checkpoint() clears it unless asked.
  bool output_by_reference = false;
  DType autocast = DType::f32;        ///< the GEMM precision it was recorded under; its backward runs under it
  std::vector<HookEntry> hooks;       ///< registered on the output tensor (Tensor::register_hook)
  std::weak_ptr<TensorImpl> retains;  ///< the output, when it retain_grad()s
  uint32_t side_outputs = 0;          ///< SideOutput fields saved (see save): outputs 1..side_outputs
  std::string module_path;            ///< under anomaly detection: the module path it was recorded in
  /// State of an op that a small trivially copyable struct (attrs) cannot
  /// hold: checkpoint's function to rerun and its random state.
  std::shared_ptr<const void> closure;

  /// Whether backward must compute the gradient of input `input`.
  bool needs(size_t input) const { return edges[input].needs_grad; }

  /// The op's non-tensor state (axes, scalars, flags, shapes) as a struct of
  /// its own, stored in the node without allocating: forward writes
  /// `n->attrs<SoftmaxAttrs>() = {.axis = a}`, backward reads
  /// `n.attrs<SoftmaxAttrs>().axis`. T must be trivially copyable and fit in
  /// kAttrBytes; reading it as another type than was written is an AutogradError.
  static constexpr size_t kAttrBytes = 160;
  /// Forward: the attributes as T, value-initialised the first time.
  template <class T> T& attrs() {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kAttrBytes && alignof(T) <= 8,
                  "op attributes: a small trivially copyable struct");
    if (attrs_type_ != &typeid(T)) {
      attrs_type_ = &typeid(T);
      new (attrs_) T();
    }
    return *std::launder(reinterpret_cast<T*>(attrs_));
  }
  /// Backward: the attributes written as T; AutogradError if written as another type.
  template <class T> const T& attrs() const {
    if (!attrs_type_ || *attrs_type_ != typeid(T)) bad_attrs(typeid(T).name());
    return *std::launder(reinterpret_cast<const T*>(attrs_));
  }
  /// Saves what the op's backward reads, one slot per field of s: S is the
  /// struct its OpDef declares (OpDef::saves is saves_of<S>()), and a node
  /// saves once. Each tensor's version is remembered. A tensor that is the
  /// output of an earlier node with output_by_reference (its op has a
  /// recompute function) is kept as a reference to that node only, so its memory is freed with the last
  /// handle to it and backward rebuilds it from what that node saved. A
  /// SideOutput field (an intermediate the forward computed, not requiring
  /// grad) becomes the node's next side output: in grad mode it is read
  /// attached to this node, and what flows back into it arrives as
  /// side_grad(&S::field), which the op's backward must add to its gradients.
  /// A list field is saved one tensor at a time.
  template <SavedStruct S>
  void save(const S& s) {
    begin_save(typeid(S));
    std::apply([&](const auto&... f) { (save_field(s.*f.member), ...); }, S::fields);
  }
  /// Backward: the tensor saved in field `field` of the op's saved struct S
  /// (rebuilt if saved by reference; with grad mode on, attached to its node
  /// so that a recorded backward differentiates through it). AutogradError if
  /// it was modified in place since it was saved, or if S is not what the op saved.
  template <class S>
  Tensor saved_tensor(Tensor S::*field) const {
    return read_slot(saved_slot(typeid(S), detail::saved_index(field)));
  }
  /// Backward: the side output saved in field `field`, read as saved_tensor's.
  template <class S>
  Tensor saved_tensor(SideOutput S::*field) const {
    return read_slot(saved_slot(typeid(S), detail::saved_index(field)));
  }
  /// Backward: the input saved in AutocastInput field `field`: its bfloat16 copy
  /// where the node kept one (see AutocastInput), read as saved_tensor's.
  template <class S>
  Tensor saved_tensor(AutocastInput S::*field) const {
    return read_slot(saved_slot(typeid(S), detail::saved_index(field)));
  }
  /// Backward: the tensors of list field `field`, each read like saved_tensor's.
  template <class S>
  SavedList saved_list(std::vector<Tensor> S::*field) const;
  /// Backward: the gradient that reached side output `field` in this pass, or
  /// an undefined tensor when none did.
  template <class S>
  const Tensor& side_grad(SideOutput S::*field) const {
    saved_slot(typeid(S), detail::saved_index(field));
    return detail::side_grad(*this, side_output(field));
  }
  /// Drops the tensors rebuilt for this node's backward (they can be rebuilt again).
  void drop_recomputed();

  std::atomic<int32_t> refs{0};  ///< NodeRefs to this node (tensors, edges, saved references)

 private:
  friend void reset_attrs(Node& n) { n.attrs_type_ = nullptr; }
  friend class SavedList;
  // save(S): checks that S is what the op declares and nothing was saved yet.
  void begin_save(const std::type_info& type);
  void save_field(const Tensor& t) { save_slot(t); }
  void save_field(const SideOutput& t) { save_side_slot(t); }
  void save_field(const AutocastInput& t) { save_autocast_slot(t); }
  void save_field(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) save_slot(t);
  }
  // One slot: t, or a reference to its producer (see save).
  void save_slot(const Tensor& t);
  // One slot holding t as the node's next side output.
  void save_side_slot(const Tensor& t);
  // One slot holding t's bfloat16 copy where AutocastInput says, else t.
  void save_autocast_slot(const AutocastInput& t);
  // Slot k, read as saved_tensor says.
  Tensor read_slot(size_t k) const;
  // The slot of field `index` of the saved struct `type`: AutogradError if the
  // op saves another struct or its forward saved nothing.
  size_t saved_slot(const std::type_info& type, size_t index) const;
  [[noreturn]] void bad_attrs(const char* asked) const;
  alignas(8) std::byte attrs_[kAttrBytes];
  const std::type_info* attrs_type_ = nullptr;
};

/// A list field of what a node saved (Node::saved_list): each tensor read
/// when asked for, like Node::saved_tensor.
class SavedList {
 public:
  size_t size() const { return size_; }  ///< the tensors in the list
  /// Tensor i of the list.
  Tensor operator[](size_t i) const { return node_->read_slot(first_ + i); }

 private:
  friend struct Node;
  SavedList(const Node& node, size_t first) : node_(&node), first_(first), size_(node.saved.size() - first) {}
  const Node* node_;
  size_t first_, size_;
};

template <class S>
SavedList Node::saved_list(std::vector<Tensor> S::*field) const {
  return SavedList(*this, saved_slot(typeid(S), detail::saved_index(field)));
}

/// Options of backward() and grad(). retain_graph defaults to create_graph,
/// as in PyTorch: a graph that was differentiated with create_graph is usually
/// differentiated again.
struct GradOptions {
  std::optional<bool> retain_graph = std::nullopt;  ///< keep what the graph saved for another backward
  bool create_graph = false;  ///< record the backward, so that the gradients can be differentiated
  bool allow_unused = false;  ///< grad(): an input the outputs do not reach gets an undefined gradient
};

/// Gradients of the outputs with respect to the inputs (tensors requiring
/// grad: leaves or not), weighted by grad_outputs (one per output, of its
/// shape; may be omitted for scalar outputs). Touches no .grad. An input the
/// outputs do not reach is an error unless allow_unused.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, const GradOptions& options = {});
/// Accumulates the gradients of the outputs into every leaf's .grad (what
/// Tensor::backward does for one output).
void backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& grad_outputs = {},
              const GradOptions& options = {});

/// Graphviz DOT of the live graph that the roots depend on: op names, output
/// shapes and dtypes, leaves, and which nodes were already freed by a backward.
std::string to_dot(const std::vector<Tensor>& roots);

/// Nodes alive in the process (recorded and not yet freed): for tests and leak hunting.
int64_t live_nodes();

/// Gradient mode (per thread). Ops record only while it is enabled; backward
/// functions run with it set to create_graph.
bool grad_enabled();
/// Turns recording off on this thread for its lifetime (torch.no_grad):
/// inference, optimizer updates, a fused forward that records itself once.
class NoGradGuard {
 public:
  NoGradGuard();   ///< disables grad mode
  ~NoGradGuard();  ///< restores the mode it found
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
/// Re-enables recording inside a no-grad region (for gradcheck and the like).
class EnableGradGuard {
 public:
  EnableGradGuard();   ///< enables grad mode
  ~EnableGradGuard();  ///< restores the mode it found
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

namespace detail {
/// While alive on this thread, record() records nothing: it adds each tensor
/// requiring grad that an op reads to `reads` (once) instead. checkpoint()'s
/// forward runs under it, to find what its function depends on.
class RecordingSuspended {
 public:
  explicit RecordingSuspended(std::vector<Tensor>& reads);  ///< suspends, collecting into reads
  ~RecordingSuspended();  ///< resumes what was there before (an enclosing suspension)
  RecordingSuspended(const RecordingSuspended&) = delete;
  RecordingSuspended& operator=(const RecordingSuspended&) = delete;

 private:
  std::vector<Tensor>* outer_;
};

/// While alive on this thread, the tangents-only pass of forward over reverse
/// (grad_and_tangents) records ops as an open forward-AD level does, linked
/// into a graph: for a backward that runs a pass of its own over ops it runs
/// (checkpoint's rerun), whose tangents then come through that graph.
class TangentsOnlySuspended {
 public:
  TangentsOnlySuspended();
  ~TangentsOnlySuspended();
  /// The gradients of outputs over the region its inputs bound (ops recorded
  /// under this suspension on those inputs; no edge out of an input is
  /// followed: partial, not total, derivatives). When it suspended the
  /// tangents-only pass, the gradients flowing in (grad_outputs) come from
  /// that pass: they carry tangents but no graph, so each enters as a dual
  /// tensor; and the gradients come back as that pass's own do, with their
  /// tangents and without the graph they were computed through.
  std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                           const std::vector<Tensor>& grad_outputs, const GradOptions& options) const;
  TangentsOnlySuspended(const TangentsOnlySuspended&) = delete;
  TangentsOnlySuspended& operator=(const TangentsOnlySuspended&) = delete;

 private:
  bool prev_;
};

/// Drops the tangents forward mode keeps for n (its backward released what it saved).
void forget_tangents(const Node& n);

/// Whether t carries a tangent at the open forward-AD level (a dual tensor,
/// or the output of an op recorded with one): an in-place write to it would
/// leave the tangent behind, so Tensor's in-place methods refuse it.
bool carries_tangent(const TensorImpl& t);

/// The id of the backward pass running on this thread (the innermost) when
/// it is plain (not create_graph), or 0.
uint64_t plain_pass();
/// Whether that pass will run n's backward (it reached n, and n leads to
/// what it differentiates).
bool plain_pass_runs(const Node& n);

/// While alive on this thread, n's backward reads `grads` as the gradients
/// that reached its side outputs (Node::side_grad): the pass running the
/// backward holds them, or the engine deriving a tangent from it.
class SideGradsScope {
 public:
  SideGradsScope(const Node& n, std::span<const Tensor> grads);
  ~SideGradsScope();
  SideGradsScope(const SideGradsScope&) = delete;
  SideGradsScope& operator=(const SideGradsScope&) = delete;

 private:
  friend const Tensor& side_grad(const Node& n, uint32_t k);
  const Node* node_;
  std::span<const Tensor> grads_;
  const SideGradsScope* outer_;
};

/// True while a backward runs in the pass of grad_and_tangents() on a
/// forward-AD level whose tangents are not differentiated again (hvp). The
/// engine (run_backward) then calls an op's OpSpec::backward_with_tangents,
/// gradients and their tangents by fused kernels, instead of its recorded
/// form, whose ops the pass would follow one by one.
bool fused_backward_tangents();
/// Gives t (a tensor no op has recorded) its tangent at the open forward-AD
/// level: how run_backward attaches what backward_with_tangents computed.
void set_tangent(const Tensor& t, Tensor tangent);
}  // namespace detail

/// Whether record() would record an op on these inputs now (grad mode on and
/// one of them requiring grad): for a forward that computes an intermediate
/// only for its backward, before computing it.
template <class... Ts>
bool may_record(const Ts&... inputs) {
  return grad_enabled() && (... || (inputs.defined() && inputs.requires_grad()));
}

/// Called by an op's forward after computing `out`. Returns the new node when
/// grad mode is on and some input requires grad (the op then saves what its
/// backward needs into it), or nullptr when nothing is to be recorded.
Node* record(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out);
/// record() with the inputs as arguments: `record(op, out, a, b)`.
template <class... Ts>
Node* record(const OpDef& op, Tensor& out, const Ts&... inputs) {
  const Tensor* ptrs[] = {&inputs...};
  return record(op, std::span<const Tensor* const>(ptrs, sizeof...(Ts)), out);
}

}  // namespace tg
