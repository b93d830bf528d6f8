#include "autograd/tensor.h"

#include <cmath>
#include <cstring>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/loop.h"
#include "autograd/ops/view.h"
#include "autograd/op.h"
#include "autograd/parallel.h"
#include "autograd/tape.h"

namespace tg {
namespace {

const TensorImpl& checked(const Tensor& t, const char* what) {
  if (!t.defined()) throw ValueError(fmt::format("{}: tensor is undefined", what));
  return *t.impl();
}

// An in-place write is not recorded on the tape, so it must not touch a tensor
// the tape may need: refuse it on tensors requiring grad while recording.
void check_inplace(const Tensor& t, const char* op) {
  checked(t, op);
  // Forward mode first: NoGradGuard turns off recording, not tangents, so an
  // in-place write under it would still leave the tangent stale (PyTorch's
  // forward AD refuses such writes too).
  if (detail::carries_tangent(*t.impl()))
    throw AutogradError(fmt::format(
        "{}: in-place update of a tensor of shape {} that carries a forward-mode tangent (a dual tensor, or computed "
        "from one, at the open ForwardADGuard level); its tangent would not follow: write out of place, or after the "
        "level closes",
        op, t.shape()));
  if (t.requires_grad() && grad_enabled())
    throw AutogradError(fmt::format(
        "{}: in-place update of a tensor of shape {} that requires grad; run it under NoGradGuard "
        "(as optimizers do) or on a detach()ed tensor",
        op, t.shape()));
}

Tensor new_tensor(const Shape& shape, DType dtype) {
  for (int64_t d : shape)
    if (d < 0) throw ShapeError(fmt::format("empty: negative dimension in shape {}", shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = new_storage(static_cast<size_t>(shape.numel()) * itemsize(dtype), shape, dtype);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

template <class T>
Tensor from_values(const T* values, size_t n, const Shape& shape) {
  if (static_cast<int64_t>(n) != shape.numel())
    throw ShapeError(fmt::format("from_vector: {} values for shape {} ({} elements)", n, shape, shape.numel()));
  Tensor t = new_tensor(shape, dtype_v<T>);
  if (n) std::memcpy(t.data<T>(), values, n * sizeof(T));
  return t;
}

}  // namespace

// --- metadata
const Shape& Tensor::shape() const { return checked(*this, "shape").shape; }
const Shape& Tensor::strides() const { return checked(*this, "strides").strides; }
int64_t Tensor::offset() const { return checked(*this, "offset").offset; }
DType Tensor::dtype() const { return checked(*this, "dtype").dtype; }
const std::shared_ptr<Storage>& Tensor::storage() const { return checked(*this, "storage").storage; }
uint64_t Tensor::version() const { return storage()->version; }
void Tensor::bump_version() const { ++storage()->version; }

int64_t Tensor::size(int64_t axis) const { return shape()[normalize_axis(axis, dim(), "size")]; }

bool Tensor::is_contiguous() const {
  const TensorImpl& t = checked(*this, "is_contiguous");
  // No elements: no stride can place one out of order (PyTorch agrees), and
  // contiguous_strides gives the axes after a 0 a stride of 1, not 0.
  if (t.shape.numel() == 0) return true;
  int64_t expected = 1;
  for (int d = t.shape.size() - 1; d >= 0; --d) {
    if (t.shape[d] == 1) continue;
    if (t.strides[d] != expected) return false;
    expected *= t.shape[d];
  }
  return true;
}

template <class T> T Tensor::item() const {
  if (numel() != 1)
    throw ShapeError(fmt::format("item: tensor of shape {} has {} elements, expected 1", shape(), numel()));
  return *data<T>();
}
template float Tensor::item<float>() const;
template double Tensor::item<double>() const;
template int64_t Tensor::item<int64_t>() const;
template bfloat16 Tensor::item<bfloat16>() const;

double Tensor::item() const {
  return TG_DISPATCH_ALL(dtype(), "item", [&] { return static_cast<double>(item<scalar_t>()); });
}

template <class T> std::vector<T> Tensor::to_vector() const {
  Tensor c = contiguous();
  const T* p = c.data<T>();
  return std::vector<T>(p, p + c.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<bfloat16> Tensor::to_vector<bfloat16>() const;

double Tensor::at(std::initializer_list<int64_t> index) const {
  if (static_cast<int>(index.size()) != dim())
    throw IndexError(fmt::format("at: {} indices for a tensor of shape {}", index.size(), shape()));
  int64_t off = 0;
  int d = 0;
  for (int64_t i : index) {
    int64_t n = shape()[d];
    if (i < -n || i >= n)
      throw IndexError(fmt::format("at: index {} is out of range for axis {} of size {}", i, d, n));
    off += (i < 0 ? i + n : i) * strides()[d];
    ++d;
  }
  return TG_DISPATCH_ALL(dtype(), "at", [&] {
    return static_cast<double>(static_cast<scalar_t*>(storage()->data)[offset() + off]);
  });
}

// --- autograd
bool Tensor::requires_grad() const { return checked(*this, "requires_grad").requires_grad; }

const Tensor& Tensor::requires_grad_(bool on) const {
  TensorImpl& t = const_cast<TensorImpl&>(checked(*this, "requires_grad_"));
  if (t.grad_fn && !on)
    throw AutogradError("requires_grad_: cannot turn off grad on a non-leaf tensor; use detach()");
  if (on && !is_floating(t.dtype))
    throw DTypeError(fmt::format("requires_grad_: only floating tensors can require grad, this one is {}",
                                 dtype_name(t.dtype)));
  t.requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const { return !checked(*this, "is_leaf").grad_fn; }
Tensor Tensor::grad() const { return checked(*this, "grad").grad; }

void Tensor::set_grad(const Tensor& g) const {
  if (g.defined() && !(g.shape() == shape()))
    throw ShapeError(fmt::format("set_grad: gradient of shape {} for a tensor of shape {}", g.shape(), shape()));
  impl()->grad = g;
}

void Tensor::zero_grad() const {
  checked(*this, "zero_grad");
  impl()->grad = Tensor();
}

// Hooks and retain_grad belong to a node's output; a side output (an
// intermediate that only a recorded backward reads) has neither.
static void refuse_side_output(const TensorImpl& t, const char* api) {
  if (t.output_nr != 0)
    throw AutogradError(fmt::format("{}: this tensor (shape {}) is side output {} of '{}', an intermediate its "
                                    "recorded backward reads; hooks and retain_grad apply to the op's output",
                                    api, t.shape, t.output_nr, t.grad_fn->op->name));
}

HookHandle Tensor::register_hook(GradHook fn) const {
  TensorImpl& t = const_cast<TensorImpl&>(checked(*this, "register_hook"));
  if (!t.requires_grad)
    throw AutogradError(fmt::format("register_hook: tensor of shape {} does not require grad", t.shape));
  refuse_side_output(t, "register_hook");
  HookHandle handle{std::make_shared<bool>(true)};
  if (t.grad_fn) {
    t.grad_fn->hooks.push_back({handle.active, std::move(fn)});
  } else {
    if (!t.hooks) t.hooks = std::make_unique<TensorImpl::LeafHooks>();
    t.hooks->grad.push_back({handle.active, std::move(fn)});
  }
  return handle;
}

void Tensor::retain_grad() const {
  const TensorImpl& t = checked(*this, "retain_grad");
  if (!t.requires_grad)
    throw AutogradError(fmt::format("retain_grad: tensor of shape {} does not require grad", t.shape));
  refuse_side_output(t, "retain_grad");
  if (t.grad_fn) t.grad_fn->retains = impl_;
}

bool Tensor::retains_grad() const {
  const TensorImpl& t = checked(*this, "retains_grad");
  return t.grad_fn && t.grad_fn->retains.lock() == impl_;
}

HookHandle Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> fn) const {
  TensorImpl& t = const_cast<TensorImpl&>(checked(*this, "register_post_accumulate_grad_hook"));
  if (t.grad_fn || !t.requires_grad)
    throw AutogradError(fmt::format(
        "register_post_accumulate_grad_hook: only leaves requiring grad accumulate a gradient (shape {})", t.shape));
  if (!t.hooks) t.hooks = std::make_unique<TensorImpl::LeafHooks>();
  HookHandle handle{std::make_shared<bool>(true)};
  t.hooks->post_accumulate.emplace_back(handle.active, std::move(fn));
  return handle;
}

std::string Tensor::grad_fn_name() const {
  const TensorImpl& t = checked(*this, "grad_fn_name");
  return t.grad_fn ? std::string(t.grad_fn->op->name) : std::string();
}

void Tensor::set_data(const Tensor& src) const {
  TensorImpl& t = const_cast<TensorImpl&>(checked(*this, "set_data"));
  const TensorImpl& s = checked(src, "set_data");
  if (t.grad_fn) throw AutogradError("set_data: only leaf tensors can have their data replaced");
  if (t.requires_grad && !is_floating(s.dtype))
    throw DTypeError(fmt::format("set_data: a tensor requiring grad cannot take {} data", dtype_name(s.dtype)));
  t.storage = s.storage;
  t.shape = s.shape;
  t.strides = s.strides;
  t.offset = s.offset;
  t.dtype = s.dtype;
  t.grad = Tensor();
}

Tensor Tensor::detach() const {
  const TensorImpl& t = checked(*this, "detach");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage;
  impl->shape = t.shape;
  impl->strides = t.strides;
  impl->offset = t.offset;
  impl->dtype = t.dtype;
  return Tensor(std::move(impl));
}

// --- views: the differentiable versions live in ops/view.cpp
Tensor Tensor::reshape(const Shape& s) const { return tg::reshape(*this, s); }
Tensor Tensor::view(const Shape& s) const { return tg::view(*this, s); }
Tensor Tensor::flatten(int64_t start, int64_t end) const { return tg::flatten(*this, start, end); }
Tensor Tensor::transpose(int64_t a, int64_t b) const { return tg::transpose(*this, a, b); }
Tensor Tensor::t() const {
  if (dim() != 2) throw ShapeError(fmt::format("t: expected a 2-D tensor, got shape {}", shape()));
  return tg::transpose(*this, 0, 1);
}
Tensor Tensor::permute(const Shape& order) const { return tg::permute(*this, order); }
Tensor Tensor::slice(int64_t axis, int64_t start, int64_t stop, int64_t step) const {
  return tg::slice(*this, axis, start, stop, step);
}
Tensor Tensor::narrow(int64_t axis, int64_t start, int64_t length) const {
  return tg::narrow(*this, axis, start, length);
}
Tensor Tensor::select(int64_t axis, int64_t index) const { return tg::select(*this, axis, index); }
Tensor Tensor::expand(const Shape& s) const { return tg::expand(*this, s); }
Tensor Tensor::squeeze(int64_t axis) const { return tg::squeeze(*this, axis); }
Tensor Tensor::unsqueeze(int64_t axis) const { return tg::unsqueeze(*this, axis); }
Tensor Tensor::contiguous() const { return is_contiguous() ? *this : tg::clone(*this); }
Tensor Tensor::to(DType d) const { return dtype() == d ? *this : tg::cast(*this, d); }
Tensor Tensor::clone() const { return tg::clone(*this); }

// --- in-place writes
const Tensor& Tensor::fill_(double value) const {
  check_inplace(*this, "fill_");
  TG_DISPATCH_ALL(dtype(), "fill_", [&] {
    const scalar_t v = static_cast<scalar_t>(value);
    if (is_contiguous()) {
      std::fill_n(data<scalar_t>(), numel(), v);
    } else {
      detail::map1<scalar_t, scalar_t>(*this, *this, [v](scalar_t) { return v; });
    }
  });
  bump_version();
  return *this;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  check_inplace(*this, "copy_");
  broadcast_shapes(src.shape(), shape(), "copy_");  // throws if src does not broadcast
  if (!(broadcast_shapes(src.shape(), shape(), "copy_") == shape()))
    throw ShapeError(fmt::format("copy_: cannot copy a tensor of shape {} into shape {}", src.shape(), shape()));
  TG_DISPATCH_ALL(dtype(), "copy_", [&] {
    using TO = scalar_t;
    TG_DISPATCH_ALL(src.dtype(), "copy_", [&] {
      detail::map1<TO, scalar_t>(*this, src, [](scalar_t x) { return static_cast<TO>(x); });
    });
  });
  bump_version();
  return *this;
}

const Tensor& Tensor::add_(const Tensor& other, double alpha) const {
  check_inplace(*this, "add_");
  if (other.dtype() != dtype())
    throw DTypeError(fmt::format("add_: cannot add {} into {}", dtype_name(other.dtype()), dtype_name(dtype())));
  if (!(broadcast_shapes(other.shape(), shape(), "add_") == shape()))
    throw ShapeError(fmt::format("add_: cannot add a tensor of shape {} into shape {}", other.shape(), shape()));
  TG_DISPATCH_ARITH(dtype(), "add_", [&] {
    const scalar_t a = static_cast<scalar_t>(alpha);
    if (alpha == 1.0)
      detail::map2<scalar_t, scalar_t, scalar_t>(*this, *this, other, [](scalar_t x, scalar_t y) { return x + y; });
    else
      detail::map2<scalar_t, scalar_t, scalar_t>(*this, *this, other, [a](scalar_t x, scalar_t y) { return x + a * y; });
  });
  bump_version();
  return *this;
}

const Tensor& Tensor::mul_(double factor) const {
  check_inplace(*this, "mul_");
  TG_DISPATCH_ARITH(dtype(), "mul_", [&] {
    const scalar_t f = static_cast<scalar_t>(factor);
    detail::map1<scalar_t, scalar_t>(*this, *this, [f](scalar_t x) { return x * f; });
  });
  bump_version();
  return *this;
}

// --- factories
Tensor empty(const Shape& shape, DType dtype) { return new_tensor(shape, dtype); }
Tensor zeros(const Shape& shape, DType dtype) {
  Tensor t = new_tensor(shape, dtype);
  // Cleared on the pool when it is large (a slice's gradient has its
  // input's full shape): as many bytes per thread as an elementwise chunk.
  auto* p = static_cast<char*>(t.storage()->data);
  const int64_t bytes = t.numel() * static_cast<int64_t>(itemsize(dtype));
  parallel_for(bytes, detail::kElementwiseGrain * 4, [p](int64_t b, int64_t e) {
    std::memset(p + b, 0, static_cast<size_t>(e - b));
  });
  return t;
}
Tensor ones(const Shape& shape, DType dtype) { return full(shape, 1.0, dtype); }
Tensor full(const Shape& shape, double value, DType dtype) {
  Tensor t = new_tensor(shape, dtype);
  TG_DISPATCH_ALL(dtype, "full", [&] { std::fill_n(t.data<scalar_t>(), t.numel(), static_cast<scalar_t>(value)); });
  return t;
}
Tensor scalar(double value, DType dtype) { return full(Shape{}, value, dtype); }
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype()); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype()); }

Tensor arange(double start, double stop, double step, DType dtype) {
  if (step == 0 || !std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    throw ValueError(fmt::format("arange: invalid range start={} stop={} step={}", start, stop, step));
  int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((stop - start) / step)));
  Tensor t = new_tensor(Shape{n}, dtype);
  TG_DISPATCH_ALL(dtype, "arange", [&] {
    scalar_t* p = t.data<scalar_t>();
    for (int64_t i = 0; i < n; ++i) p[i] = static_cast<scalar_t>(start + static_cast<double>(i) * step);
  });
  return t;
}
Tensor arange(int64_t n, DType dtype) { return arange(0.0, static_cast<double>(n), 1.0, dtype); }

Tensor from_vector(const std::vector<float>& v, const Shape& s) { return from_values(v.data(), v.size(), s); }
Tensor from_vector(const std::vector<double>& v, const Shape& s) { return from_values(v.data(), v.size(), s); }
Tensor from_vector(const std::vector<int64_t>& v, const Shape& s) { return from_values(v.data(), v.size(), s); }
Tensor from_vector(const std::vector<bfloat16>& v, const Shape& s) { return from_values(v.data(), v.size(), s); }
Tensor tensor(std::initializer_list<int64_t> v) { return from_values(v.begin(), v.size(), Shape{int64_t(v.size())}); }

Tensor rand(const Shape& shape, DType dtype, Generator* gen, double low, double high) {
  Generator& g = gen ? *gen : default_generator();
  Tensor t = new_tensor(shape, dtype);
  const uint64_t c0 = g.reserve(static_cast<uint64_t>(t.numel()));
  dispatch_float(dtype, "rand", [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t* p = t.data<scalar_t>();
    parallel_for(t.numel(), 1 << 15, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = static_cast<scalar_t>(low + (high - low) * g.uniform_at(c0 + i));
    });
  });
  return t;
}

Tensor randn(const Shape& shape, DType dtype, Generator* gen, double mean, double std) {
  Generator& g = gen ? *gen : default_generator();
  Tensor t = new_tensor(shape, dtype);
  const int64_t n = t.numel();
  const uint64_t c0 = g.reserve(static_cast<uint64_t>(2 * n));
  dispatch_float(dtype, "randn", [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t* p = t.data<scalar_t>();
    parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        // Box-Muller on the pair of counters owned by element i.
        double u1 = 1.0 - g.uniform_at(c0 + 2 * i), u2 = g.uniform_at(c0 + 2 * i + 1);
        double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
        p[i] = static_cast<scalar_t>(mean + std * z);
      }
    });
  });
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Generator* gen) {
  if (high <= low) throw ValueError(fmt::format("randint: empty range [{}, {})", low, high));
  Generator& g = gen ? *gen : default_generator();
  Tensor t = new_tensor(shape, DType::i64);
  const uint64_t c0 = g.reserve(static_cast<uint64_t>(t.numel()));
  const uint64_t span = static_cast<uint64_t>(high - low);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = low + static_cast<int64_t>(g.bits(c0 + i) % span);
  return t;
}

