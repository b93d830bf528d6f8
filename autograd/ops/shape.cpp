// Copying shape ops (shape.h): copies go through Tensor::copy_ (loop.h's strided
// loop, vectorised and threaded); each backward is the matching copy back.
#include "autograd/ops/shape.h"

#include <algorithm>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

using samples::strided, samples::uniform;

// out[...] = src, without recording (the op records itself).
void copy_into(const Tensor& out, const Tensor& src) {
  NoGradGuard ng;
  out.copy_(src);
}

// Shared checks of concat and stack: a non-empty list of defined tensors of
// one dtype. Their errors describe(xs), the list's shapes, only when thrown.
void check_list(const std::vector<Tensor>& xs, std::string_view op) {
  if (xs.empty()) throw ValueError(fmt::format("{}: needs at least one tensor, got an empty list", op));
  for (size_t k = 0; k < xs.size(); ++k)
    if (!xs[k].defined()) throw ValueError(fmt::format("{}: tensor {} of the list is undefined", op, k));
  for (const Tensor& x : xs)
    if (x.dtype() != xs[0].dtype())
      throw DTypeError(fmt::format("{}: tensors have different dtypes: {}", op, describe(xs)));
}

// concat's and stack's axis (normalised); stack's is new.
struct JoinAttrs {
  int64_t axis;
  bool stacked;
};
struct PadAttrs {
  Shape before;  // per input axis (< 0 crops); after follows from the shapes
};
struct FlipAttrs {
  Shape axes;  // normalised
};
struct TriangleAttrs {
  int64_t diagonal;
};

// Copies xs into out (of the joined shape) along axis a, concat's inputs
// taking their extents in turn and stack's one index each, and records op.
Tensor join(const OpDef& op, const std::vector<Tensor>& xs, int a, const Shape& shape, bool stacked) {
  Tensor out = empty(shape, xs[0].dtype());
  std::vector<const Tensor*> inputs;
  int64_t start = 0;
  for (const Tensor& x : xs) {
    const int64_t len = stacked ? 1 : x.shape()[a];
    if (len > 0) copy_into(stacked ? out.select(a, start) : out.narrow(a, start, len), x);
    inputs.push_back(&x);
    start += len;
  }
  if (Node* n = record(op, inputs, out)) n->attrs<JoinAttrs>() = {.axis = a, .stacked = stacked};
  return out;
}

}  // namespace

// Each input's gradient is its part of the output's, taken the same way.
static void join_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const JoinAttrs& j = n.attrs<JoinAttrs>();
  int64_t start = 0;
  for (size_t k = 0; k < n.edges.size(); ++k) {
    const int64_t len = j.stacked ? 1 : n.edges[k].shape[j.axis];
    if (n.needs(k)) gin[k] = (j.stacked ? select(g, j.axis, start) : narrow(g, j.axis, start, len)).contiguous();
    start += len;
  }
}
// The tangent joins the input tangents, zeros where one is zero.
static void join_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  std::vector<Tensor> parts;
  for (size_t k = 0; k < n.edges.size(); ++k)
    parts.push_back(t[k].defined() ? t[k] : zeros(n.edges[k].shape, n.out_dtype));
  const JoinAttrs& j = n.attrs<JoinAttrs>();
  out[0] = j.stacked ? stack(parts, j.axis) : concat(parts, j.axis);
}

// ============================ concat ============================
static const OpDef concat_op({
    .name = "concat",
    .arity = -1,
    .signature = "concat(xs, axis): join along an existing axis",
    .saves = saves_of<NoSaved>(),
    .backward = join_backward,
    .tangent = join_tangent,
    .samples = [] {
      auto on = [](int64_t axis) { return [axis](auto& x) { return concat(x, axis); }; };
      return std::vector<OpSample>{
          {"(2,3) and (4,3) axis 0", {uniform({2, 3}, 401), uniform({4, 3}, 402)}, on(0)},
          {"three (2,1,3), (2,2,3), (2,3,3) axis 1",
           {uniform({2, 1, 3}, 403), uniform({2, 2, 3}, 404), uniform({2, 3, 3}, 405)}, on(1)},
          {"non-contiguous (3,2) with (3,1) axis -1", {strided({3, 2}, 406), uniform({3, 1}, 407)}, on(-1)},
      };
    },
});

