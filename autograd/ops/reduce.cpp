// Reductions. One kernel shape serves them all: the input is viewed as
// (outer, reduced, inner) when the reduced axes are adjacent, which covers
// last-axis reductions (rows), leading-axis reductions (bias gradients) and
// sum_to; other axis sets are permuted to the end first.
#include "autograd/ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/pointwise.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_floating, samples::strided, samples::uniform;
namespace {

// Normalised, sorted, unique axes; empty input means every axis.
Shape reduce_axes(const Tensor& x, const Axes& axes, const char* op) {
  Shape out;
  for (int64_t a : axes) out.push_back(normalize_axis(a, x.dim(), op));
  for (int d = 0; axes.empty() && d < x.dim(); ++d) out.push_back(d);
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw ShapeError(fmt::format("{}: repeated axis in the reduction axes", op));
  return x.dim() == 0 ? Shape() : out;
}

// in without the reduced axes, or with them as size 1 (keepdim, so that a
// result broadcasts against x in backward).
Shape reduced_shape(const Shape& in, const Shape& axes, bool keepdim) {
  Shape out;
  for (int d = 0; d < in.size(); ++d) {
    const bool reduced = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!reduced || keepdim) out.push_back(reduced ? 1 : in[d]);
  }
  return out;
}

// x as that contiguous (outer, n, inner) block, the reduced axes moved last (a
// copy) when not adjacent, or not last for `rows` (inner = 1); order: the permutation.
struct Block {
  Tensor x;
  detail::AxisView v;
  Shape order;
};
Block block(const Tensor& x, const Shape& axes, bool rows) {
  const int r = x.dim(), k = axes.size();
  const bool move = k > 0 && (axes.back() - axes[0] + 1 != k || (rows && axes.back() != r - 1));
  Block b;
  for (int d = 0; d < r; ++d)
    if (!move || std::find(axes.begin(), axes.end(), d) == axes.end()) b.order.push_back(d);
  if (move)
    for (int64_t d : axes) b.order.push_back(d);
  NoGradGuard ng;
  b.x = (move ? permute(x, b.order) : x).contiguous();
  int first = move ? r - k : r;  // of the reduced axes in b.x
  if (!move && k > 0) first = static_cast<int>(axes[0]);
  b.v = detail::axis_view(b.x.shape(), first, first + k - 1);
  return b;
}

// out[o, i] = sum_r x[o, r, i], parallel over outer x inner.
template <class T>
void sum_blocked(const Block& b, T* out) {
  const T* x = b.x.data<T>();
  const int64_t R = b.v.n, I = b.v.inner;
  if (I == 1) {
    parallel_for(b.v.outer, detail::row_grain(R), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const T* row = x + o * R;
        T acc[8] = {};
        int64_t r = 0;
        for (; r + 8 <= R; r += 8)
          for (int k = 0; k < 8; ++k) acc[k] += row[r + k];
        T s = 0;
        for (; r < R; ++r) s += row[r];
        for (int k = 0; k < 8; ++k) s += acc[k];
        out[o] = s;
      }
    });
    return;
  }
  parallel_for(b.v.outer * I, detail::kElementwiseGrain / std::max<int64_t>(R, 1) + 1, [&](int64_t c0, int64_t c1) {
    // Chunks of output columns; each accumulates the R rows it covers.
    for (int64_t c = c0; c < c1;) {
      const int64_t o = c / I, i0 = c % I, i1 = std::min(I, i0 + (c1 - c));
      T* dst = out + o * I;
      for (int64_t i = i0; i < i1; ++i) dst[i] = 0;
      for (int64_t r = 0; r < R; ++r) {
        const T* src = x + (o * R + r) * I;
        for (int64_t i = i0; i < i1; ++i) dst[i] += src[i];
      }
      c += i1 - i0;
    }
  });
}

