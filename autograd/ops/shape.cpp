// Copying shape ops: concat, stack, pad, flip, triu, tril; split and chunk
// return views through narrow (view.cpp), so their backward is slice's.
// Forward copies go through Tensor::copy_ (the strided loop of loop.h, which
// vectorises and threads); each backward is the matching copy the other way.
#include "autograd/ops/shape.h"

#include <algorithm>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/ops/view.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

// out[...] = src, without recording (the op records itself).
void copy_into(const Tensor& out, const Tensor& src) {
  NoGradGuard ng;
  out.copy_(src);
}

// Shared checks of concat and stack: a non-empty list of defined tensors of
// one dtype. Returns the list's shapes for error messages.
std::string check_list(const std::vector<Tensor>& xs, std::string_view op) {
  if (xs.empty()) throw ValueError(fmt::format("{}: needs at least one tensor, got an empty list", op));
  for (size_t k = 0; k < xs.size(); ++k)
    if (!xs[k].defined()) throw ValueError(fmt::format("{}: tensor {} of the list is undefined", op, k));
  const std::string all = describe(xs);
  for (const Tensor& x : xs)
    if (x.dtype() != xs[0].dtype()) throw DTypeError(fmt::format("{}: tensors have different dtypes: {}", op, all));
  return all;
}

std::vector<const Tensor*> pointers(const std::vector<Tensor>& xs) {
  std::vector<const Tensor*> p;
  p.reserve(xs.size());
  for (const Tensor& x : xs) p.push_back(&x);
  return p;
}

// concat and stack: the axis they join along (normalised).
struct JoinAttrs {
  int64_t axis;
};

}  // namespace

// concat and stack: the input tangents, zeros where one is zero.
static std::vector<Tensor> join_tangents(const Node& n, std::span<const Tensor> t) {
  std::vector<Tensor> parts;
  for (size_t k = 0; k < n.edges.size(); ++k)
    parts.push_back(t[k].defined() ? t[k] : zeros(n.edges[k].shape, n.out_dtype));
  return parts;
}

// ============================ concat ============================
static void concat_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const int axis = static_cast<int>(n.attrs<JoinAttrs>().axis);
  int64_t start = 0;
  for (size_t k = 0; k < n.edges.size(); ++k) {
    const int64_t len = n.edges[k].shape[axis];
    if (n.needs(k)) gin[k] = narrow(g, axis, start, len).contiguous();
    start += len;
  }
}
static const OpDef concat_op({
    .name = "concat",
    .arity = -1,
    .signature = "concat(xs, axis): join along an existing axis",
    .saves = saves_of<NoSaved>(),
    .backward = concat_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = concat(join_tangents(n, t), n.attrs<JoinAttrs>().axis);
    },
    .samples = [] {
      using samples::uniform;
      return std::vector<OpSample>{
          {"(2,3) and (4,3) axis 0", {uniform({2, 3}, 401), uniform({4, 3}, 402)},
           [](const std::vector<Tensor>& x) { return concat(x, 0); }},
          {"three (2,1,3), (2,2,3), (2,3,3) axis 1", {uniform({2, 1, 3}, 403), uniform({2, 2, 3}, 404), uniform({2, 3, 3}, 405)},
           [](const std::vector<Tensor>& x) { return concat(x, 1); }},
          {"non-contiguous (3,2) with (3,1) axis -1", {samples::strided({3, 2}, 406), uniform({3, 1}, 407)},
           [](const std::vector<Tensor>& x) { return concat(x, -1); }},
      };
    },
});

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  const std::string_view op = concat_op.name;
  ProfileScope prof(op);
  const std::string all = check_list(xs, op);
  const Shape& first = xs[0].shape();
  if (first.size() == 0) throw ShapeError(fmt::format("{}: cannot concatenate 0-d tensors: {}", op, all));
  const int a = normalize_axis(axis, first.size(), "concat");
  Shape shape = first;
  shape[a] = 0;
  for (const Tensor& x : xs) {
    bool same = x.dim() == first.size();
    for (int d = 0; same && d < first.size(); ++d) same = d == a || x.shape()[d] == first[d];
    if (!same)
      throw ShapeError(fmt::format("{}: along axis {} every other dimension must match, got {}", op, a, all));
    shape[a] += x.shape()[a];
  }
  Tensor out = empty(shape, xs[0].dtype());
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t len = x.shape()[a];
    if (len > 0) copy_into(out.narrow(a, start, len), x);
    start += len;
  }
  const std::vector<const Tensor*> inputs = pointers(xs);
  if (Node* n = record(concat_op, inputs, out)) n->attrs<JoinAttrs>() = {.axis = a};
  return out;
}