Tensor concat(const std::vector<Tensor>& xs, int64_t axis) {
  const std::string_view op = concat_op.name;
  ProfileScope prof(op);
  check_list(xs, op);
  const Shape& first = xs[0].shape();
  if (first.empty()) throw ShapeError(fmt::format("{}: cannot concatenate 0-d tensors: {}", op, describe(xs)));
  const int a = normalize_axis(axis, first.size(), "concat");
  Shape shape = first;
  shape[a] = 0;
  for (const Tensor& x : xs) {
    bool same = x.dim() == first.size();
    for (int d = 0; same && d < first.size(); ++d) same = d == a || x.shape()[d] == first[d];
    if (!same)
      throw ShapeError(fmt::format("{}: along axis {} every other dimension must match, got {}", op, a, describe(xs)));
    shape[a] += x.shape()[a];
  }
  return join(concat_op, xs, a, shape, false);
}

// ============================ stack ============================
static const OpDef stack_op({
    .name = "stack",
    .arity = -1,
    .signature = "stack(xs, axis): join along a new axis",
    .saves = saves_of<NoSaved>(),
    .backward = join_backward,
    .tangent = join_tangent,
    .samples = [] {
      auto on = [](int64_t axis) { return [axis](auto& x) { return stack(x, axis); }; };
      return std::vector<OpSample>{
          {"two (2,3) axis 0", {uniform({2, 3}, 411), uniform({2, 3}, 412)}, on(0)},
          {"three (3,2) axis -1", {uniform({3, 2}, 413), strided({3, 2}, 414), uniform({3, 2}, 415)}, on(-1)},
          {"two () axis 0", {uniform({}, 416), uniform({}, 417)}, on(0)},
      };
    },
});

Tensor stack(const std::vector<Tensor>& xs, int64_t axis) {
  const std::string_view op = stack_op.name;
  ProfileScope prof(op);
  check_list(xs, op);
  const Shape& first = xs[0].shape();
  for (const Tensor& x : xs)
    if (!(x.shape() == first))
      throw ShapeError(fmt::format("{}: every tensor must have the same shape, got {}", op, describe(xs)));
  const int r = first.size();
  if (axis < -(r + 1) || axis > r)
    throw IndexError(fmt::format("{}: axis {} is out of range for tensors of rank {} ({})", op, axis, r, describe(xs)));
  const int a = static_cast<int>(axis < 0 ? axis + r + 1 : axis);
  Shape shape = first;
  shape.insert(a, xs.size());
  return join(stack_op, xs, a, shape, true);
}

// ============================ split / chunk ============================
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t axis) {
  if (!x.defined()) throw ValueError("split: tensor is undefined");
  const int a = normalize_axis(axis, x.dim(), "split");
  if (x.dim() == 0) throw ShapeError("split: cannot split a 0-d tensor");
  std::vector<Tensor> out;
  int64_t start = 0;  // slices, unchecked: a wrong sum throws below
  for (int64_t s : sizes) {
    if (s < 0)
      throw ShapeError(fmt::format("split: negative size {} in ({}) for {}", s, fmt::join(sizes, ","), x.shape()));
    out.push_back(slice(x, a, start, start + s));
    start += s;
  }
  if (start != x.shape()[a])
    throw ShapeError(fmt::format("split: sizes ({}) sum to {}, but axis {} of {} has {}", fmt::join(sizes, ","), start,
                                 a, x.shape(), x.shape()[a]));
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t axis) {
  if (!x.defined()) throw ValueError("chunk: tensor is undefined");
  if (chunks <= 0)
    throw ValueError(fmt::format("chunk: number of chunks must be positive, got {} for {}", chunks, x.shape()));
  const int a = normalize_axis(axis, x.dim(), "chunk");
  if (x.dim() == 0) throw ShapeError("chunk: cannot chunk a 0-d tensor");
  // As torch.chunk: pieces of ceil(n / chunks), the last smaller (maybe fewer pieces).
  const int64_t n = x.shape()[a], step = std::max<int64_t>(1, (n + chunks - 1) / chunks);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < n; start += step) sizes.push_back(std::min(step, n - start));
  if (n == 0) sizes.assign(chunks, 0);
  return split(x, sizes, a);
}