// f(o) for every row o of a rows block (inner = 1), in parallel.
template <class F>
void for_rows(const Block& b, F f) {
  parallel_for(b.v.outer, detail::row_grain(b.v.n), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) f(o);
  });
}
// f(row, R) for each row of b (var, logsumexp), into a float tensor of shape.
template <class F>
Tensor reduce_rows(std::string_view op, const Block& b, const Shape& shape, F f) {
  Tensor out = empty(shape, b.x.dtype());
  dispatch_float(b.x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = b.x.data<T>();
    T* po = out.data<T>();
    for_rows(b, [&](int64_t o) { po[o] = f(px + o * b.v.n, b.v.n); });
  });
  return out;
}

// sum, var, logsumexp: the reduced axes, normalised and sorted.
struct ReduceAttrs {
  Shape axes;
};

}  // namespace

// ============================ sum ============================
// Puts the reduced axes back as size-1 dims, then broadcasts.
static void sum_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Shape& in = n.edges[0].shape;
  gin[0] = expand(reshape(g, reduced_shape(in, n.attrs<ReduceAttrs>().axes, true)), in).contiguous();
}
static void sum_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = reshape(sum(t[0], n.attrs<ReduceAttrs>().axes.vec()), n.out_shape);
}
static const OpDef sum_op({
    .name = "sum",
    .arity = 1,
    .signature = "sum(x, axes, keepdim)",
    .saves = saves_of<NoSaved>(),
    .backward = sum_backward,
    .tangent = sum_tangent,
    .samples = [] {
      return std::vector<OpSample>{
          {"all of (3,4)", {uniform({3, 4}, 201)}, [](auto& x) { return sum(x[0]); }},
          {"axis -1 of (2,3,4)", {uniform({2, 3, 4}, 202)}, [](auto& x) { return sum(x[0], {-1}); }},
          {"axes {0,2} keepdim of (2,3,4)",
           {uniform({2, 3, 4}, 203)},
           [](auto& x) { return sum(x[0], {0, 2}, true); }},
          {"axis 0 of non-contiguous (4,3)", {strided({4, 3}, 204)}, [](auto& x) { return sum(x[0], {0}); }},
      };
    },
});
Tensor sum(const Tensor& x, const Axes& axes, bool keepdim) {
  ProfileScope prof(sum_op.name);
  detail::check_defined(sum_op.name, x, "tensor");
  const Shape ax = reduce_axes(x, axes, "sum");
  Tensor out = empty(reduced_shape(x.shape(), ax, keepdim), x.dtype());
  const Block b = block(x, ax, false);
  TG_DISPATCH_ARITH(x.dtype(), sum_op.name, [&] { sum_blocked<scalar_t>(b, out.data<scalar_t>()); });
  if (Node* n = record(sum_op, out, x)) n->attrs<ReduceAttrs>().axes = ax;
  return out;
}

Tensor mean(const Tensor& x, const Axes& axes, bool keepdim) {
  check_floating("mean", x, "tensor");
  int64_t count = 1;
  for (int64_t a : reduce_axes(x, axes, "mean")) count *= x.shape()[static_cast<int>(a)];
  return mul(sum(x, axes, keepdim), 1.0 / static_cast<double>(std::max<int64_t>(count, 1)));
}

// ============================ sum_to ============================
Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int r = x.dim(), n = shape.size();
  if (n > r) throw ShapeError(fmt::format("sum_to: cannot reduce {} to the larger rank {}", x.shape(), shape));
  Axes axes;
  for (int d = 0; d < r; ++d) {
    const int sd = d - (r - n);
    if (sd < 0 || (shape[sd] == 1 && x.shape()[d] != 1))
      axes.push_back(d);
    else if (shape[sd] != x.shape()[d])
      throw ShapeError(fmt::format("sum_to: cannot reduce {} to {}", x.shape(), shape));
  }
  if (axes.empty()) return reshape(x, shape);
  return reshape(sum(x, axes, true), shape);
}

