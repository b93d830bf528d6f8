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
#include "autograd/ops/tangent.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_floating;
namespace detail {

// Normalised, sorted, unique axes; empty input means every axis.
std::vector<int> reduce_axes(const Tensor& x, const Axes& axes, const char* op) {
  std::vector<int> out;
  if (axes.empty()) {
    for (int d = 0; d < x.dim(); ++d) out.push_back(d);
    return out;
  }
  for (int64_t a : axes) out.push_back(normalize_axis(a, x.dim(), op));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    throw ShapeError(fmt::format("{}: repeated axis in the reduction axes", op));
  if (x.dim() == 0) out.clear();
  return out;
}

Shape reduced_shape(const Shape& in, const std::vector<int>& axes, bool keepdim) {
  Shape out;
  for (int d = 0; d < in.size(); ++d) {
    bool r = std::find(axes.begin(), axes.end(), d) != axes.end();
    if (!r)
      out.push_back(in[d]);
    else if (keepdim)
      out.push_back(1);
  }
  return out;
}

// x viewed as a contiguous (outer, n, inner) block with n the reduced axes,
// moved together (a copy only when they are not already adjacent).
struct Blocked {
  Tensor x;  // contiguous
  AxisView v;
};
Blocked block(const Tensor& x, const std::vector<int>& axes) {
  Blocked b;
  const int r = x.dim();
  bool adjacent = axes.empty() || axes.back() - axes.front() + 1 == static_cast<int>(axes.size());
  Tensor src = x;
  int first = axes.empty() ? r : axes.front(), last = axes.empty() ? r - 1 : axes.back();
  if (!adjacent) {  // move reduced axes to the end
    Shape order;
    for (int d = 0; d < r; ++d)
      if (std::find(axes.begin(), axes.end(), d) == axes.end()) order.push_back(d);
    for (int d : axes) order.push_back(d);
    NoGradGuard ng;
    src = permute(x, order);
    first = r - static_cast<int>(axes.size());
    last = r - 1;
  }
  {
    NoGradGuard ng;
    b.x = src.contiguous();
  }
  b.v = axis_view(b.x.shape(), first, last);
  return b;
}

// out[o, i] = sum_r x[o, r, i], parallel over outer x inner.
template <class T>
void sum_blocked(const Blocked& b, T* out) {
  const T* x = b.x.data<T>();
  const int64_t R = b.v.n, I = b.v.inner;
  if (I == 1) {
    parallel_for(b.v.outer, row_grain(R), [&](int64_t o0, int64_t o1) {
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
  parallel_for(b.v.outer * I, kElementwiseGrain / std::max<int64_t>(R, 1) + 1, [&](int64_t c0, int64_t c1) {
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

}  // namespace detail

// ============================ sum ============================
namespace {
// sum, var, logsumexp: the reduced axes, normalised and sorted.
struct ReduceAttrs {
  Shape axes;
};
// The shape of the result with keepdim, so it broadcasts against x in backward.
Shape kept_shape(const Shape& in, const Shape& axes) {
  Shape kept = in;
  for (int64_t d : axes) kept[static_cast<int>(d)] = 1;
  return kept;
}
}  // namespace

// Puts the reduced axes back as size-1 dims, then broadcasts.
static void sum_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Shape& in = n.edges[0].shape;
  gin[0] = expand(reshape(g, kept_shape(in, n.attrs<ReduceAttrs>().axes)), in).contiguous();
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
      using samples::uniform;
      return std::vector<OpSample>{
          {"all of (3,4)", {uniform({3, 4}, 201)}, [](auto& x) { return sum(x[0]); }},
          {"axis -1 of (2,3,4)", {uniform({2, 3, 4}, 202)}, [](auto& x) { return sum(x[0], {-1}); }},
          {"axes {0,2} keepdim of (2,3,4)",
           {uniform({2, 3, 4}, 203)},
           [](auto& x) {
             return sum(x[0], {0, 2}, true);
           }},
          {"axis 0 of non-contiguous (4,3)", {samples::strided({4, 3}, 204)}, [](auto& x) { return sum(x[0], {0}); }},
      };
    },
});
Tensor sum(const Tensor& x, const Axes& axes, bool keepdim) {
  ProfileScope prof(sum_op.name);
  detail::check_defined(sum_op.name, x, "tensor");
  std::vector<int> ax = detail::reduce_axes(x, axes, "sum");
  Tensor out = empty(detail::reduced_shape(x.shape(), ax, keepdim), x.dtype());
  detail::Blocked b = detail::block(x, ax);
  TG_DISPATCH_ARITH(x.dtype(), sum_op.name, [&] { detail::sum_blocked<scalar_t>(b, out.data<scalar_t>()); });
  if (Node* n = record(sum_op, out, x)) n->attrs<ReduceAttrs>().axes.assign(ax.begin(), ax.end());
  return out;
}

Tensor mean(const Tensor& x, const Axes& axes, bool keepdim) {
  detail::check_floating("mean", x, "tensor");
  std::vector<int> ax = detail::reduce_axes(x, axes, "mean");
  int64_t count = 1;
  for (int a : ax) count *= x.shape()[a];
  return mul(sum(x, axes, keepdim), 1.0 / static_cast<double>(std::max<int64_t>(count, 1)));
}

// ============================ sum_to ============================
Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int r = x.dim(), n = shape.size();
  if (n > r) throw ShapeError(fmt::format("sum_to: cannot reduce {} to the larger rank {}", x.shape(), shape));
  Axes axes;
  for (int d = 0; d < r; ++d) {
    int sd = d - (r - n);
    if (sd < 0) {
      axes.push_back(d);
    } else if (shape[sd] == 1 && x.shape()[d] != 1) {
      axes.push_back(d);
    } else if (shape[sd] != x.shape()[d]) {
      throw ShapeError(fmt::format("sum_to: cannot reduce {} to {}", x.shape(), shape));
    }
  }
  if (axes.empty()) return reshape(x, shape);
  return reshape(sum(x, axes, true), shape);
}

// ============================ row reductions: var, logsumexp, max/min ============================
// These run on rows: the reduced axes are moved last (a copy only when they
// are not already last and contiguous), so the kernel walks each contiguous
// row of R elements once or twice, in parallel over rows. Reductions over
// the last axis (softmax- and layer_norm-like) take no copy at all.
namespace {

// x permuted to (rows, R): the kept axes, then the reduced ones (R elements
// per row), as the (outer, n, inner = 1) view of the permuted shape.
struct Rows {
  Tensor x;          // contiguous, of perm_shape
  Shape perm_shape;  // x's shape with the reduced axes moved last
  Shape order;       // the permutation that produced it
  detail::AxisView v;
  int64_t rows() const { return v.outer; }
  int64_t R() const { return v.n; }
};
Rows to_rows(const Tensor& x, const std::vector<int>& axes) {
  Rows r;
  for (int d = 0; d < x.dim(); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) r.order.push_back(d);
  for (int d : axes) r.order.push_back(d);
  for (int d : r.order) r.perm_shape.push_back(x.shape()[d]);
  NoGradGuard ng;
  r.x = permute(x, r.order).contiguous();
  r.v = detail::axis_view(r.perm_shape, r.perm_shape.size() - static_cast<int>(axes.size()), r.perm_shape.size() - 1);
  return r;
}

template <class F>
void for_rows(const Rows& r, F f) {
  parallel_for(r.rows(), detail::row_grain(r.R()), [&](int64_t a, int64_t b) {
    for (int64_t o = a; o < b; ++o) f(o);
  });
}

}  // namespace

// ============================ var / std ============================
// var = sum((x - mean)^2) / (N - correction), two passes for accuracy.
// grad x = g * 2 (x - mean) / (N - correction), with the mean recomputed
// from x by mean(): it depends on x too, and the second derivative goes
// through it.
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
// d var = 2 / (N - correction) * sum((x - mean) t): the mean's own tangent
// multiplies sum(x - mean) = 0.
static void var_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const VarAttrs& attrs = n.attrs<VarAttrs>();
  const Tensor x = n.saved_tensor(&VarSaved::x);
  const Tensor centred = sub(x, mean(x, attrs.axes.vec(), true));
  out[0] = reshape(mul(sum(mul(centred, t[0]), attrs.axes.vec()), 2.0 / attrs.denom), n.out_shape);
}
static const OpDef var_op({
    .name = "var",
    .arity = 1,
    .signature = "var(x, axes, correction, keepdim)",
    .saves = saves_of<VarSaved>(),
    .backward = var_backward,
    .tangent = var_tangent,
    .samples = [] {
      using samples::uniform;
      return std::vector<OpSample>{
          {"all of (3,4)", {uniform({3, 4}, 211)}, [](auto& x) { return var(x[0]); }},
          {"axis -1 of (2,3,4)", {uniform({2, 3, 4}, 212)}, [](auto& x) { return var(x[0], {-1}); }},
          {"axes {0,2} keepdim, correction 0",
           {uniform({2, 3, 4}, 213)},
           [](auto& x) {
             return var(x[0], {0, 2}, 0, true);
           }},
          {"axis 0 of non-contiguous (4,3)", {samples::strided({4, 3}, 214)}, [](auto& x) { return var(x[0], {0}); }},
          {"std over axis 1 of (3,5)", {uniform({3, 5}, 215)}, [](auto& x) { return tg::std(x[0], {1}); }},
      };
    },
});
Tensor var(const Tensor& x, const Axes& axes, int64_t correction, bool keepdim) {
  const std::string_view op = var_op.name;
  ProfileScope prof(op);
  check_floating(op, x, "tensor");
  if (correction < 0) throw ValueError(fmt::format("{}: correction must be >= 0, got {}", op, correction));
  std::vector<int> ax = detail::reduce_axes(x, axes, "var");
  Rows r = to_rows(x, ax);
  Shape ax_shape(std::vector<int64_t>(ax.begin(), ax.end()));
  const double denom = static_cast<double>(r.R() - correction);
  Tensor out = empty(detail::reduced_shape(x.shape(), ax, keepdim), x.dtype());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* px = r.x.data<scalar_t>();
    scalar_t* po = out.data<scalar_t>();
    for_rows(r, [&](int64_t o) {
      const scalar_t* row = px + o * r.R();
      scalar_t s = 0;
      for (int64_t k = 0; k < r.R(); ++k) s += row[k];
      const scalar_t m = s / static_cast<scalar_t>(r.R());
      scalar_t ss = 0;
      for (int64_t k = 0; k < r.R(); ++k) ss += (row[k] - m) * (row[k] - m);
      po[o] = ss / static_cast<scalar_t>(denom);
    });
  });
  if (Node* n = record(var_op, out, x)) {
    n->attrs<VarAttrs>() = {.axes = ax_shape, .denom = denom};
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
  const Shape kept = kept_shape(n.edges[0].shape, n.attrs<ReduceAttrs>().axes);
  const Tensor lse = reshape(n.saved_tensor(&LogsumexpSaved::output), kept), gk = reshape(g, kept);
  gin[0] = detail::pointwise(
      n.op->name, [](auto xv, auto l, auto gv) { return gv * detail::math::exp(xv - l); }, x, lse, gk);
}
// The softmax-weighted sum of the tangent over the axes.
static void logsumexp_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Shape& axes = n.attrs<ReduceAttrs>().axes;
  const Tensor lse = reshape(n.saved_tensor(&LogsumexpSaved::output), kept_shape(n.edges[0].shape, axes));
  out[0] = reshape(sum(mul(exp(sub(n.saved_tensor(&LogsumexpSaved::x), lse)), t[0]), axes.vec()), n.out_shape);
}
static const OpDef logsumexp_op({
    .name = "logsumexp",
    .arity = 1,
    .signature = "logsumexp(x, axes, keepdim)",
    .saves = saves_of<LogsumexpSaved>(),
    .backward = logsumexp_backward,
    .tangent = logsumexp_tangent,
    .samples = [] {
      using samples::uniform;
      return std::vector<OpSample>{
          {"axis -1 of (3,4)", {uniform({3, 4}, 221, -3, 3)}, [](auto& x) { return logsumexp(x[0], {-1}); }},
          {"axes {0,2} keepdim of (2,3,4)",
           {uniform({2, 3, 4}, 222, -3, 3)},
           [](auto& x) {
             return logsumexp(x[0], {0, 2}, true);
           }},
          {"all of non-contiguous (3,2)",
           {samples::strided({3, 2}, 223, -3, 3)},
           [](auto& x) { return logsumexp(x[0], {}); }},
      };
    },
});
Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdim) {
  const std::string_view op = logsumexp_op.name;
  ProfileScope prof(op);
  check_floating(op, x, "tensor");
  std::vector<int> ax = detail::reduce_axes(x, axes, "logsumexp");
  Rows r = to_rows(x, ax);
  Shape ax_shape(std::vector<int64_t>(ax.begin(), ax.end()));
  Tensor lse = empty(kept_shape(x.shape(), ax_shape), x.dtype());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* px = r.x.data<scalar_t>();
    scalar_t* pl = lse.data<scalar_t>();
    for_rows(r, [&](int64_t o) {
      const scalar_t* row = px + o * r.R();
      scalar_t m = -std::numeric_limits<scalar_t>::infinity();
      for (int64_t k = 0; k < r.R(); ++k) m = row[k] > m ? row[k] : m;
      if (!std::isfinite(m)) m = 0;  // all -inf: exp(x - 0) sums to 0, log gives -inf
      scalar_t s = 0;
      for (int64_t k = 0; k < r.R(); ++k) s += std::exp(row[k] - m);
      pl[o] = m + std::log(s);
    });
  });
  Tensor out = keepdim ? lse : reshape(lse, detail::reduced_shape(x.shape(), ax, false));
  if (Node* n = record(logsumexp_op, out, x)) {
    n->attrs<ReduceAttrs>() = {.axes = ax_shape};
    n->save(LogsumexpSaved{.x = x, .output = out});
  }
  return out;
}