Tensor from_blob(void* data, const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>();
  impl->storage->data = data;
  impl->storage->nbytes = static_cast<size_t>(shape.numel()) * itemsize(dtype);
  impl->storage->owned = false;
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor make_view(const Tensor& t, const Shape& shape, const Shape& strides, int64_t offset) {
  if (shape.size() != strides.size())
    throw ShapeError(fmt::format("make_view: shape {} and strides {} differ in rank", shape, strides));
  if (shape.numel() > 0) {
    // The lowest and highest element the view can reach must lie in the storage.
    int64_t lo = offset, hi = offset;
    for (int d = 0; d < shape.size(); ++d) (strides[d] < 0 ? lo : hi) += (shape[d] - 1) * strides[d];
    const int64_t n = static_cast<int64_t>(t.storage()->nbytes / itemsize(t.dtype()));
    if (lo < 0 || hi >= n)
      throw IndexError(fmt::format("make_view: shape {} strides {} offset {} reaches elements [{}, {}] of a storage of {}",
                                   shape, strides, offset, lo, hi, n));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.storage();
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

std::string describe(std::span<const Tensor> ts) {
  std::string out;
  for (const Tensor& t : ts) {
    if (!out.empty()) out += ", ";
    out += t.defined() ? fmt::format("{} {}", t.shape(), dtype_name(t.dtype())) : "undefined";
  }
  return out;
}

}  // namespace tg
