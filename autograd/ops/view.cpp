// View ops (view.h); each backward maps the gradient back to the input's geometry.
#include "autograd/ops/view.h"

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

using samples::strided, samples::uniform;

struct PermuteAttrs {
  Shape order;  // normalised: output axis d is input axis order[d]
};
struct SliceAttrs {
  int64_t axis, start, stop, step;  // normalised: 0 <= start <= stop <= the axis' size
};

const Tensor& defined(const Tensor& x, std::string_view op) {
  detail::check_defined(op, x, "tensor");
  return x;
}

// Resolves one -1 and checks the element count.
Shape infer_shape(const Tensor& x, const Shape& shape, const char* op) {
  Shape out = shape;
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < out.size(); ++d) {
    if (out[d] == -1) {
      if (infer >= 0) throw ShapeError(fmt::format("{}: only one dimension can be -1 in {}", op, shape));
      infer = d;
    } else if (out[d] < 0) {
      throw ShapeError(fmt::format("{}: invalid dimension {} in {}", op, out[d], shape));
    } else {
      known *= out[d];
    }
  }
  if (infer >= 0 && known > 0) out[infer] = x.numel() / known;  // a remainder fails the count below
  if (out.numel() != x.numel() || (infer >= 0 && known == 0))
    throw ShapeError(fmt::format("{}: cannot reshape {} ({} elements) into {}", op, x.shape(), x.numel(), shape));
  return out;
}

// Strides that let `to` view x's memory, or false when it cannot (PyTorch's
// computeStride: walk chunks of old dims that are contiguous among themselves).
bool view_strides(const Tensor& x, const Shape& to, Shape& strides) {
  const Shape &from = x.shape(), &old_st = x.strides();
  strides = contiguous_strides(to);  // kept only when empty: the walk sets every stride
  if (x.numel() == 0) return true;
  int view_d = to.size() - 1;
  int64_t chunk_base = old_st.empty() ? 1 : old_st.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int d = from.size() - 1; d >= 0; --d) {
    tensor_numel *= from[d];
    if (d == 0 || (from[d - 1] != 1 && old_st[d - 1] != tensor_numel * chunk_base)) {
      while (view_d >= 0 && (view_numel < tensor_numel || to[view_d] == 1)) {
        strides[view_d] = view_numel * chunk_base;
        view_numel *= to[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return false;
      if (d > 0) {
        chunk_base = old_st[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  for (; view_d >= 0; --view_d) {  // leading size-1 dims of a scalar-like view
    if (to[view_d] != 1) return false;
    strides[view_d] = 1;
  }
  return true;
}

}  // namespace

// ============================ reshape / view ============================
static void reshape_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = reshape(g, n.edges[0].shape);
}
static const OpDef reshape_op({
    .name = "reshape",
    .arity = 1,
    .signature = "reshape(x, shape) / view(x, shape)",
    .saves = saves_of<NoSaved>(),
    .backward = reshape_backward,
    // A view's tangent: the same view of the input's.
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = reshape(t[0], n.out_shape);
    },
    .samples = [] {
      return std::vector<OpSample>{
          {"(3,4) -> (2,-1,3)", {uniform({3, 4}, 101)}, [](auto& x) { return reshape(x[0], {2, -1, 3}); }},
          {"non-contiguous (2,3) -> (6)", {strided({2, 3}, 102)}, [](auto& x) { return reshape(x[0], {6}); }},
          {"view (2,3,4) -> (6,4)", {uniform({2, 3, 4}, 103)}, [](auto& x) { return view(x[0], {6, 4}); }},
      };
    },
});

Tensor view(const Tensor& x, const Shape& shape) {
  ProfileScope prof(reshape_op.name);
  Shape to = infer_shape(defined(x, "view"), shape, "view");
  Shape strides;
  if (!view_strides(x, to, strides))
    throw ShapeError(fmt::format("view: a tensor of shape {} with strides {} cannot be viewed as {}; use reshape()",
                                 x.shape(), x.strides(), to));
  Tensor out = make_view(x, to, strides, x.offset());
  record(reshape_op, out, x);
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape to = infer_shape(defined(x, "reshape"), shape, "reshape");
  Shape strides;
  return view(view_strides(x, to, strides) ? x : clone(x), to);
}

Tensor flatten(const Tensor& x, int64_t start, int64_t end) {
  int r = defined(x, "flatten").dim();
  if (r == 0) return reshape(x, {1});
  int s = normalize_axis(start, r, "flatten"), e = normalize_axis(end, r, "flatten");
  if (s > e) throw IndexError(fmt::format("flatten: start axis {} is after end axis {}", start, end));
  Shape to = x.shape();
  for (int d = e; d > s; --d) {
    to[s] *= to[d];
    to.erase(d);
  }
  return reshape(x, to);
}

// ============================ transpose / permute ============================
Tensor detail::unpermute(const Tensor& y, const Shape& order) {
  Shape inverse = order;
  for (int d = 0; d < order.size(); ++d) inverse[static_cast<int>(order[d])] = d;
  return permute(y, inverse);
}
static void permute_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = detail::unpermute(g, n.attrs<PermuteAttrs>().order);
}
static const OpDef permute_op({
    .name = "permute",
    .arity = 1,
    .signature = "permute(x, order) / transpose(x, a, b)",
    .saves = saves_of<NoSaved>(),
    .backward = permute_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = permute(t[0], n.attrs<PermuteAttrs>().order);
    },
    .samples = [] {
      return std::vector<OpSample>{
          {"(2,3,4) -> (2,0,1)", {uniform({2, 3, 4}, 104)}, [](auto& x) { return permute(x[0], {2, 0, 1}); }},
          {"transpose (3,4) 0 1", {uniform({3, 4}, 105)}, [](auto& x) { return transpose(x[0], 0, 1); }},
      };
    },
});
Tensor permute(const Tensor& x, const Shape& order) {
  ProfileScope prof(permute_op.name);
  const int r = defined(x, "permute").dim();
  if (order.size() != r)
    throw ShapeError(fmt::format("permute: order {} for a tensor of shape {}", order, x.shape()));
  Shape shape, strides, norm;
  bool seen[kMaxDims] = {};
  for (int d = 0; d < r; ++d) {
    int a = normalize_axis(order[d], r, "permute");
    if (seen[a]) throw ShapeError(fmt::format("permute: axis {} repeated in {}", a, order));
    seen[a] = true;
    norm.push_back(a);
    shape.push_back(x.shape()[a]);
    strides.push_back(x.strides()[a]);
  }
  Tensor out = make_view(x, shape, strides, x.offset());
  if (Node* n = record(permute_op, out, x)) n->attrs<PermuteAttrs>() = {.order = norm};
  return out;
}