// ============================ max / min / argmax / argmin ============================
// One pass per row finds the first extreme element (NaN counts as extreme, as
// in PyTorch); the values take the gradient through that index.
namespace {

struct Extreme {
  Tensor values, indices;  // both reduced_shape(keepdim); indices int64 within the reduced block
  Rows rows;
};
template <bool Max>
Extreme extreme(const Tensor& x, const std::vector<int>& ax, bool keepdim, std::string_view op) {
  detail::check_defined(op, x, "tensor");
  Extreme e;
  e.rows = to_rows(x, ax);
  const Rows& r = e.rows;
  if (r.R() == 0 && r.rows() > 0) throw ValueError(fmt::format("{}: cannot reduce an empty axis of {}", op, x.shape()));
  Shape out_shape = detail::reduced_shape(x.shape(), ax, keepdim);
  e.values = empty(out_shape, x.dtype());
  e.indices = empty(out_shape, DType::i64);
  int64_t* pi = e.indices.data<int64_t>();
  TG_DISPATCH_ALL(x.dtype(), op, [&] {
    const scalar_t* px = r.x.data<scalar_t>();
    scalar_t* pv = e.values.data<scalar_t>();
    for_rows(r, [&](int64_t o) {
      const scalar_t* row = px + o * r.R();
      scalar_t best = row[0];
      int64_t at = 0;
      for (int64_t k = 1; k < r.R(); ++k) {
        const scalar_t v = row[k];
        if (best != best) break;  // NaN: already the answer
        if ((Max ? v > best : v < best) || v != v) {
          best = v;
          at = k;
        }
      }
      pv[o] = best;
      pi[o] = at;
    });
  });
  return e;
}

// Gradient of max/min: g at the chosen element of each row, zero elsewhere,
// built in the rows layout (rows, R) as a scatter of g into zeros (whose
// backward, a gather at the saved indices, is differentiable again) and
// permuted back to x's.
struct ExtremeAttrs {
  Shape order;  // the permutation of x that moved the reduced axes last (Rows::order)
};
struct ExtremeSaved {
  Tensor indices;  // int64 positions within each row, reduced_shape(keepdim)
  static constexpr std::tuple fields{saved_field("indices", &ExtremeSaved::indices)};
};
static void extreme_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor idx = n.saved_tensor(&ExtremeSaved::indices);
  const Shape& in = n.edges[0].shape;
  const Shape& order = n.attrs<ExtremeAttrs>().order;
  const int64_t rows = idx.numel(), R = rows ? in.numel() / rows : 0;
  Shape permuted;  // x's shape with the reduced axes last
  for (int64_t d : order) permuted.push_back(in[static_cast<int>(d)]);
  const Tensor gr = scatter(zeros({rows, R}, g.dtype()), 1, reshape(idx, {rows, 1}), reshape(g, {rows, 1}));
  gin[0] = detail::unpermute(reshape(gr, permuted), order);
}