// ============================ var / std ============================
// var = sum((x - mean)^2) / (N - correction), two passes for accuracy; grad
// x = g * 2 (x - mean) / (N - correction), the mean recomputed by mean() so
// that the second derivative goes through it.
namespace {
struct VarAttrs {
  Shape axes;    // reduced, normalised and sorted
  double denom;  // N - correction
};
struct VarSaved {
  Tensor x;
  static constexpr std::tuple fields{saved_field("x", &VarSaved::x)};
};
}  // namespace
static void var_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const VarAttrs& attrs = n.attrs<VarAttrs>();
  const Tensor x = n.saved_tensor(&VarSaved::x);
  const Tensor mu = mean(x, attrs.axes.vec(), true);
  gin[0] = mul(mul(reshape(g, mu.shape()), 2.0 / attrs.denom), sub(x, mu));
}
static const OpDef var_op({
    .name = "var",
    .arity = 1,
    .signature = "var(x, axes, correction, keepdim)",
    .saves = saves_of<VarSaved>(),
    .backward = var_backward,
    .samples = [] {
      return std::vector<OpSample>{
          {"all of (3,4)", {uniform({3, 4}, 211)}, [](auto& x) { return var(x[0]); }},
          {"axis -1 of (2,3,4)", {uniform({2, 3, 4}, 212)}, [](auto& x) { return var(x[0], {-1}); }},
          {"axes {0,2} keepdim, correction 0",
           {uniform({2, 3, 4}, 213)},
           [](auto& x) { return var(x[0], {0, 2}, 0, true); }},
          {"axis 0 of non-contiguous (4,3)", {strided({4, 3}, 214)}, [](auto& x) { return var(x[0], {0}); }},
          {"std over axis 1 of (3,5)", {uniform({3, 5}, 215)}, [](auto& x) { return tg::std(x[0], {1}); }},
      };
    },
});
Tensor var(const Tensor& x, const Axes& axes, int64_t correction, bool keepdim) {
  const std::string_view op = var_op.name;
  ProfileScope prof(op);
  check_floating(op, x, "tensor");
  if (correction < 0) throw ValueError(fmt::format("{}: correction must be >= 0, got {}", op, correction));
  const Shape ax = reduce_axes(x, axes, "var");
  const Block b = block(x, ax, true);
  const double denom = static_cast<double>(b.v.n - correction);
  Tensor out = reduce_rows(op, b, reduced_shape(x.shape(), ax, keepdim), [&]<class T>(const T* row, int64_t R) {
    T s = 0, ss = 0;
    for (int64_t k = 0; k < R; ++k) s += row[k];
    const T m = s / static_cast<T>(R);
    for (int64_t k = 0; k < R; ++k) ss += (row[k] - m) * (row[k] - m);
    return ss / static_cast<T>(denom);
  });
  if (Node* n = record(var_op, out, x)) {
    n->attrs<VarAttrs>() = {.axes = ax, .denom = denom};
    n->save(VarSaved{.x = x});
  }
  return out;
}

// std = sqrt(var): its gradient comes from var's and sqrt's, both checked.
Tensor std(const Tensor& x, const Axes& axes, int64_t correction, bool keepdim) {
  return sqrt(var(x, axes, correction, keepdim));
}

