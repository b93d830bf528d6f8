#pragma once
/// \file
/// Tensor: a reference-counted handle to (storage, shape, strides, offset,
/// dtype) plus autograd state. Copies share the data, like torch::Tensor.
/// Views (reshape, transpose, slice, expand, ...) share storage and never copy.
#include <concepts>
#include <cstdint>
#include <functional>
#include <optional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "dtype.h"
#include "error.h"
#include "generator.h"
#include "shape.h"
#include "storage.h"

namespace tg {

struct TensorImpl;
class Tensor;
struct Node;

/// A counted reference to an autograd Node (see tape.h). Nodes are freed,
/// without recursion, when the last reference goes away.
class NodeRef {
 public:
  NodeRef() = default;  ///< null
  explicit NodeRef(Node* n);  ///< a new reference to n (may be null)
  NodeRef(const NodeRef& o);  ///< another reference to o's node
  NodeRef(NodeRef&& o) noexcept : p_(o.p_) { o.p_ = nullptr; }  ///< takes o's reference; o becomes null
  /// Refers to o's node, dropping the reference held before.
  NodeRef& operator=(NodeRef o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~NodeRef();  ///< drops the reference; the last one frees the node
  Node* get() const { return p_; }  ///< the node, or nullptr
  Node* operator->() const { return p_; }  ///< the node's members
  explicit operator bool() const { return p_ != nullptr; }  ///< not null

 private:
  Node* p_ = nullptr;
};

/// A gradient hook: sees the gradient flowing into a tensor, may return a
/// replacement of the same shape (an undefined return keeps the gradient).
using GradHook = std::function<Tensor(const Tensor& grad)>;
/// A registered GradHook (in Node::hooks or a leaf's TensorImpl::hooks).
struct HookEntry {
  std::shared_ptr<bool> active;  ///< shared with the HookHandle; false once removed
  GradHook fn;                   ///< the hook
};

/// Returned by the register_*hook functions; remove() disables that hook.
struct HookHandle {
  std::shared_ptr<bool> active;  ///< shared with the hook's entry
  /// Disables the hook (it stays registered and is skipped).
  void remove() const {
    if (active) *active = false;
  }
};

/// A handle to an n-dimensional array of float32, float64, int64 or bfloat16 and its
/// autograd state. Copies share the data; the ops (autograd/ops/) and the
/// methods below make new tensors or views, recorded on the tape when an
/// input requires grad. Make one with a factory (zeros, randn, from_vector,
/// tensor); print it with str() or fmt ("{}").
class Tensor {
 public:
  Tensor() = default;  ///< undefined: defined() is false
  /// A handle to impl (what the factories and ops return).
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }  ///< false for a default-constructed tensor
  TensorImpl* impl() const { return impl_.get(); }   ///< the shared state (null if undefined)
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }  ///< the shared state, owning

  // --- metadata
  const Shape& shape() const;    ///< sizes, outermost first
  const Shape& strides() const;  ///< in elements, one per axis
  int64_t offset() const;        ///< of element 0 in the storage, in elements
  DType dtype() const;           ///< the element type
  int dim() const { return shape().size(); }  ///< the rank
  int64_t size(int64_t axis) const;  ///< negative axes count from the end
  int64_t numel() const { return shape().numel(); }  ///< the number of elements
  bool is_contiguous() const;    ///< row-major with no gaps (views may not be)
  const std::shared_ptr<Storage>& storage() const;  ///< the buffer, shared with views
  /// Bumped by in-place writes to this tensor's storage (shared with its views).
  uint64_t version() const;

  // --- data access (checks the dtype). data<T>() points at element 0 of this view.
  /// Element 0 of this view; DTypeError unless T is the dtype's C++ type.
  template <class T> T* data() const;
  template <class T> T item() const;          ///< the only element of a 1-element tensor
  double item() const;                        ///< as double, any dtype
  template <class T> std::vector<T> to_vector() const;  ///< row-major copy
  /// Value at a multi-index (for tests and printing; slow).
  double at(std::initializer_list<int64_t> index) const;