// ============================ stack ============================
static void stack_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  for (size_t k = 0; k < n.edges.size(); ++k)
    if (n.needs(k)) gin[k] = select(g, n.attrs<JoinAttrs>().axis, static_cast<int64_t>(k)).contiguous();
}
static const OpDef stack_op({
    .name = "stack",
    .arity = -1,
    .signature = "stack(xs, axis): join along a new axis",
    .saves = saves_of<NoSaved>(),
    .backward = stack_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = stack(join_tangents(n, t), n.attrs<JoinAttrs>().axis);
    },
    .samples = [] {
      using samples::uniform;
      return std::vector<OpSample>{
          {"two (2,3) axis 0", {uniform({2, 3}, 411), uniform({2, 3}, 412)},
           [](const std::vector<Tensor>& x) { return stack(x, 0); }},
          {"three (3,2) axis -1", {uniform({3, 2}, 413), samples::strided({3, 2}, 414), uniform({3, 2}, 415)},
           [](const std::vector<Tensor>& x) { return stack(x, -1); }},
          {"two () axis 0", {uniform({}, 416), uniform({}, 417)}, [](const std::vector<Tensor>& x) { return stack(x, 0); }},
      };
    },
});

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  const std::string_view op = stack_op.name;
  ProfileScope prof(op);
  const std::string all = check_list(xs, op);
  const Shape& first = xs[0].shape();
  for (const Tensor& x : xs)
    if (!(x.shape() == first))
      throw ShapeError(fmt::format("{}: every tensor must have the same shape, got {}", op, all));
  const int r = first.size();
  if (axis < -(r + 1) || axis > r)
    throw IndexError(fmt::format("{}: axis {} is out of range for tensors of rank {} ({})", op, axis, r, all));
  const int a = static_cast<int>(axis < 0 ? axis + r + 1 : axis);
  Shape shape = first;
  shape.insert(a, static_cast<int64_t>(xs.size()));
  Tensor out = empty(shape, xs[0].dtype());
  for (size_t k = 0; k < xs.size(); ++k) copy_into(out.select(a, static_cast<int64_t>(k)), xs[k]);
  const std::vector<const Tensor*> inputs = pointers(xs);
  if (Node* n = record(stack_op, inputs, out)) n->attrs<JoinAttrs>() = {.axis = a};
  return out;
}

// ============================ split / chunk ============================
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  if (!x.defined()) throw ValueError("split: tensor is undefined");
  const int a = normalize_axis(axis, x.dim(), "split");
  if (x.dim() == 0) throw ShapeError("split: cannot split a 0-d tensor");
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw ShapeError(fmt::format("split: negative size {} in ({}) for {}", s, fmt::join(sizes, ","), x.shape()));
    total += s;
  }
  if (total != x.shape()[a])
    throw ShapeError(fmt::format("split: sizes ({}) sum to {}, but axis {} of {} has {}", fmt::join(sizes, ","), total,
                                 a, x.shape(), x.shape()[a]));
  std::vector<Tensor> out;
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(narrow(x, a, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis) {
  if (!x.defined()) throw ValueError("chunk: tensor is undefined");
  if (chunks <= 0) throw ValueError(fmt::format("chunk: number of chunks must be positive, got {} for {}", chunks, x.shape()));
  const int a = normalize_axis(axis, x.dim(), "chunk");
  if (x.dim() == 0) throw ShapeError("chunk: cannot chunk a 0-d tensor");
  // As torch.chunk: pieces of ceil(n / chunks), the last one smaller, so
  // there may be fewer than `chunks` pieces.
  const int64_t n = x.shape()[a], step = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += step) sizes.push_back(std::min(step, n - start));
  if (n == 0) sizes.assign(chunks, 0);
  return split(x, sizes, a);
}