// ============================ pad ============================
// The node's pads, innermost axis first (sign 1: the tangent's), or (sign -1)
// the adjoint's: the opposite pad crops what was padded and zero-fills what was
// cropped, and is recorded under create_graph like any pad.
static std::vector<int64_t> node_pads(const Node& n, int64_t sign) {
  const Shape& in = n.edges[0].shape;
  std::vector<int64_t> pads;
  for (int d = in.size() - 1; d >= 0; --d) {
    const int64_t before = n.attrs<PadAttrs>().before[d];
    pads.insert(pads.end(), {sign * before, sign * (n.out_shape[d] - in[d] - before)});
  }
  return pads;
}
static void pad_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = pad(g, node_pads(n, -1));
}
static const OpDef pad_op({
    .name = "pad",
    .arity = 1,
    .signature = "pad(x, pads, value): constant padding of the last axes, innermost pair first",
    .saves = saves_of<NoSaved>(),
    .backward = pad_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = pad(t[0], node_pads(n, 1));
    },
    .samples = [] {
      auto on = [](std::vector<int64_t> pads, double value = 0.0) {
        return [=](auto& x) { return pad(x[0], pads, value); };
      };
      return std::vector<OpSample>{
          {"(2,3) pads (1,2)", {uniform({2, 3}, 421)}, on({1, 2})},
          {"(2,3,4) pads (0,1, 2,0) value 0.5", {uniform({2, 3, 4}, 422)}, on({0, 1, 2, 0}, 0.5)},
          {"(3,5) negative pads crop (-1,2, 1,-1)", {uniform({3, 5}, 423)}, on({-1, 2, 1, -1})},
          {"non-contiguous (2,3) pads (1,1)", {strided({2, 3}, 424)}, on({1, 1})},
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
  Tensor out = value == 0 ? zeros(shape, x.dtype()) : full(shape, value, x.dtype());  // zeros: parallel
  Shape len = shape;  // x's kept part, at src in x and dst in out
  int64_t src = x.offset(), dst = 0;
  for (int d = 0; d < r; ++d) {
    const int64_t lo = std::max<int64_t>(0, -before[d]);  // cropped before
    const int64_t hi = std::max<int64_t>(0, before[d] + x.shape()[d] - shape[d]);  // cropped after
    len[d] = std::max<int64_t>(0, x.shape()[d] - lo - hi);
    src += lo * x.strides()[d];
    dst += std::max<int64_t>(0, before[d]) * out.strides()[d];
  }
  if (len.numel() > 0) copy_into(make_view(out, len, out.strides(), dst), make_view(x, len, x.strides(), src));
  if (Node* n = record(pad_op, out, x)) n->attrs<PadAttrs>() = {.before = before};
  return out;
}

// ============================ flip ============================
// A permutation that is its own inverse, so its own adjoint (self_adjoint).
static void flip_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = flip(g, n.attrs<FlipAttrs>().axes.vec());
}
static const OpDef flip_op({
    .name = "flip",
    .arity = 1,
    .signature = "flip(x, axes): reverse the order along each axis",
    .saves = saves_of<NoSaved>(),
    .backward = flip_backward,
    .self_adjoint = true,
    .samples = [] {
      return std::vector<OpSample>{
          {"(3,4) axis 0", {uniform({3, 4}, 431)}, [](auto& x) { return flip(x[0], {0}); }},
          {"(2,3,4) axes (-1,0)", {uniform({2, 3, 4}, 432)}, [](auto& x) { return flip(x[0], {-1, 0}); }},
          {"non-contiguous (3,2) axis 1", {strided({3, 2}, 433)}, [](auto& x) { return flip(x[0], {1}); }},
      };
    },
});

Tensor flip(const Tensor& x, const std::vector<int64_t>& axes) {
  const std::string_view op = flip_op.name;
  ProfileScope prof(op);
  detail::check_defined(op, x, "tensor");
  Shape norm, strides = x.strides();
  int64_t offset = x.offset();  // of x with negated strides on the flipped axes
  for (int64_t a : axes) {
    const int d = normalize_axis(a, x.dim(), "flip");
    if (std::find(norm.begin(), norm.end(), d) != norm.end())
      throw ShapeError(fmt::format("{}: axis {} repeated in ({}) for {}", op, d, fmt::join(axes, ","), x.shape()));
    norm.push_back(d);
    if (x.dim() == 0) continue;  // a scalar flips to itself
    offset += std::max<int64_t>(0, x.shape()[d] - 1) * strides[d];
    strides[d] = -strides[d];
  }
  Tensor out = empty(x.shape(), x.dtype());
  copy_into(out, make_view(x, x.shape(), strides, offset));
  if (Node* n = record(flip_op, out, x)) n->attrs<FlipAttrs>() = {.axes = norm};
  return out;
}

// ============================ triu / tril ============================
// Keeps x[..., i, j] where j - i >= diagonal (triu) or <= diagonal (tril), zero
// elsewhere: a mask, so its own adjoint (self_adjoint).
template <bool Upper>
static void triangle_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = (Upper ? triu : tril)(g, n.attrs<TriangleAttrs>().diagonal);
}
template <bool Upper>
static std::vector<OpSample> triangle_samples() {
  auto op = Upper ? triu : tril;
  auto on = [op](int64_t diag) { return [op, diag](const std::vector<Tensor>& x) { return op(x[0], diag); }; };
  return {
      {"(4,4) diagonal 0", {uniform({4, 4}, 441)}, on(0)},
      {"(2,3,5) diagonal 1", {uniform({2, 3, 5}, 442)}, on(1)},
      {"(4,3) diagonal -1", {uniform({4, 3}, 443)}, on(-1)},
      {"non-contiguous (3,3) diagonal 0", {strided({3, 3}, 444)}, on(0)},
  };
}
static const OpDef triu_op({.name = "triu", .arity = 1,
                            .signature = "triu(x, diagonal): upper triangle of the last two axes",
                            .saves = saves_of<NoSaved>(), .backward = triangle_backward<true>, .self_adjoint = true,
                            .samples = triangle_samples<true>});