// The tangent at the chosen element of each row: the same rows layout, gathered.
void extreme_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Tensor idx = n.saved_tensor(&ExtremeSaved::indices);
  const int64_t rows = idx.numel(), R = rows ? n.edges[0].shape.numel() / rows : 0;
  const Tensor tr = reshape(permute(t[0], n.attrs<ExtremeAttrs>().order), {rows, R});
  out[0] = reshape(gather(tr, 1, reshape(idx, {rows, 1})), n.out_shape);
}

std::vector<OpSample> extreme_samples(Tensor (*axis_fn)(const Tensor&, int64_t, bool),
                                      Tensor (*all_fn)(const Tensor&)) {
  using samples::uniform;  // continuous random values: no ties
  return {
      {"axis 1 of (3,4)", {uniform({3, 4}, 231)}, [axis_fn](auto& x) { return axis_fn(x[0], 1, false); }},
      {"axis 0 keepdim of (2,3,4)", {uniform({2, 3, 4}, 232)}, [axis_fn](auto& x) { return axis_fn(x[0], 0, true); }},
      {"axis -1 of non-contiguous (2,3)",
       {samples::strided({2, 3}, 233)},
       [axis_fn](auto& x) { return axis_fn(x[0], -1, false); }},
      {"all of (3,4)", {uniform({3, 4}, 234)}, [all_fn](auto& x) { return all_fn(x[0]); }},
  };
}

}  // namespace