  // --- autograd
  bool requires_grad() const;  ///< a leaf marked so, or a result of ops on such tensors
  /// Marks a leaf as requiring grad (returns *this for chaining).
  const Tensor& requires_grad_(bool on = true) const;
  bool is_leaf() const;  ///< not produced by a recorded op
  Tensor grad() const;                        ///< accumulated gradient of a leaf (undefined if none)
  void set_grad(const Tensor& g) const;  ///< replaces the gradient held in .grad
  void zero_grad() const;                     ///< drops the gradient (next backward writes a fresh one)
  /// Reverse pass from this tensor into every leaf's .grad. A non-scalar needs
  /// an explicit gradient of its own shape. retain_graph keeps what the graph
  /// saved for another backward; create_graph records the backward itself, so
  /// the gradients can be differentiated again (retain_graph then defaults to true).
  void backward(const Tensor& grad = Tensor(), std::optional<bool> retain_graph = std::nullopt,
                bool create_graph = false) const;
  Tensor detach() const;                      ///< same data, cut from the graph
  /// Calls fn with the gradient flowing into this tensor during each backward
  /// (before a leaf accumulates it); fn may return a replacement of the same
  /// shape, or an undefined tensor to keep it.
  HookHandle register_hook(GradHook fn) const;
  /// Keeps the gradient of a non-leaf tensor in .grad after backward (leaves always do).
  void retain_grad() const;
  bool retains_grad() const;  ///< whether retain_grad() was called on this non-leaf
  /// Leaves only: calls fn(leaf) once its .grad holds every contribution of the
  /// running backward (data-parallel training starts communicating there).
  HookHandle register_post_accumulate_grad_hook(std::function<void(const Tensor&)> fn) const;
  /// The name of the op that produced this tensor ("" for a leaf).
  std::string grad_fn_name() const;

  // --- views (recorded on the tape when they require grad)
  Tensor reshape(const Shape& shape) const;   ///< a view when strides allow, else a copy; one -1 allowed
  Tensor view(const Shape& shape) const;      ///< a view or a ShapeError
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;  ///< axes start..end (inclusive) merged into one
  Tensor transpose(int64_t a, int64_t b) const;  ///< axes a and b swapped (a view)
  Tensor t() const;                           ///< transpose of a 2-D tensor
  Tensor permute(const Shape& order) const;  ///< axis i of the result is axis order[i] (a view)
  Tensor slice(int64_t axis, int64_t start, int64_t stop, int64_t step = 1) const;  ///< Python semantics for start/stop
  Tensor narrow(int64_t axis, int64_t start, int64_t length) const;  ///< slice(axis, start, start + length)
  Tensor select(int64_t axis, int64_t index) const;  ///< removes the axis
  Tensor expand(const Shape& shape) const;  ///< size-1 axes broadcast to shape (stride 0, no copy); -1 keeps a size
  Tensor squeeze(int64_t axis) const;       ///< removes axis, which must have size 1
  Tensor unsqueeze(int64_t axis) const;     ///< inserts an axis of size 1 before axis
  Tensor contiguous() const;                  ///< itself if already contiguous

  // --- conversion and copies
  Tensor to(DType dtype) const;               ///< itself when the dtype already matches
  Tensor clone() const;                       ///< a contiguous copy (differentiable)

  // --- in-place writes (bump the version; not recorded on the tape)
  const Tensor& fill_(double value) const;  ///< every element set to value
  const Tensor& zero_() const { return fill_(0.0); }  ///< fill_(0)
  const Tensor& copy_(const Tensor& src) const;              ///< src broadcast to this shape
  const Tensor& add_(const Tensor& other, double alpha = 1.0) const;  ///< this += alpha * other
  const Tensor& mul_(double factor) const;  ///< this *= factor
  /// Marks the storage as written (for a kernel of one's own that writes
  /// through data<T>()): backward then refuses tensors saved before.
  void bump_version() const;
  /// Makes this handle (and every copy of it) refer to src's data, shape and
  /// dtype, like PyTorch's `param.data = src`: how Module::to(dtype) converts
  /// parameters without invalidating the handles layers hold. Drops .grad.
  void set_data(const Tensor& src) const;

  std::string str() const;                    ///< readable printout (see print.cpp)

 private:
  std::shared_ptr<TensorImpl> impl_;
};

/// What a Tensor handle points at; Tensor's methods are the way to read and
/// change it.
struct TensorImpl {
  std::shared_ptr<Storage> storage;  ///< the buffer, shared with views
  Shape shape;    ///< sizes
  Shape strides;  ///< in elements
  int64_t offset = 0;  ///< in elements
  DType dtype = DType::f32;  ///< the element type
  bool requires_grad = false;  ///< see Tensor::requires_grad()
  Tensor grad;      ///< leaves, and non-leaves that retain_grad()
  NodeRef grad_fn;  ///< the node that produced this tensor; null for leaves
  uint32_t output_nr = 0;  ///< which output of grad_fn: 0, or one of its side outputs (saved.h: SideOutput)
  /// A leaf's hooks, allocated on the first one.
  struct LeafHooks {
    std::vector<HookEntry> grad;  ///< Tensor::register_hook
    /// Tensor::register_post_accumulate_grad_hook, with their active flags.
    std::vector<std::pair<std::shared_ptr<bool>, std::function<void(const Tensor&)>>> post_accumulate;
  };
  std::unique_ptr<LeafHooks> hooks;  ///< null until a hook is registered
  /// Forward mode (forward_ad.h): the tangent make_dual gave this tensor,
  /// valid while tangent_level is the thread's forward-AD level.
  Tensor tangent;
  uint64_t tangent_level = 0;  ///< the level `tangent` belongs to; 0: none
};

