#pragma once
// The tape: every op whose inputs require grad appends one Node, in execution
// order, so the tape is already topologically sorted. backward() walks it in
// reverse with a plain loop (no recursion: a 10,000-step unroll is fine).
//
// Nodes are reused between steps: clearing the tape resets the nodes but keeps
// their vectors' capacity, so a steady-state training step records without
// allocating node memory.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "autograd/tensor.h"

namespace tg {

struct OpDef;

// Where the gradient of one input goes.
struct Edge {
  int32_t node = -1;                  // producer node on the tape, or -1
  std::shared_ptr<TensorImpl> leaf;   // a leaf requiring grad: accumulate into leaf->grad
  Shape shape;                        // the input's shape (backward must return exactly this)
  DType dtype = DType::f32;
  bool needs_grad = false;            // false: backward skips this input entirely
  bool freed = false;                 // input came from a tape that was already cleared
};

struct SavedTensor {
  // The tensor, or, for the output of a node whose op can recompute it
  // (producer >= 0), empty until backward asks for it and rebuilds it.
  mutable Tensor tensor;
  uint64_t version = 0;   // storage version when saved
  int32_t producer = -1;  // the node that recomputes it, on the same tape
};

struct Node {
  const OpDef* op = nullptr;
  std::vector<Edge> edges;            // one per tensor input, in argument order
  std::vector<SavedTensor> saved;     // what backward reads (inputs, output, stats)
  // Non-tensor attributes of the call (axes, scalars, flags), op-specific.
  double f[4] = {};
  int64_t i[4] = {};
  Shape shape_attr;                   // e.g. the axes of a reduction, a permutation
  Shape out_shape;
  DType out_dtype = DType::f32;
  uint64_t out_version = 0;           // the output's storage version when recorded
  Tensor grad;                        // gradient flowing into this node's output

  bool needs(size_t input) const { return edges[input].needs_grad; }
  // Saves t for backward, remembering its version. When t is the output of
  // an earlier node of this tape whose op has a recompute function, only a
  // reference to that node is kept, and t's memory is freed with the last
  // handle to it: backward rebuilds t from what that node saved.
  void save(const Tensor& t);
  // The k-th saved tensor (rebuilt if saved by reference); AutogradError if
  // it was modified in place since it was saved.
  const Tensor& saved_tensor(size_t k) const;
  // Drops the tensors rebuilt for this node's backward (they can be rebuilt again).
  void drop_recomputed();
};

class Tape {
 public:
  // Appends a node for `op` with the given inputs and links `out` to it.
  Node& push(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out);
  size_t size() const { return size_; }
  Node& node(size_t k) { return nodes_[k]; }
  uint64_t epoch() const { return epoch_; }
  // Drops every node and what it saved. Tensors recorded before become
  // "freed": backward through them is an AutogradError.
  void clear();
  // Reverse pass from `root` with output gradient `grad` (same shape as root).
  void backward(const Tensor& root, const Tensor& grad, bool retain_graph);
  // Graphviz DOT of the recorded nodes (op names, shapes, dtypes).
  std::string to_dot() const;

 private:
  std::vector<Node> nodes_;
  size_t size_ = 0;
  uint64_t epoch_ = 1;
};

// The tape of the calling thread.
Tape& tape();
std::string to_dot();  // DOT of the current thread's tape

// Gradient mode (per thread). Ops record only while it is enabled.
bool grad_enabled();
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};
// Re-enables recording inside a no-grad region (for gradcheck and the like).
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool prev_;
};

// Called by an op's forward after computing `out`. Returns the new node when
// grad mode is on and some input requires grad (the op then saves what its
// backward needs into it), or nullptr when nothing is to be recorded.
Node* record(const OpDef& op, std::span<const Tensor* const> inputs, Tensor& out);
template <class... Ts>
Node* record(const OpDef& op, Tensor& out, const Ts&... inputs) {
  const Tensor* ptrs[] = {&inputs...};
  return record(op, std::span<const Tensor* const>(ptrs, sizeof...(Ts)), out);
}

}  // namespace tg