// ============================ pad ============================
// The node keeps the padding before each axis (negative crops); the padding
// after follows from the input and output shapes.
namespace {
struct PadAttrs {
  Shape before;  // per axis of the input, outermost first
};
struct PadRegion {  // where x's kept part lands in the padded output
  Shape src_start, dst_start, len;
};
PadRegion pad_region(const Shape& in, const Shape& before, const Shape& out) {
  PadRegion r;
  for (int d = 0; d < in.size(); ++d) {
    const int64_t after = out[d] - in[d] - before[d];
    r.src_start.push_back(std::max<int64_t>(0, -before[d]));
    r.dst_start.push_back(std::max<int64_t>(0, before[d]));
    r.len.push_back(std::max<int64_t>(0, in[d] - std::max<int64_t>(0, -before[d]) - std::max<int64_t>(0, -after)));
  }
  return r;
}
Tensor region(const Tensor& t, const Shape& start, const Shape& len) {
  Tensor v = t;
  for (int d = 0; d < len.size(); ++d) v = v.narrow(d, start[d], len[d]);
  return v;
}
}  // namespace

// The adjoint of a constant pad is the opposite pad (value 0): it crops what
// was padded and zero-fills what was cropped. Being a pad again, it is
// recorded under create_graph and differentiable to any order.
static void pad_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Shape& in = n.edges[0].shape;
  std::vector<int64_t> pads;  // innermost axis first
  for (int d = in.size() - 1; d >= 0; --d) {
    const int64_t before = n.attrs<PadAttrs>().before[d], after = n.out_shape[d] - in[d] - before;
    pads.push_back(-before);
    pads.push_back(-after);
  }
  gin[0] = pad(g, pads);
}
// The tangent is the same pad of the input's tangent, with zeros.
static void pad_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Shape& in = n.edges[0].shape;
  std::vector<int64_t> pads;  // innermost axis first
  for (int d = in.size() - 1; d >= 0; --d) {
    const int64_t before = n.attrs<PadAttrs>().before[d];
    pads.push_back(before);
    pads.push_back(n.out_shape[d] - in[d] - before);
  }
  out[0] = pad(t[0], pads);
}
static const OpDef pad_op({
    .name = "pad",
    .arity = 1,
    .signature = "pad(x, pads, value): constant padding of the last axes, innermost pair first",
    .saves = saves_of<NoSaved>(),
    .backward = pad_backward,
    .tangent = pad_tangent,
    .samples = [] {
      using samples::uniform;
      return std::vector<OpSample>{
          {"(2,3) pads (1,2)", {uniform({2, 3}, 421)}, [](auto& x) { return pad(x[0], {1, 2}); }},
          {"(2,3,4) pads (0,1, 2,0) value 0.5", {uniform({2, 3, 4}, 422)}, [](auto& x) { return pad(x[0], {0, 1, 2, 0}, 0.5); }},
          {"(3,5) negative pads crop (-1,2, 1,-1)", {uniform({3, 5}, 423)}, [](auto& x) { return pad(x[0], {-1, 2, 1, -1}); }},
          {"non-contiguous (2,3) pads (1,1)", {samples::strided({2, 3}, 424)}, [](auto& x) { return pad(x[0], {1, 1}); }},
      };
    },
});

Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value) {
  const std::string_view op = pad_op.name;
  ProfileScope prof(op);
  detail::check_defined(op, x, "tensor");
  const int r = x.dim();
  if (pads.size() % 2 != 0)
    throw ValueError(
        fmt::format("{}: pads ({}) must be (before, after) pairs, got an odd count", op, fmt::join(pads, ",")));
  if (static_cast<int>(pads.size() / 2) > r)
    throw ShapeError(fmt::format("{}: pads ({}) cover {} axes but the input {} has {}", op, fmt::join(pads, ","),
                                 pads.size() / 2, x.shape(), r));
  Shape before, shape = x.shape();
  for (int d = 0; d < r; ++d) before.push_back(0);
  for (size_t k = 0; k < pads.size() / 2; ++k) {
    const int d = r - 1 - static_cast<int>(k);
    before[d] = pads[2 * k];
    shape[d] += pads[2 * k] + pads[2 * k + 1];
    if (shape[d] < 0)
      throw ShapeError(fmt::format("{}: pads ({}) make axis {} of {} negative ({})", op, fmt::join(pads, ","), d,
                                   x.shape(), shape[d]));
  }
  Tensor out = full(shape, value, x.dtype());
  const PadRegion reg = pad_region(x.shape(), before, shape);
  if (reg.len.numel() > 0) copy_into(region(out, reg.dst_start, reg.len), region(x, reg.src_start, reg.len));
  if (Node* n = record(pad_op, out, x)) n->attrs<PadAttrs>() = {.before = before};
  return out;
}

