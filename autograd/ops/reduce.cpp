// Reductions. One kernel shape serves them all: the input is viewed as
// (outer, reduced, inner) when the reduced axes are adjacent, which covers
// last-axis reductions (rows), leading-axis reductions (bias gradients) and
// sum_to; other axis sets are permuted to the end first.
#include "autograd/ops/reduce.h"

#include <algorithm>
#include <cmath>

#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
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
      {"axes {0,2} keepdim of (2,3,4)", {uniform({2, 3, 4}, 203)}, [](auto& x) { return sum(x[0], {0, 2}, true); }},
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

void link_reduce_ops() {}

}  // namespace tg