static const OpDef max_op({.name = "max", .arity = 1, .signature = "max(x, axis, keepdim) / max(x)",
                           .saves = saves_of<ExtremeSaved>(), .backward = extreme_backward,
                           .tangent = extreme_tangent,
                           .samples = [] { return extreme_samples(max, max); }});
static const OpDef min_op({.name = "min", .arity = 1, .signature = "min(x, axis, keepdim) / min(x)",
                           .saves = saves_of<ExtremeSaved>(), .backward = extreme_backward,
                           .tangent = extreme_tangent,
                           .samples = [] { return extreme_samples(min, min); }});

template <bool Max>
static Tensor extreme_op(const Tensor& x, const std::vector<int>& ax, bool keepdim) {
  const OpDef& op = Max ? max_op : min_op;
  ProfileScope prof(op.name);
  Extreme e = extreme<Max>(x, ax, keepdim, op.name);
  if (Node* n = record(op, e.values, x)) {
    n->attrs<ExtremeAttrs>() = {.order = e.rows.order};
    n->save(ExtremeSaved{.indices = e.indices});
  }
  return e.values;
}
static std::vector<int> one_axis(const Tensor& x, int64_t axis, const char* op) {
  if (!x.defined()) throw ValueError(fmt::format("{}: tensor is undefined", op));
  if (x.dim() == 0) return {};
  return {normalize_axis(axis, x.dim(), op)};
}
static std::vector<int> all_axes(const Tensor& x, const char* op) {
  if (!x.defined()) throw ValueError(fmt::format("{}: tensor is undefined", op));
  if (x.numel() == 0) throw ValueError(fmt::format("{}: cannot reduce an empty tensor {}", op, x.shape()));
  return detail::reduce_axes(x, {}, op);
}

Tensor max(const Tensor& x, int64_t axis, bool keepdim) {
  return extreme_op<true>(x, one_axis(x, axis, "max"), keepdim);
}
Tensor min(const Tensor& x, int64_t axis, bool keepdim) {
  return extreme_op<false>(x, one_axis(x, axis, "min"), keepdim);
}
Tensor max(const Tensor& x) { return extreme_op<true>(x, all_axes(x, "max"), false); }
Tensor min(const Tensor& x) { return extreme_op<false>(x, all_axes(x, "min"), false); }
Tensor argmax(const Tensor& x, int64_t axis, bool keepdim) {
  ProfileScope prof("argmax");
  return extreme<true>(x, one_axis(x, axis, "argmax"), keepdim, "argmax").indices;
}
Tensor argmin(const Tensor& x, int64_t axis, bool keepdim) {
  ProfileScope prof("argmin");
  return extreme<false>(x, one_axis(x, axis, "argmin"), keepdim, "argmin").indices;
}

}  // namespace tg