Tensor transpose(const Tensor& x, int64_t a, int64_t b) {
  const int r = defined(x, "transpose").dim();
  Shape order;
  for (int d = 0; d < r; ++d) order.push_back(d);
  int na = normalize_axis(a, r, "transpose"), nb = normalize_axis(b, r, "transpose");
  if (r > 0) std::swap(order[na], order[nb]);
  return permute(x, order);
}

// ============================ slice / narrow / select ============================
// Backward pads the gradient to the input's shape (step > 1: each entry then
// step - 1 zeros, (.., L, step, ..) reshaped). A plain pass adds into an input
// gradient already accumulating (q, k, v of one projection) through reslice.
static Tensor reslice(const Node& n, const Tensor& t) {
  const SliceAttrs& s = n.attrs<SliceAttrs>();
  return slice(t, s.axis, s.start, s.stop, s.step);
}
static void slice_accumulate(const Node& n, const Tensor& g, Tensor& gx) {
  reslice(n, gx).add_(g);
}
static void slice_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const SliceAttrs& s = n.attrs<SliceAttrs>();
  const Shape& in = n.edges[0].shape;
  const int a = static_cast<int>(s.axis);
  std::vector<int64_t> pads(2 * (in.size() - a), 0);  // axes r-1 .. a (r .. a+1 of g unsqueezed at a+1)
  Tensor spread = g;
  if (s.step > 1) {
    pads.back() = s.step - 1;
    Shape to = g.shape();
    to[a] *= s.step;
    spread = reshape(pad(unsqueeze(g, a + 1), pads), to);
  }
  pads.end()[-2] = s.start;
  pads.back() = in[a] - s.start - spread.shape()[a];
  gin[0] = pad(spread, pads);
}
static const OpDef slice_op({
    .name = "slice",
    .arity = 1,
    .signature = "slice(x, axis, start, stop, step) -> x[start:stop:step] on axis",
    .saves = saves_of<NoSaved>(),
    .backward = slice_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = reslice(n, t[0]);
    },
    .samples = [] {
      return std::vector<OpSample>{
          {"(5,4) axis 0 [1:5:2]", {uniform({5, 4}, 106)}, [](auto& x) { return slice(x[0], 0, 1, 5, 2); }},
          {"(3,6) axis -1 [-4:]", {uniform({3, 6}, 107)}, [](auto& x) { return slice(x[0], -1, -4, 100); }},
          {"non-contiguous narrow", {strided({4, 3}, 108)}, [](auto& x) { return narrow(x[0], 1, 1, 2); }},
      };
    },
    .accumulate = slice_accumulate,
});
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t stop, int64_t step) {
  ProfileScope prof(slice_op.name);
  const int a = normalize_axis(axis, defined(x, "slice").dim(), "slice");
  if (x.dim() == 0) throw ShapeError("slice: cannot slice a 0-d tensor");
  if (step <= 0) throw ValueError(fmt::format("slice: step must be positive, got {}", step));
  const int64_t n = x.shape()[a];
  auto clampi = [n](int64_t v) { return std::clamp<int64_t>(v < 0 ? v + n : v, 0, n); };
  int64_t s = clampi(start), e = std::max(clampi(stop), s);
  Shape shape = x.shape(), strides = x.strides();
  shape[a] = (e - s + step - 1) / step;
  strides[a] *= step;
  Tensor out = make_view(x, shape, strides, x.offset() + s * x.strides()[a]);
  if (Node* node = record(slice_op, out, x))
    node->attrs<SliceAttrs>() = {.axis = a, .start = s, .stop = e, .step = step};
  return out;
}