// ============================ flip ============================
// A view with negated strides on the flipped axes, copied out.
static Tensor flipped_view(const Tensor& x, const Shape& axes) {
  Shape strides = x.strides();
  int64_t offset = x.offset();
  for (int64_t a : axes) {
    const int d = static_cast<int>(a);
    if (x.shape()[d] > 0) offset += (x.shape()[d] - 1) * strides[d];
    strides[d] = -strides[d];
  }
  return make_view(x, x.shape(), strides, offset);
}
namespace {
struct FlipAttrs {
  Shape axes;  // normalised
};
}  // namespace
static void flip_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = flip(g, n.attrs<FlipAttrs>().axes.vec());
}
static const OpDef flip_op({
    .name = "flip",
    .arity = 1,
    .signature = "flip(x, axes): reverse the order along each axis",
    .saves = saves_of<NoSaved>(),
    .backward = flip_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = flip(t[0], n.attrs<FlipAttrs>().axes.vec());
    },
    .samples = [] {
      using samples::uniform;
      return std::vector<OpSample>{
          {"(3,4) axis 0", {uniform({3, 4}, 431)}, [](auto& x) { return flip(x[0], {0}); }},
          {"(2,3,4) axes (-1,0)", {uniform({2, 3, 4}, 432)}, [](auto& x) { return flip(x[0], {-1, 0}); }},
          {"non-contiguous (3,2) axis 1", {samples::strided({3, 2}, 433)}, [](auto& x) { return flip(x[0], {1}); }},
      };
    },
});

Tensor flip(const Tensor& x, const std::vector<int64_t>& axes) {
  const std::string_view op = flip_op.name;
  ProfileScope prof(op);
  detail::check_defined(op, x, "tensor");
  Shape norm;
  for (int64_t a : axes) {
    const int d = normalize_axis(a, x.dim(), "flip");
    if (std::find(norm.begin(), norm.end(), d) != norm.end())
      throw ShapeError(fmt::format("{}: axis {} repeated in ({}) for {}", op, d, fmt::join(axes, ","), x.shape()));
    norm.push_back(d);
  }
  if (x.dim() == 0) norm = Shape();
  Tensor out = empty(x.shape(), x.dtype());
  copy_into(out, flipped_view(x, norm));
  if (Node* n = record(flip_op, out, x)) n->attrs<FlipAttrs>() = {.axes = norm};
  return out;
}