// ============================ logsumexp ============================
// out = m + log(sum(exp(x - m))) with m the row max, so logits of +-1e4 do
// not overflow. grad x = g * exp(x - out), with out and g viewed with keepdim;
// recorded (create_graph) through the saved output, so the second derivative
// reaches x through out as well.
namespace {
struct LogsumexpSaved {
  Tensor x, output;
  static constexpr std::tuple fields{
      saved_field("x", &LogsumexpSaved::x), saved_field("output", &LogsumexpSaved::output)};
};
}  // namespace
static void logsumexp_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(&LogsumexpSaved::x);
  const Shape kept = reduced_shape(n.edges[0].shape, n.attrs<ReduceAttrs>().axes, true);
  const Tensor lse = reshape(n.saved_tensor(&LogsumexpSaved::output), kept), gk = reshape(g, kept);
  gin[0] = detail::pointwise(
      n.op->name, [](auto xv, auto l, auto gv) { return gv * detail::math::exp(xv - l); }, x, lse, gk);
}
static const OpDef logsumexp_op({
    .name = "logsumexp",
    .arity = 1,
    .signature = "logsumexp(x, axes, keepdim)",
    .saves = saves_of<LogsumexpSaved>(),
    .backward = logsumexp_backward,
    .samples = [] {
      return std::vector<OpSample>{
          {"axis -1 of (3,4)", {uniform({3, 4}, 221, -3, 3)}, [](auto& x) { return logsumexp(x[0], {-1}); }},
          {"axes {0,2} keepdim of (2,3,4)",
           {uniform({2, 3, 4}, 222, -3, 3)},
           [](auto& x) { return logsumexp(x[0], {0, 2}, true); }},
          {"all of non-contiguous (3,2)",
           {strided({3, 2}, 223, -3, 3)},
           [](auto& x) { return logsumexp(x[0], {}); }},
      };
    },
});
Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdim) {
  const std::string_view op = logsumexp_op.name;
  ProfileScope prof(op);
  check_floating(op, x, "tensor");
  const Shape ax = reduce_axes(x, axes, "logsumexp");
  const Block b = block(x, ax, true);
  Tensor out = reduce_rows(op, b, reduced_shape(x.shape(), ax, keepdim), []<class T>(const T* row, int64_t R) {
    T m = -std::numeric_limits<T>::infinity(), s = 0;
    for (int64_t k = 0; k < R; ++k) m = row[k] > m ? row[k] : m;
    if (!std::isfinite(m)) m = 0;  // all -inf: exp(x - 0) sums to 0, log gives -inf
    for (int64_t k = 0; k < R; ++k) s += std::exp(row[k] - m);
    return m + std::log(s);
  });
  if (Node* n = record(logsumexp_op, out, x)) {
    n->attrs<ReduceAttrs>() = {.axes = ax};
    n->save(LogsumexpSaved{.x = x, .output = out});
  }
  return out;
}

// ============================ max / min / argmax / argmin ============================
// Gradient of max/min: g at the chosen element of each row, zero elsewhere: a
// scatter of g into zeros (rows, R), differentiable again, permuted back.
namespace {
struct ExtremeAttrs {
  Shape order;  // Block::order: x's axes, the reduced ones last
};
struct ExtremeSaved {
  Tensor indices;  // int64 positions within each row, reduced_shape(keepdim)
  static constexpr std::tuple fields{saved_field("indices", &ExtremeSaved::indices)};
};
void extreme_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor idx = n.saved_tensor(&ExtremeSaved::indices);
  const Shape& in = n.edges[0].shape;
  const Shape& order = n.attrs<ExtremeAttrs>().order;
  const int64_t rows = idx.numel(), R = rows ? in.numel() / rows : 0;
  Shape permuted;  // x's shape with the reduced axes last
  for (int64_t d : order) permuted.push_back(in[static_cast<int>(d)]);
  const Tensor gr = scatter(zeros({rows, R}, g.dtype()), 1, reshape(idx, {rows, 1}), reshape(g, {rows, 1}));
  gin[0] = detail::unpermute(reshape(gr, permuted), order);
}