Tensor narrow(const Tensor& x, int64_t axis, int64_t start, int64_t length) {
  const int a = normalize_axis(axis, defined(x, "narrow").dim(), "narrow");
  const int64_t n = x.shape()[a];
  if (start < 0) start += n;
  if (start < 0 || length < 0 || start + length > n)
    throw IndexError(fmt::format("narrow: [{}, {}) is outside axis {} of size {} (shape {})", start, start + length,
                                 a, n, x.shape()));
  return slice(x, a, start, start + length);
}

Tensor select(const Tensor& x, int64_t axis, int64_t index) {
  const int a = normalize_axis(axis, defined(x, "select").dim(), "select");
  const int64_t n = x.shape()[a];
  if (index < -n || index >= n)
    throw IndexError(fmt::format("select: index {} is out of range for axis {} of size {}", index, a, n));
  if (index < 0) index += n;
  return squeeze(slice(x, a, index, index + 1), a);
}

// ============================ expand ============================
static void expand_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = sum_to(g, n.edges[0].shape);
}
static const OpDef expand_op({
    .name = "expand",
    .arity = 1,
    .signature = "expand(x, shape)",
    .saves = saves_of<NoSaved>(),
    .backward = expand_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = expand(t[0], n.out_shape);
    },
    .samples = [] {
      return std::vector<OpSample>{
          {"(3,1) -> (2,3,4)", {uniform({3, 1}, 109)}, [](auto& x) { return expand(x[0], {2, 3, 4}); }},
          {"() -> (3)", {uniform({}, 110)}, [](auto& x) { return expand(x[0], {3}); }},
      };
    },
});
Tensor expand(const Tensor& x, const Shape& shape) {
  ProfileScope prof(expand_op.name);
  const int r = defined(x, "expand").dim(), n = shape.size();
  if (n < r) throw ShapeError(fmt::format("expand: cannot expand {} to fewer dimensions {}", x.shape(), shape));
  Shape out_shape, strides;
  for (int d = 0; d < n; ++d) {
    int xd = d - (n - r);
    int64_t want = shape[d];
    if (xd < 0) {
      if (want < 0) throw ShapeError(fmt::format("expand: -1 for a new leading dimension in {}", shape));
      out_shape.push_back(want);
      strides.push_back(0);
      continue;
    }
    int64_t have = x.shape()[xd];
    if (want == -1) want = have;
    if (have != want && have != 1)
      throw ShapeError(fmt::format("expand: cannot expand {} to {} (dimension {} is {}, not 1)", x.shape(), shape, xd,
                                   have));
    out_shape.push_back(want);
    strides.push_back(have == want ? x.strides()[xd] : 0);
  }
  Tensor out = make_view(x, out_shape, strides, x.offset());
  record(expand_op, out, x);
  return out;
}

// ============================ squeeze / unsqueeze ============================
Tensor squeeze(const Tensor& x, int64_t axis) {
  const int a = normalize_axis(axis, defined(x, "squeeze").dim(), "squeeze");
  if (x.dim() == 0) return x;
  if (x.shape()[a] != 1)
    throw ShapeError(fmt::format("squeeze: axis {} of shape {} has size {}, not 1", a, x.shape(), x.shape()[a]));
  Shape s = x.shape();
  s.erase(a);
  return view(x, s);
}

Tensor unsqueeze(const Tensor& x, int64_t axis) {
  const int r = defined(x, "unsqueeze").dim();
  if (axis < -(r + 1) || axis > r)
    throw IndexError(fmt::format("unsqueeze: axis {} is out of range for a tensor of rank {}", axis, r));
  const int a = static_cast<int>(axis < 0 ? axis + r + 1 : axis);
  Shape s = x.shape();
  s.insert(a, 1);
  return view(x, s);
}

// ============================ clone ============================
static void clone_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) { gin[0] = g; }
static const OpDef clone_op({
    .name = "clone",
    .arity = 1,
    .signature = "clone(x) / x.contiguous() -> a contiguous copy",
    .saves = saves_of<NoSaved>(),
    .backward = clone_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"non-contiguous (3,4)", {strided({3, 4}, 111)}, [](auto& x) { return clone(x[0]); }},
      };
    },
});
Tensor clone(const Tensor& x) {
  ProfileScope prof(clone_op.name);
  Tensor out = empty(defined(x, clone_op.name).shape(), x.dtype());
  {
    NoGradGuard ng;  // copy_ refuses tensors requiring grad while recording
    out.copy_(x);
  }
  record(clone_op, out, x);
  return out;
}

}  // namespace tg