// ============================ triu / tril ============================
// Keeps x[..., i, j] where j - i >= diagonal (triu) or j - i <= diagonal
// (tril), zero elsewhere; backward applies the same mask to the gradient.
namespace {
struct TriangleAttrs {
  int64_t diagonal;
};
}  // namespace
template <bool Upper>
static Tensor triangle(const Tensor& x, int64_t diagonal, std::string_view op) {
  detail::check_defined(op, x, "tensor");
  if (x.dim() < 2) throw ShapeError(fmt::format("{}: needs at least 2 dimensions, got {}", op, x.shape()));
  Tensor xc;
  {
    NoGradGuard ng;
    xc = x.contiguous();
  }
  Tensor out = empty(x.shape(), x.dtype());
  const int64_t R = x.shape()[x.dim() - 2], C = x.shape().back(), M = R * C;
  const int64_t mats = M == 0 ? 0 : x.numel() / M;
  TG_DISPATCH_ALL(x.dtype(), op, [&] {
    const scalar_t* src = xc.data<scalar_t>();
    scalar_t* dst = out.data<scalar_t>();
    parallel_for(mats * R, detail::row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t i = row % R;
        // Columns [0, split) and [split, C): one side kept, the other zeroed.
        const int64_t split = std::clamp<int64_t>(Upper ? i + diagonal : i + diagonal + 1, 0, C);
        const scalar_t* s = src + row * C;
        scalar_t* d = dst + row * C;
        for (int64_t j = 0; j < C; ++j) d[j] = (j < split) != Upper ? s[j] : scalar_t(0);
      }
    });
  });
  return out;
}
static void triu_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = triu(g, n.attrs<TriangleAttrs>().diagonal);
}
static void tril_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = tril(g, n.attrs<TriangleAttrs>().diagonal);
}
// Masking is its own adjoint: the tangent is the same triangle of the input's.
static void triu_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = triu(t[0], n.attrs<TriangleAttrs>().diagonal);
}
static void tril_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = tril(t[0], n.attrs<TriangleAttrs>().diagonal);
}
template <bool Upper>
static std::vector<OpSample> triangle_samples() {
  using samples::uniform;
  auto op = Upper ? triu : tril;
  auto on = [op](int64_t diag) { return [op, diag](const std::vector<Tensor>& x) { return op(x[0], diag); }; };
  return {
      {"(4,4) diagonal 0", {uniform({4, 4}, 441)}, on(0)},
      {"(2,3,5) diagonal 1", {uniform({2, 3, 5}, 442)}, on(1)},
      {"(4,3) diagonal -1", {uniform({4, 3}, 443)}, on(-1)},
      {"non-contiguous (3,3) diagonal 0", {samples::strided({3, 3}, 444)}, on(0)},
  };
}
static const OpDef triu_op({.name = "triu", .arity = 1,
                            .signature = "triu(x, diagonal): upper triangle of the last two axes",
                            .saves = saves_of<NoSaved>(), .backward = triu_backward, .tangent = triu_tangent,
                            .samples = triangle_samples<true>});
static const OpDef tril_op({.name = "tril", .arity = 1,
                            .signature = "tril(x, diagonal): lower triangle of the last two axes",
                            .saves = saves_of<NoSaved>(), .backward = tril_backward, .tangent = tril_tangent,
                            .samples = triangle_samples<false>});

Tensor triu(const Tensor& x, int64_t diagonal) {
  ProfileScope prof(triu_op.name);
  Tensor out = triangle<true>(x, diagonal, triu_op.name);
  if (Node* n = record(triu_op, out, x)) n->attrs<TriangleAttrs>() = {.diagonal = diagonal};
  return out;
}
Tensor tril(const Tensor& x, int64_t diagonal) {
  ProfileScope prof(tril_op.name);
  Tensor out = triangle<false>(x, diagonal, tril_op.name);
  if (Node* n = record(tril_op, out, x)) n->attrs<TriangleAttrs>() = {.diagonal = diagonal};
  return out;
}

}  // namespace tg