static const OpDef tril_op({.name = "tril", .arity = 1,
                            .signature = "tril(x, diagonal): lower triangle of the last two axes",
                            .saves = saves_of<NoSaved>(), .backward = triangle_backward<false>, .self_adjoint = true,
                            .samples = triangle_samples<false>});

template <bool Upper>
static Tensor triangle(const OpDef& op, const Tensor& x, int64_t diagonal) {
  ProfileScope prof(op.name);
  detail::check_defined(op.name, x, "tensor");
  if (x.dim() < 2) throw ShapeError(fmt::format("{}: needs at least 2 dimensions, got {}", op.name, x.shape()));
  const int64_t R = x.shape()[x.dim() - 2], C = x.shape().back();
  Tensor out;
  {
    NoGradGuard ng;  // j - i, (R, C), broadcast over the leading axes
    const Tensor j_i = sub(arange(C), arange(R).reshape({R, 1})), d = scalar(diagonal, DType::i64);
    out = masked_fill(x, Upper ? lt(j_i, d) : gt(j_i, d), 0.0);
  }
  if (Node* n = record(op, out, x)) n->attrs<TriangleAttrs>() = {.diagonal = diagonal};
  return out;
}
Tensor triu(const Tensor& x, int64_t diagonal) { return triangle<true>(triu_op, x, diagonal); }
Tensor tril(const Tensor& x, int64_t diagonal) { return triangle<false>(tril_op, x, diagonal); }

}  // namespace tg
