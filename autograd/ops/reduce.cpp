// Reductions. One kernel shape serves them all: the input is viewed as
// (outer, reduced, inner) when the reduced axes are adjacent, which covers
// last-axis reductions (rows), leading-axis reductions (bias gradients) and
// sum_to; other axis sets are permuted to the end first.
#include "autograd/ops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/loop.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/profiler.h"

namespace tg {
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

// x viewed as a contiguous (outer, reduced, inner) block: the reduced axes are
// moved together (a copy only when they are not already adjacent).
struct Blocked {
  Tensor x;  // contiguous
  int64_t outer = 1, reduced = 1, inner = 1;
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
  const Shape& s = b.x.shape();
  for (int d = 0; d < r; ++d) {
    if (d < first)
      b.outer *= s[d];
    else if (d <= last)
      b.reduced *= s[d];
    else
      b.inner *= s[d];
  }
  return b;
}

// out[o, i] = sum_r x[o, r, i], parallel over outer x inner.
template <class T>
void sum_blocked(const Blocked& b, T* out) {
  const T* x = b.x.data<T>();
  const int64_t R = b.reduced, I = b.inner;
  if (I == 1) {
    parallel_for(b.outer, std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(R, 1)),
                 [&](int64_t o0, int64_t o1) {
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
  parallel_for(b.outer * I, kElementwiseGrain / std::max<int64_t>(R, 1) + 1, [&](int64_t c0, int64_t c1) {
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
static void sum_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  // Put the reduced axes back as size-1 dims, then broadcast.
  const Shape& in = n.edges[0].shape;
  Shape kept = in;
  for (int d = 0; d < in.size(); ++d)
    if (std::find(n.shape_attr.begin(), n.shape_attr.end(), d) != n.shape_attr.end()) kept[d] = 1;
  gin[0] = expand(reshape(g, kept), in).contiguous();
}
static const OpDef sum_op("sum", 1, "sum(x, axes, keepdim)", "the axes", sum_backward, [] {
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
});
Tensor sum(const Tensor& x, const Axes& axes, bool keepdim) {
  ProfileScope prof("sum");
  if (!x.defined()) throw ValueError("sum: tensor is undefined");
  std::vector<int> ax = detail::reduce_axes(x, axes, "sum");
  Tensor out = empty(detail::reduced_shape(x.shape(), ax, keepdim), x.dtype());
  detail::Blocked b = detail::block(x, ax);
  TG_DISPATCH_ALL(x.dtype(), "sum", [&] { detail::sum_blocked<scalar_t>(b, out.data<scalar_t>()); });
  if (Node* n = record(sum_op, out, x)) n->shape_attr.assign(ax.begin(), ax.end());
  return out;
}

Tensor mean(const Tensor& x, const Axes& axes, bool keepdim) {
  if (!x.defined()) throw ValueError("mean: tensor is undefined");
  std::vector<int> ax = detail::reduce_axes(x, axes, "mean");
  int64_t count = 1;
  for (int a : ax) count *= x.shape()[a];
  if (!is_floating(x.dtype())) throw DTypeError("mean: expected a floating tensor, got int64");
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

struct Rows {
  Tensor x;  // contiguous (rows, R) data
  int64_t rows = 1, R = 1;
  Shape perm_shape;  // x's shape with the reduced axes moved last
  Shape order;       // the permutation that produced it
};
Rows to_rows(const Tensor& x, const std::vector<int>& axes) {
  Rows r;
  for (int d = 0; d < x.dim(); ++d)
    if (std::find(axes.begin(), axes.end(), d) == axes.end()) r.order.push_back(d);
  for (int d : axes) r.order.push_back(d);
  for (int d : r.order) r.perm_shape.push_back(x.shape()[d]);
  NoGradGuard ng;
  r.x = permute(x, r.order).contiguous();
  for (int k = 0; k < r.order.size(); ++k)
    (k < r.order.size() - static_cast<int>(axes.size()) ? r.rows : r.R) *= r.perm_shape[k];
  return r;
}

// The shape of the result with keepdim, so it broadcasts against x in backward.
Shape kept_shape(const Shape& in, const Shape& axes) {
  Shape kept = in;
  for (int64_t d : axes) kept[static_cast<int>(d)] = 1;
  return kept;
}

template <class F>
void for_rows(const Rows& r, F f) {
  parallel_for(r.rows, std::max<int64_t>(1, detail::kElementwiseGrain / std::max<int64_t>(r.R, 1)),
               [&](int64_t a, int64_t b) {
                 for (int64_t o = a; o < b; ++o) f(o);
               });
}

}  // namespace

// ============================ var / std ============================
// var = sum((x - mean)^2) / (N - correction), two passes for accuracy.
// grad x = g * 2 (x - mean) / (N - correction). Recorded (create_graph), the
// mean is recomputed from x with mean(): it depends on x too, and the second
// derivative goes through it.
static void var_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(0);
  const double scale = 2.0 / n.f[0];
  if (grad_enabled()) {
    const Tensor mu = mean(x, n.shape_attr.vec(), true);
    gin[0] = mul(mul(reshape(g, mu.shape()), scale), sub(x, mu));
    return;
  }
  const Tensor mu = n.saved_tensor(1);
  const Tensor gk = reshape(g, mu.shape());
  Tensor gx = empty(x.shape(), x.dtype());
  TG_DISPATCH_FLOAT(x.dtype(), "var", [&] {
    const auto s = static_cast<scalar_t>(scale);
    detail::map3<scalar_t, scalar_t, scalar_t, scalar_t>(
        gx, x, mu, gk, [s](scalar_t xv, scalar_t m, scalar_t gv) { return gv * s * (xv - m); });
  });
  gin[0] = gx;
}
static const OpDef var_op(
    "var", 1, "var(x, axes, correction, keepdim)", "x, mean (keepdim), N - correction, the axes", var_backward, [] {
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
    });
Tensor var(const Tensor& x, const Axes& axes, int64_t correction, bool keepdim) {
  ProfileScope prof("var");
  if (!x.defined()) throw ValueError("var: tensor is undefined");
  if (!is_floating(x.dtype()))
    throw DTypeError(fmt::format("var: expected a floating tensor, got {} int64", x.shape()));
  if (correction < 0) throw ValueError(fmt::format("var: correction must be >= 0, got {}", correction));
  std::vector<int> ax = detail::reduce_axes(x, axes, "var");
  Rows r = to_rows(x, ax);
  Shape ax_shape(std::vector<int64_t>(ax.begin(), ax.end()));
  const double denom = static_cast<double>(r.R - correction);
  Tensor mu = empty(kept_shape(x.shape(), ax_shape), x.dtype());
  Tensor out = empty(detail::reduced_shape(x.shape(), ax, keepdim), x.dtype());
  TG_DISPATCH_FLOAT(x.dtype(), "var", [&] {
    const scalar_t* px = r.x.data<scalar_t>();
    scalar_t *pm = mu.data<scalar_t>(), *po = out.data<scalar_t>();
    for_rows(r, [&](int64_t o) {
      const scalar_t* row = px + o * r.R;
      scalar_t s = 0;
      for (int64_t k = 0; k < r.R; ++k) s += row[k];
      const scalar_t m = s / static_cast<scalar_t>(r.R);
      scalar_t ss = 0;
      for (int64_t k = 0; k < r.R; ++k) ss += (row[k] - m) * (row[k] - m);
      pm[o] = m;
      po[o] = ss / static_cast<scalar_t>(denom);
    });
  });
  if (Node* n = record(var_op, out, x)) {
    n->save(x);
    n->save(mu);
    n->f[0] = denom;
    n->shape_attr = ax_shape;
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
static void logsumexp_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(0);
  const Shape kept = kept_shape(n.edges[0].shape, n.shape_attr);
  const Tensor lse = reshape(n.saved_tensor(1), kept), gk = reshape(g, kept);
  if (grad_enabled()) {
    gin[0] = mul(gk, exp(sub(x, lse)));
    return;
  }
  Tensor gx = empty(x.shape(), x.dtype());
  TG_DISPATCH_FLOAT(x.dtype(), "logsumexp", [&] {
    detail::map3<scalar_t, scalar_t, scalar_t, scalar_t>(
        gx, x, lse, gk, [](scalar_t xv, scalar_t l, scalar_t gv) { return gv * std::exp(xv - l); });
  });
  gin[0] = gx;
}
static const OpDef logsumexp_op(
    "logsumexp", 1, "logsumexp(x, axes, keepdim)", "x, output, the axes", logsumexp_backward, [] {
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
    });
Tensor logsumexp(const Tensor& x, const Axes& axes, bool keepdim) {
  ProfileScope prof("logsumexp");
  if (!x.defined()) throw ValueError("logsumexp: tensor is undefined");
  if (!is_floating(x.dtype()))
    throw DTypeError(fmt::format("logsumexp: expected a floating tensor, got {} int64", x.shape()));
  std::vector<int> ax = detail::reduce_axes(x, axes, "logsumexp");
  Rows r = to_rows(x, ax);
  Shape ax_shape(std::vector<int64_t>(ax.begin(), ax.end()));
  Tensor lse = empty(kept_shape(x.shape(), ax_shape), x.dtype());
  TG_DISPATCH_FLOAT(x.dtype(), "logsumexp", [&] {
    const scalar_t* px = r.x.data<scalar_t>();
    scalar_t* pl = lse.data<scalar_t>();
    for_rows(r, [&](int64_t o) {
      const scalar_t* row = px + o * r.R;
      scalar_t m = -std::numeric_limits<scalar_t>::infinity();
      for (int64_t k = 0; k < r.R; ++k) m = row[k] > m ? row[k] : m;
      if (!std::isfinite(m)) m = 0;  // all -inf: exp(x - 0) sums to 0, log gives -inf
      scalar_t s = 0;
      for (int64_t k = 0; k < r.R; ++k) s += std::exp(row[k] - m);
      pl[o] = m + std::log(s);
    });
  });
  Tensor out = keepdim ? lse : reshape(lse, detail::reduced_shape(x.shape(), ax, false));
  if (Node* n = record(logsumexp_op, out, x)) {
    n->save(x);
    n->save(out);
    n->shape_attr = ax_shape;
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
Extreme extreme(const Tensor& x, const std::vector<int>& ax, bool keepdim, const char* op) {
  if (!x.defined()) throw ValueError(fmt::format("{}: tensor is undefined", op));
  Extreme e;
  e.rows = to_rows(x, ax);
  const Rows& r = e.rows;
  if (r.R == 0 && r.rows > 0) throw ValueError(fmt::format("{}: cannot reduce an empty axis of {}", op, x.shape()));
  Shape out_shape = detail::reduced_shape(x.shape(), ax, keepdim);
  e.values = empty(out_shape, x.dtype());
  e.indices = empty(out_shape, DType::i64);
  int64_t* pi = e.indices.data<int64_t>();
  TG_DISPATCH_ALL(x.dtype(), op, [&] {
    const scalar_t* px = r.x.data<scalar_t>();
    scalar_t* pv = e.values.data<scalar_t>();
    for_rows(r, [&](int64_t o) {
      const scalar_t* row = px + o * r.R;
      scalar_t best = row[0];
      int64_t at = 0;
      for (int64_t k = 1; k < r.R; ++k) {
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
// built in the rows layout (rows, R) and permuted back to x's. Recorded
// (create_graph), the same (rows, R) block is a scatter of g into zeros, whose
// backward (a gather at the saved indices) is differentiable again.
void extreme_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor idx = n.saved_tensor(0);
  const Shape& in = n.edges[0].shape;
  Shape order = n.shape_attr, perm_shape, inverse(order);
  for (int k = 0; k < order.size(); ++k) {
    perm_shape.push_back(in[static_cast<int>(order[k])]);
    inverse[static_cast<int>(order[k])] = k;
  }
  const int64_t rows = idx.numel(), R = rows ? in.numel() / rows : 0;
  if (grad_enabled()) {
    const Tensor gr = scatter(zeros({rows, R}, g.dtype()), 1, reshape(idx, {rows, 1}), reshape(g, {rows, 1}));
    gin[0] = permute(reshape(gr, perm_shape), inverse);
    return;
  }
  Tensor gr = zeros(perm_shape, g.dtype());
  Tensor gc = g.contiguous();
  TG_DISPATCH_FLOAT(g.dtype(), "max", [&] {
    const scalar_t* pg = gc.data<scalar_t>();
    const int64_t* pi = idx.data<int64_t>();
    scalar_t* po = gr.data<scalar_t>();
    for (int64_t o = 0; o < rows; ++o) po[o * R + pi[o]] = pg[o];
  });
  gin[0] = permute(gr, inverse).contiguous();
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

static const OpDef max_op("max", 1, "max(x, axis, keepdim) / max(x)", "argmax (int64), the axis order",
                          extreme_backward, [] { return extreme_samples(max, max); });
static const OpDef min_op("min", 1, "min(x, axis, keepdim) / min(x)", "argmin (int64), the axis order",
                          extreme_backward, [] { return extreme_samples(min, min); });

template <bool Max>
static Tensor extreme_op(const Tensor& x, const std::vector<int>& ax, bool keepdim) {
  const char* name = Max ? "max" : "min";
  ProfileScope prof(name);
  Extreme e = extreme<Max>(x, ax, keepdim, name);
  if (Node* n = record(Max ? max_op : min_op, e.values, x)) {
    n->save(e.indices);
    n->shape_attr = e.rows.order;
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

void link_reduce_ops() {}

}  // namespace tg