std::vector<OpSample> extreme_samples(Tensor (*axis_fn)(const Tensor&, int64_t, bool),
                                      Tensor (*all_fn)(const Tensor&)) {
  return {  // continuous random values: no ties
      {"axis 1 of (3,4)", {uniform({3, 4}, 231)}, [axis_fn](auto& x) { return axis_fn(x[0], 1, false); }},
      {"axis 0 keepdim of (2,3,4)", {uniform({2, 3, 4}, 232)}, [axis_fn](auto& x) { return axis_fn(x[0], 0, true); }},
      {"axis -1 of non-contiguous (2,3)",
       {strided({2, 3}, 233)},
       [axis_fn](auto& x) { return axis_fn(x[0], -1, false); }},
      {"all of (3,4)", {uniform({3, 4}, 234)}, [all_fn](auto& x) { return all_fn(x[0]); }},
  };
}
}  // namespace

static const OpDef max_op({.name = "max", .arity = 1, .signature = "max(x, axis, keepdim) / max(x)",
                           .saves = saves_of<ExtremeSaved>(), .backward = extreme_backward,
                           .samples = [] { return extreme_samples(max, max); }});
static const OpDef min_op({.name = "min", .arity = 1, .signature = "min(x, axis, keepdim) / min(x)",
                           .saves = saves_of<ExtremeSaved>(), .backward = extreme_backward,
                           .samples = [] { return extreme_samples(min, min); }});

// max/min (the values) or, with `arg`, argmax/argmin (int64 indices) over
// *axis, or all axes when axis is null: the first extreme element of each
// row, NaN counting as extreme (as PyTorch).
template <bool Max>
static Tensor extreme(const Tensor& x, const int64_t* axis, bool keepdim, bool arg) {
  const char* op = arg ? (Max ? "argmax" : "argmin") : (Max ? "max" : "min");
  ProfileScope prof(op);
  detail::check_defined(op, x, "tensor");
  if (!axis && x.numel() == 0)
    throw ValueError(fmt::format("{}: cannot reduce an empty tensor {}", op, x.shape()));
  Shape ax;  // every axis, or *axis (none for a 0-d x)
  if (!axis)
    ax = reduce_axes(x, {}, op);
  else if (x.dim() > 0)
    ax.push_back(normalize_axis(*axis, x.dim(), op));
  const Block b = block(x, ax, true);
  const int64_t R = b.v.n;
  if (R == 0 && b.v.outer > 0) throw ValueError(fmt::format("{}: cannot reduce an empty axis of {}", op, x.shape()));
  const Shape out_shape = reduced_shape(x.shape(), ax, keepdim);
  Tensor values = empty(out_shape, x.dtype()), indices = empty(out_shape, DType::i64);
  int64_t* pi = indices.data<int64_t>();
  TG_DISPATCH_ALL(x.dtype(), op, [&] {
    const scalar_t* px = b.x.data<scalar_t>();
    scalar_t* pv = values.data<scalar_t>();
    for_rows(b, [&](int64_t o) {
      const scalar_t* row = px + o * R;
      scalar_t best = row[0];
      int64_t at = 0;
      for (int64_t k = 1; k < R && best == best; ++k) {  // NaN: already the answer
        if ((Max ? row[k] > best : row[k] < best) || row[k] != row[k]) {
          best = row[k];
          at = k;
        }
      }
      pv[o] = best;
      pi[o] = at;
    });
  });
  if (arg) return indices;
  if (Node* n = record(Max ? max_op : min_op, values, x)) {
    n->attrs<ExtremeAttrs>() = {.order = b.order};
    n->save(ExtremeSaved{.indices = indices});
  }
  return values;
}

Tensor max(const Tensor& x, int64_t axis, bool keepdim) { return extreme<true>(x, &axis, keepdim, false); }
Tensor min(const Tensor& x, int64_t axis, bool keepdim) { return extreme<false>(x, &axis, keepdim, false); }
Tensor max(const Tensor& x) { return extreme<true>(x, nullptr, false, false); }
Tensor min(const Tensor& x) { return extreme<false>(x, nullptr, false, false); }
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) { return extreme<true>(x, &axis, keepdim, true); }
Tensor argmin(const Tensor& x, int64_t axis, bool keepdim) { return extreme<false>(x, &axis, keepdim, true); }

}  // namespace tg