// --- factories. Shapes are given as {d0, d1, ...}; dtype defaults to float32.
Tensor empty(const Shape& shape, DType dtype = DType::f32);  ///< uninitialised
Tensor zeros(const Shape& shape, DType dtype = DType::f32);  ///< all 0
Tensor ones(const Shape& shape, DType dtype = DType::f32);   ///< all 1
Tensor full(const Shape& shape, double value, DType dtype = DType::f32);  ///< all value
Tensor scalar(double value, DType dtype = DType::f32);  ///< 0-d tensor
Tensor arange(double start, double stop, double step = 1.0, DType dtype = DType::f32);  ///< start, start + step, ... below stop (1-D)
Tensor arange(int64_t n, DType dtype = DType::i64);  ///< 0, 1, ..., n - 1 (1-D)
Tensor zeros_like(const Tensor& t);  ///< zeros of t's shape and dtype
Tensor ones_like(const Tensor& t);   ///< ones of t's shape and dtype
Tensor empty_like(const Tensor& t);  ///< contiguous, same shape and dtype
/// From host data, row-major; values.size() must equal shape.numel(). float32.
Tensor from_vector(const std::vector<float>& values, const Shape& shape);
Tensor from_vector(const std::vector<double>& values, const Shape& shape);   ///< float64, as above
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape);  ///< int64, as above
Tensor from_vector(const std::vector<bfloat16>& values, const Shape& shape);  ///< bfloat16, as above
/// A 1-D float32 tensor from a list of floats: tensor({1.f, 2.f}).
// The two floating overloads are templates: a list of integer literals converts
// to float, double and int64_t equally well, and would be ambiguous among three
// plain overloads; here it deduces neither template and reaches the int64 one.
template <std::same_as<float> T> Tensor tensor(std::initializer_list<T> values) {
  return from_vector(std::vector<float>(values), Shape{static_cast<int64_t>(values.size())});
}
/// A 1-D float64 tensor from a list of doubles: tensor({1.0, 2.0}).
template <std::same_as<double> T> Tensor tensor(std::initializer_list<T> values) {
  return from_vector(std::vector<double>(values), Shape{static_cast<int64_t>(values.size())});
}
/// A 1-D int64 tensor from a list of integers: tensor({1, 2}), tensor({int64_t{1}, 2}).
Tensor tensor(std::initializer_list<int64_t> values);
/// Random tensors from an explicit generator (default_generator() if omitted).
/// rand: uniform in [low, high).
Tensor rand(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr, double low = 0.0, double high = 1.0);
/// Normal with the given mean and standard deviation (default_generator() if gen is null).
Tensor randn(const Shape& shape, DType dtype = DType::f32, Generator* gen = nullptr, double mean = 0.0, double std = 1.0);
Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen = nullptr);  ///< int64, uniform in [low, high)
/// A tensor over memory owned by someone else (not freed by the tensor).
Tensor from_blob(void* data, const Shape& shape, DType dtype);

/// A view of t's storage with the given geometry (no checks beyond bounds).
Tensor make_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset);

/// Shapes and dtypes of a list of tensors, for error messages: "(2,3) float32, (3,) float32".
std::string describe(std::span<const Tensor> ts);

// --- template definitions
template <class T> T* Tensor::data() const {
  if (!defined()) throw ValueError("data: tensor is undefined");
  if (dtype() != dtype_v<T>)
    throw DTypeError(fmt::format("data: tensor is {}, accessed as {}", dtype_name(dtype()), dtype_name(dtype_v<T>)));
  return static_cast<T*>(storage()->data) + offset();
}

}  // namespace tg

/// Formats a Tensor with fmt as its str(): fmt::print("{}", t).
template <> struct fmt::formatter<tg::Tensor> : fmt::formatter<std::string> {
  /// Writes t.str().
  auto format(const tg::Tensor& t, format_context& ctx) const {
    return fmt::formatter<std::string>::format(t.str(), ctx);
  }
};
