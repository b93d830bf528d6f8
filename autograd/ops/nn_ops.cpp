// Fused neural-network primitives: softmax, log_softmax, cross_entropy,
// layer_norm and dropout (scaled dot-product attention is in attention.cpp).
// Each is one node on the tape whose backward reuses what forward saved (the
// probabilities, mean and rstd, the mask) instead of recomputing through
// primitive ops. Under create_graph a backward takes the same formulas in
// tensor ops instead, so the gradient is recorded and differentiable again.
//
// Kernels work on contiguous rows (the row kernels of nn_kernels.h
// vectorise); a reduction over a non-last axis views the input as
// (outer, n, inner) and reduces along n with inner-long vector lanes. Large
// inputs are split over threads by rows.
#include "autograd/ops/nn_ops.h"

#include <cmath>
#include <limits>
#include <vector>

#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/loop.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/samples.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_floating, detail::dense, detail::exp_shifted, detail::row_dot, detail::row_grain,
    detail::row_logsumexp, detail::row_max, detail::row_sum, detail::vexp;

namespace {

// x viewed as (outer, n, inner) around `axis`.
struct AxisView {
  int64_t outer = 1, n = 1, inner = 1;
};
AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  for (int d = 0; d < s.size(); ++d) (d < axis ? v.outer : d == axis ? v.n : v.inner) *= s[d];
  return v;
}

}  // namespace

// ============================ softmax / log_softmax ============================
// Forward over (outer, n, inner). With inner == 1 each row is contiguous (the
// fast path); otherwise lanes of `inner` consecutive columns are reduced
// together, which still vectorises along the contiguous inner axis.
template <class T, bool Log>
static void softmax_forward(const T* x, T* y, const AxisView& v) {
  const int64_t n = v.n, I = v.inner;
  if (I == 1) {
    parallel_for(v.outer, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * n;
        T* yr = y + r * n;
        const T m = row_max(xr, n);
        if constexpr (Log) {
          const T lse = m + std::log(exp_shifted(xr, m, yr, n));
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) yr[i] = xr[i] - lse;
        } else {
          const T inv = T(1) / exp_shifted(xr, m, yr, n);
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) yr[i] *= inv;
        }
      }
    });
    return;
  }
  parallel_for(v.outer, row_grain(n * I), [&](int64_t o0, int64_t o1) {
    std::vector<T> m(I), s(I);
    for (int64_t o = o0; o < o1; ++o) {
      const T* xo = x + o * n * I;
      T* yo = y + o * n * I;
      std::fill(m.begin(), m.end(), -std::numeric_limits<T>::infinity());
      std::fill(s.begin(), s.end(), T(0));
      for (int64_t r = 0; r < n; ++r)
#pragma omp simd
        for (int64_t i = 0; i < I; ++i) m[i] = std::max(m[i], xo[r * I + i]);
      for (int64_t r = 0; r < n; ++r)
#pragma omp simd
        for (int64_t i = 0; i < I; ++i) {
          const T e = vexp(xo[r * I + i] - m[i]);
          yo[r * I + i] = e;
          s[i] += e;
        }
      if constexpr (Log) {
        for (int64_t i = 0; i < I; ++i) s[i] = m[i] + std::log(s[i]);
        for (int64_t r = 0; r < n; ++r)
#pragma omp simd
          for (int64_t i = 0; i < I; ++i) yo[r * I + i] = xo[r * I + i] - s[i];
      } else {
        for (int64_t i = 0; i < I; ++i) s[i] = T(1) / s[i];
        for (int64_t r = 0; r < n; ++r)
#pragma omp simd
          for (int64_t i = 0; i < I; ++i) yo[r * I + i] *= s[i];
      }
    }
  });
}

// softmax:     gx = y * (g - sum(g * y))
// log_softmax: gx = g - exp(y) * sum(g)
template <class T, bool Log>
static void softmax_backward_kernel(const T* g, const T* y, T* gx, const AxisView& v) {
  const int64_t n = v.n, I = v.inner;
  if (I == 1) {
    parallel_for(v.outer, row_grain(n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T *gr = g + r * n, *yr = y + r * n;
        T* out = gx + r * n;
        if constexpr (Log) {
          const T s = row_sum(gr, n);
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) out[i] = gr[i] - vexp(yr[i]) * s;
        } else {
          const T s = row_dot(gr, yr, n);
#pragma omp simd
          for (int64_t i = 0; i < n; ++i) out[i] = yr[i] * (gr[i] - s);
        }
      }
    });
    return;
  }
  parallel_for(v.outer, row_grain(n * I), [&](int64_t o0, int64_t o1) {
    std::vector<T> s(I);
    for (int64_t o = o0; o < o1; ++o) {
      const size_t base = o * n * I;
      std::fill(s.begin(), s.end(), T(0));
      for (int64_t r = 0; r < n; ++r)
#pragma omp simd
        for (int64_t i = 0; i < I; ++i) s[i] += Log ? g[base + r * I + i] : g[base + r * I + i] * y[base + r * I + i];
      for (int64_t r = 0; r < n; ++r)
#pragma omp simd
        for (int64_t i = 0; i < I; ++i) {
          const size_t k = base + r * I + i;
          gx[k] = Log ? g[k] - vexp(y[k]) * s[i] : y[k] * (g[k] - s[i]);
        }
    }
  });
}

// The softmax axis as a reduction's axis list (a 0-d input has no axis: the
// empty list reduces over all of it, i.e. the one element).
static Axes softmax_axes(const Tensor& y, int64_t axis) { return y.dim() == 0 ? Axes{} : Axes{axis}; }

template <bool Log>
static void softmax_family_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor y = n.saved_tensor(0);
  if (grad_enabled()) {  // recorded: the same formulas in ops, differentiable again
    const Axes axes = softmax_axes(y, n.i[0]);
    gin[0] = Log ? sub(g, mul(exp(y), sum(g, axes, true))) : mul(y, sub(g, sum(mul(g, y), axes, true)));
    return;
  }
  Tensor gc = dense(g);
  Tensor gx = empty(y.shape(), y.dtype());
  const AxisView v = axis_view(y.shape(), static_cast<int>(n.i[0]));
  detail::dispatch_float(y.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    softmax_backward_kernel<scalar_t, Log>(gc.data<scalar_t>(), y.data<scalar_t>(), gx.data<scalar_t>(), v);
  });
  gin[0] = gx;
}

template <bool Log>
static std::vector<OpSample> softmax_samples() {
  auto op = Log ? log_softmax : softmax;
  auto on = [op](int64_t axis) { return [op, axis](const std::vector<Tensor>& x) { return op(x[0], axis); }; };
  return {
      {"(3,5) axis -1", {samples::uniform({3, 5}, 301, -2, 2)}, on(-1)},
      {"(2,3,4) axis 1", {samples::uniform({2, 3, 4}, 302, -2, 2)}, on(1)},
      {"(4,3) axis 0", {samples::uniform({4, 3}, 303, -2, 2)}, on(0)},
      {"non-contiguous (3,4) axis -1", {samples::strided({3, 4}, 304, -2, 2)}, on(-1)},
      {"(5) large logits", {samples::uniform({5}, 305, -8, 8)}, on(0)},
  };
}

static const OpDef softmax_op("softmax", 1, "softmax(x, axis) -> exp(x) / sum(exp(x)) along axis, max subtracted",
                              "output, axis", softmax_family_backward<false>, softmax_samples<false>);
static const OpDef log_softmax_op("log_softmax", 1, "log_softmax(x, axis) -> x - logsumexp(x) along axis",
                                  "output, axis", softmax_family_backward<true>, softmax_samples<true>);

// Records out = (log_)softmax(x) along axis a; the node keeps the output.
static void record_softmax(const OpDef& op, const Tensor& x, Tensor& out, int a) {
  if (Node* n = record(op, out, x)) {
    n->i[0] = a;
    n->save(out);
  }
}

template <bool Log>
static Tensor softmax_family(const Tensor& x, int64_t axis, const OpDef& op) {
  const char* name = Log ? "log_softmax" : "softmax";
  ProfileScope prof(name);
  check_floating(name, x, "input");
  const int a = x.dim() == 0 ? 0 : normalize_axis(axis, x.dim(), name);
  Tensor xc = dense(x);
  Tensor out = empty(x.shape(), x.dtype());
  const AxisView v = axis_view(x.shape(), a);
  detail::dispatch_float(x.dtype(), name, [&](auto tag) {
    using scalar_t = decltype(tag);
    softmax_forward<scalar_t, Log>(xc.data<scalar_t>(), out.data<scalar_t>(), v);
  });
  record_softmax(op, x, out, a);
  return out;
}
Tensor softmax(const Tensor& x, int64_t axis) { return softmax_family<false>(x, axis, softmax_op); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return softmax_family<true>(x, axis, log_softmax_op); }

// ============================ cross_entropy ============================
// Per position with target t over C classes and smoothing e (torch's formula):
//   loss = (1 - e) * (lse - x_t) + (e / C) * sum_c (lse - x_c)
//        = lse - (1 - e) x_t - (e / C) sum_c x_c
//   dloss/dx_c = p_c - (1 - e) [c == t] - e / C
// Ignored positions contribute 0 and are left out of the mean's count (all
// ignored: the mean is 0/0 = NaN, as in torch).
// (N,C,d...) logits are moved to rows (N*d..., C) first so one row kernel
// serves both layouts.
struct CrossEntropyRows {
  Tensor rows;     // (R,C) contiguous logits
  Tensor targets;  // (R) contiguous int64
  int64_t R = 0, C = 0;
};

static CrossEntropyRows cross_entropy_rows(const Tensor& logits, const Tensor& targets) {
  check_floating("cross_entropy", logits, "logits");
  if (!targets.defined()) throw ValueError("cross_entropy: targets are undefined");
  if (targets.dtype() != DType::i64)
    throw DTypeError(fmt::format("cross_entropy: targets must be int64 class indices, got {} {}", targets.shape(),
                                 dtype_name(targets.dtype())));
  const Shape& ls = logits.shape();
  if (ls.size() == 0) throw ShapeError("cross_entropy: logits () need a class axis: (C), (N,C) or (N,C,d...)");
  const int class_axis = ls.size() == 1 ? 0 : 1;
  Shape want = ls;
  want.erase(class_axis);
  if (!(targets.shape() == want))
    throw ShapeError(fmt::format("cross_entropy: logits {} need targets of shape {}, got {}", ls, want,
                                 targets.shape()));
  CrossEntropyRows r;
  r.C = ls[class_axis];
  if (r.C == 0) throw ShapeError(fmt::format("cross_entropy: logits {} have no classes", ls));
  r.R = want.numel();
  // With the logits recorded, these views (and the copy) are recorded too;
  // they save nothing. cross_entropy records the probabilities as the
  // softmax of the rows, which so reach back to the logits.
  if (ls.size() > 2) {  // (N,C,d...) -> (N,d...,C)
    Shape order;
    order.push_back(0);
    for (int d = 2; d < ls.size(); ++d) order.push_back(d);
    order.push_back(1);
    r.rows = reshape(permute(logits, order).contiguous(), {r.R, r.C});
  } else {
    r.rows = reshape(logits.contiguous(), {r.R, r.C});
  }
  r.targets = reshape(targets.contiguous(), {r.R});
  return r;
}

// Plain: the formula above per row, in one pass.
static Tensor cross_entropy_grad_rows(const Tensor& g, const Tensor& p, const Tensor& targets, double eps,
                                      int64_t ignore, Reduction reduction, int64_t count) {
  const int64_t R = p.shape()[0], C = p.shape()[1];
  Tensor gc = dense(g);
  Tensor gx = empty(p.shape(), p.dtype());
  detail::dispatch_float(p.dtype(), "cross_entropy", [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    const T *pp = p.data<T>(), *gp = gc.data<T>();
    const int64_t* t = targets.data<int64_t>();
    T* out = gx.data<T>();
    const T scale = reduction == Reduction::mean ? T(1) / static_cast<T>(count) : T(1);
    const T smooth = static_cast<T>(eps / static_cast<double>(C)), hit = static_cast<T>(1.0 - eps);
    parallel_for(R, row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        T* o = out + r * C;
        if (t[r] == ignore) {
          std::fill(o, o + C, T(0));
          continue;
        }
        const T w = (reduction == Reduction::none ? gp[r] : gp[0]) * scale;
        const T* pr = pp + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] = w * (pr[c] - smooth);
        o[t[r]] -= w * hit;
      }
    });
  });
  return gx;
}

// Recorded (create_graph): gx = w * (p * keep - q) in ops, with the smoothed
// one-hot targets q = (1 - e) [c == t] + e / C and keep (R,1) = [t != ignore]
// as constants (q is 0 on ignored rows). p carries the graph to the logits
// (forward records it as their softmax), so gx is differentiable again.
static Tensor cross_entropy_grad_recorded(const Tensor& g, const Tensor& p, const Tensor& targets, double eps,
                                          int64_t ignore, Reduction reduction, int64_t count) {
  const int64_t R = p.shape()[0], C = p.shape()[1];
  Tensor q = zeros({R, C}, p.dtype()), keep = zeros({R, 1}, p.dtype());
  detail::dispatch_float(p.dtype(), "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    const int64_t* t = targets.data<int64_t>();
    T *qp = q.data<T>(), *kp = keep.data<T>();
    for (int64_t r = 0; r < R; ++r) {
      if (t[r] == ignore) continue;
      kp[r] = T(1);
      std::fill(qp + r * C, qp + (r + 1) * C, static_cast<T>(eps / static_cast<double>(C)));
      qp[r * C + t[r]] += static_cast<T>(1.0 - eps);
    }
  });
  // w: g per row (none), or the scalar g, over the count for the mean (all
  // ignored: every row is 0 anyway).
  Tensor w = reduction == Reduction::none ? reshape(g, {R, 1}) : g;
  if (reduction == Reduction::mean && count > 0) w = mul(w, 1.0 / static_cast<double>(count));
  return mul(w, sub(mul(p, keep), q));
}

static void cross_entropy_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (!n.needs(0)) return;
  const Tensor p = n.saved_tensor(0), targets = n.saved_tensor(1);
  const double eps = n.f[0];
  const int64_t ignore = n.i[0], count = n.i[2];
  const auto reduction = static_cast<Reduction>(n.i[1]);
  const Tensor gx = grad_enabled() ? cross_entropy_grad_recorded(g, p, targets, eps, ignore, reduction, count)
                                   : cross_entropy_grad_rows(g, p, targets, eps, ignore, reduction, count);
  // Back to the logits' layout: (N,d...,C) -> (N,C,d...).
  const Shape& ls = n.edges[0].shape;
  if (ls.size() > 2) {
    Shape moved, order;
    moved.push_back(ls[0]);
    for (int d = 2; d < ls.size(); ++d) moved.push_back(ls[d]);
    moved.push_back(ls[1]);
    order.push_back(0);
    order.push_back(ls.size() - 1);
    for (int d = 1; d < ls.size() - 1; ++d) order.push_back(d);
    gin[0] = permute(reshape(gx, moved), order).contiguous();
  } else {
    gin[0] = reshape(gx, ls);
  }
}

static const OpDef cross_entropy_op(
    "cross_entropy", 2,
    "cross_entropy(logits (N,C[,d...]), targets (N[,d...]) int64, ignore_index, label_smoothing, reduction)",
    "softmax (R,C) (recorded as the softmax of the logits' rows), targets, count of non-ignored targets",
    cross_entropy_backward, [] {
      using samples::uniform;
      auto ce = [](int64_t ignore, double smoothing, Reduction red) {
        return [=](const std::vector<Tensor>& x) { return cross_entropy(x[0], x[1], ignore, smoothing, red); };
      };
      auto ids = [](std::vector<int64_t> v, const Shape& s) { return from_vector(v, s); };
      return std::vector<OpSample>{
          {"(4,5) mean", {uniform({4, 5}, 311, -2, 2), ids({0, 3, 4, 1}, {4})}, ce(-100, 0.0, Reduction::mean)},
          {"(4,5) sum", {uniform({4, 5}, 312, -2, 2), ids({2, 2, 0, 4}, {4})}, ce(-100, 0.0, Reduction::sum)},
          {"(3,4) none", {uniform({3, 4}, 313, -2, 2), ids({1, 0, 3}, {3})}, ce(-100, 0.0, Reduction::none)},
          {"(5,4) mean, ignore_index 1", {uniform({5, 4}, 314, -2, 2), ids({1, 0, 1, 3, 2}, {5})},
           ce(1, 0.0, Reduction::mean)},
          {"(4,6) mean, label_smoothing 0.1", {uniform({4, 6}, 315, -2, 2), ids({5, 0, 2, 2}, {4})},
           ce(-100, 0.1, Reduction::mean)},
          {"(4,3) none, smoothing 0.2, ignore -1", {uniform({4, 3}, 316, -2, 2), ids({2, -1, 0, 1}, {4})},
           ce(-1, 0.2, Reduction::none)},
          {"(2,3,4) (N,C,d) mean, smoothing 0.3, ignore 0",
           {uniform({2, 3, 4}, 317, -2, 2), ids({1, 0, 2, 2, 0, 1, 1, 2}, {2, 4})}, ce(0, 0.3, Reduction::mean)},
          {"(5) unbatched sum", {uniform({5}, 318, -2, 2), ids({3}, {})}, ce(-100, 0.0, Reduction::sum)},
          {"non-contiguous (3,4) mean", {samples::strided({3, 4}, 319, -2, 2), ids({0, 3, 1}, {3})},
           ce(-100, 0.0, Reduction::mean)},
      };
    });

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  ProfileScope prof("cross_entropy");
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
    throw ValueError(fmt::format("cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing));
  CrossEntropyRows in = cross_entropy_rows(logits, targets);
  const int64_t R = in.R, C = in.C;
  const int64_t* t = in.targets.data<int64_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (t[r] == ignore_index) continue;
    if (t[r] < 0 || t[r] >= C)
      throw IndexError(fmt::format("cross_entropy: target {} at position {} is out of range for {} classes "
                                   "(logits {}, targets {}, ignore_index {})",
                                   t[r], r, C, logits.shape(), targets.shape(), ignore_index));
    ++count;
  }
  const bool recording = grad_enabled() && logits.requires_grad();
  Tensor probs = recording ? empty({R, C}, logits.dtype()) : Tensor();
  Tensor losses = empty(targets.shape(), logits.dtype());
  detail::dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    const T* x = in.rows.data<T>();
    T* loss = losses.data<T>();
    T* p = recording ? probs.data<T>() : nullptr;
    const T smooth = static_cast<T>(label_smoothing / static_cast<double>(C)), hit = static_cast<T>(1.0 - label_smoothing);
    parallel_for(R, row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * C;
        T lse;
        if (p) {  // keep the probabilities for backward
          T* pr = p + r * C;
          const T m = row_max(xr, C);
          const T s = exp_shifted(xr, m, pr, C);
          const T inv = T(1) / s;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) pr[c] *= inv;
          lse = m + std::log(s);
        } else {
          lse = row_logsumexp(xr, C);
        }
        if (t[r] == ignore_index) {
          loss[r] = 0;
          continue;
        }
        T l = lse - hit * xr[t[r]];
        if (smooth != 0) l -= smooth * row_sum(xr, C);
        loss[r] = l;
      }
    });
  });
  // The probabilities are the softmax of the rows: recorded as such, they
  // carry the graph to the logits for a recorded backward, without keeping
  // the logits alive.
  if (recording) record_softmax(softmax_op, in.rows, probs, 1);
  Tensor out;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    double total = 0;  // summed serially in double: the same value at any thread count
    detail::dispatch_float(logits.dtype(), "cross_entropy", [&](auto tag) {
    using scalar_t = decltype(tag);
      const scalar_t* l = losses.data<scalar_t>();
      for (int64_t r = 0; r < R; ++r) total += l[r];
    });
    if (reduction == Reduction::mean) total /= static_cast<double>(count);
    out = full({}, total, logits.dtype());
  }
  if (Node* n = record(cross_entropy_op, out, logits, targets)) {
    n->f[0] = label_smoothing;
    n->i[0] = ignore_index;
    n->i[1] = static_cast<int64_t>(reduction);
    n->i[2] = count;
    n->save(probs);
    n->save(in.targets);
  }
  return out;
}

// ============================ layer_norm ============================
// y = (x - mean) * rstd * w + b over the last axis (C), rstd = 1/sqrt(var + eps)
// with the biased variance. Backward (llm.c / PyTorch), per row with
// n = (x - mean) * rstd and dn = g * w:
//   dx = rstd * (dn - mean(dn) - n * mean(dn * n)),  dw = sum_rows g * n,  db = sum_rows g.
// dw and db are summed per block of kLayerNormBlock rows, then over blocks in
// order, so the result does not depend on the thread count.
constexpr int64_t kLayerNormBlock = 32;

// Recorded (create_graph): the same formulas in ops. mean and rstd are
// recomputed from x with ops (the saved ones are not in the graph), so the
// gradients are differentiable again, in x, weight and g.
static void layer_norm_backward_recorded(const Node& n, const Tensor& g, const Tensor& x, const Tensor& w,
                                         std::span<Tensor> gin) {
  const double inv_c = 1.0 / static_cast<double>(x.shape().back());
  auto row_mean = [inv_c](const Tensor& t) { return mul(sum(t, {-1}, true), inv_c); };  // (..., 1)
  const Tensor xm = sub(x, row_mean(x));
  const Tensor rstd = rsqrt(add(row_mean(mul(xm, xm)), n.f[0]));
  const Tensor xhat = mul(xm, rstd);
  if (n.needs(0)) {
    const Tensor dn = w.defined() ? mul(g, w) : g;
    gin[0] = mul(rstd, sub(sub(dn, row_mean(dn)), mul(xhat, row_mean(mul(dn, xhat)))));
  }
  if (n.needs(1)) gin[1] = sum_to(mul(g, xhat), n.edges[1].shape);
  if (n.needs(2)) gin[2] = sum_to(g, n.edges[2].shape);
}

static void layer_norm_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(0), w = n.saved_tensor(1);
  if (grad_enabled()) {
    layer_norm_backward_recorded(n, g, x, w, gin);
    return;
  }
  const Tensor mean = n.saved_tensor(2), rstd = n.saved_tensor(3);
  const int64_t C = x.shape().back(), R = x.numel() / std::max<int64_t>(C, 1);
  Tensor gc = dense(g);
  const bool need_dx = n.needs(0), need_dw = n.needs(1), need_db = n.needs(2);
  const int64_t blocks = (R + kLayerNormBlock - 1) / kLayerNormBlock;
  Tensor gx = need_dx ? empty(x.shape(), x.dtype()) : Tensor();
  Tensor pw = need_dw ? zeros({blocks, C}, x.dtype()) : Tensor();
  Tensor pb = need_db ? zeros({blocks, C}, x.dtype()) : Tensor();
  detail::dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    const T *xp = x.data<T>(), *gp = gc.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>();
    const T* wp = w.defined() ? w.data<T>() : nullptr;
    T* gxp = need_dx ? gx.data<T>() : nullptr;
    parallel_for(blocks, std::max<int64_t>(1, row_grain(C) / kLayerNormBlock), [&](int64_t b0, int64_t b1) {
      std::vector<T> dn(C);
      for (int64_t b = b0; b < b1; ++b) {
        T* dw = need_dw ? pw.data<T>() + b * C : nullptr;
        T* db = need_db ? pb.data<T>() + b * C : nullptr;
        for (int64_t r = b * kLayerNormBlock; r < std::min(R, (b + 1) * kLayerNormBlock); ++r) {
          const T *xr = xp + r * C, *gr = gp + r * C;
          const T mu = mp[r], rs = rp[r];
          if (dw && db) {
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) {
              dw[c] += gr[c] * (xr[c] - mu) * rs;
              db[c] += gr[c];
            }
          } else if (dw) {
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) dw[c] += gr[c] * (xr[c] - mu) * rs;
          } else if (db) {
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) db[c] += gr[c];
          }
          if (!need_dx) continue;
          const T* d = gr;  // dn = g * w, or g itself without a weight
          if (wp) {
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) dn[c] = gr[c] * wp[c];
            d = dn.data();
          }
          T sum_dn = 0, sum_dn_n = 0;
#pragma omp simd reduction(+ : sum_dn, sum_dn_n)
          for (int64_t c = 0; c < C; ++c) {
            sum_dn += d[c];
            sum_dn_n += d[c] * (xr[c] - mu);
          }
          const T a = sum_dn / static_cast<T>(C), bb = sum_dn_n * rs / static_cast<T>(C);
          T* o = gxp + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) o[c] = rs * (d[c] - a - (xr[c] - mu) * rs * bb);
        }
      }
    });
  });
  if (need_dx) gin[0] = gx;
  if (need_dw) gin[1] = sum(pw, {0});
  if (need_db) gin[2] = sum(pb, {0});
}

// The same forward on the saved input: the output bit for bit.
static Tensor layer_norm_recompute(const Node& n) {
  return layer_norm(n.saved_tensor(0), n.saved_tensor(1), n.saved_tensor(4), n.f[0]);
}
static const OpDef layer_norm_op(
    "layer_norm", 3, "layer_norm(x (...,C), weight (C) or none, bias (C) or none, eps) over the last axis",
    "x, weight, mean, rstd, bias (the output is recomputed for ops that save it)", layer_norm_backward, [] {
      using samples::uniform;
      auto ln = [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], x[2]); };
      return std::vector<OpSample>{
          {"(3,5) affine", {uniform({3, 5}, 321, -2, 2), uniform({5}, 322, 0.5, 1.5), uniform({5}, 323)}, ln},
          {"(2,3,4) affine", {uniform({2, 3, 4}, 324, -2, 2), uniform({4}, 325, 0.5, 1.5), uniform({4}, 326)}, ln},
          {"(4,6) no affine", {uniform({4, 6}, 327, -2, 2)},
           [](const std::vector<Tensor>& x) { return layer_norm(x[0], Tensor(), Tensor()); }},
          {"(3,4) weight only", {uniform({3, 4}, 328, -2, 2), uniform({4}, 329, 0.5, 1.5)},
           [](const std::vector<Tensor>& x) { return layer_norm(x[0], x[1], Tensor()); }},
          {"non-contiguous (3,4) affine", {samples::strided({3, 4}, 330, -2, 2), uniform({4}, 331), uniform({4}, 332)},
           ln},
          {"(70,3) affine, more rows than a block",
           {uniform({70, 3}, 333, -2, 2), uniform({3}, 334, 0.5, 1.5), uniform({3}, 335)}, ln},
          {"(3,5) affine, squared: mul saves the output by reference",
           {uniform({3, 5}, 336, -2, 2), uniform({5}, 337, 0.5, 1.5), uniform({5}, 338)},
           [](const std::vector<Tensor>& x) {
             Tensor y = layer_norm(x[0], x[1], x[2]);
             return mul(y, y);
           }},
      };
    }, layer_norm_recompute);

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  ProfileScope prof("layer_norm");
  check_floating("layer_norm", x, "input");
  if (x.dim() == 0) throw ShapeError("layer_norm: input () has no feature axis to normalise");
  if (!(eps > 0)) throw ValueError(fmt::format("layer_norm: eps must be positive, got {}", eps));
  const int64_t C = x.shape().back(), R = x.numel() / std::max<int64_t>(C, 1);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    if (!(p->shape() == Shape{C}))
      throw ShapeError(fmt::format("layer_norm: {} {} does not match input {} ({} features)", what, p->shape(),
                                   x.shape(), C));
    if (p->dtype() != x.dtype())
      throw DTypeError(fmt::format("layer_norm: {} is {}, input {} is {}", what, dtype_name(p->dtype()), x.shape(),
                                   dtype_name(x.dtype())));
  }
  // x and weight are saved: a copy of a strided one is recorded (a clone
  // node off the backward path), so that a recorded backward differentiates
  // through it back to the original.
  Tensor xc = x.contiguous(), wc = weight.defined() ? weight.contiguous() : Tensor();
  Tensor bc = bias.defined() ? dense(bias) : Tensor();
  Tensor out = empty(x.shape(), x.dtype());
  Tensor mean = empty({R}, x.dtype()), rstd = empty({R}, x.dtype());
  detail::dispatch_float(x.dtype(), "layer_norm", [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    const T* xp = xc.data<T>();
    const T* wp = wc.defined() ? wc.data<T>() : nullptr;
    const T* bp = bc.defined() ? bc.data<T>() : nullptr;
    T *yp = out.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>();
    parallel_for(R, row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * C;
        T* yr = yp + r * C;
        const T mu = row_sum(xr, C) / static_cast<T>(C);
        T ss = 0;  // two passes: no cancellation for rows with a large mean
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
        const T rs = T(1) / std::sqrt(ss / static_cast<T>(C) + static_cast<T>(eps));
        mp[r] = mu;
        rp[r] = rs;
        if (wp && bp) {
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * wp[c] + bp[c];
        } else {  // separate passes: a select on a null pointer would not vectorise
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs;
          if (wp)
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) yr[c] *= wp[c];
          if (bp)
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) yr[c] += bp[c];
        }
      }
    });
  });
  if (Node* n = record(layer_norm_op, out, x, weight, bias)) {
    n->f[0] = eps;
    n->save(xc);
    n->save(wc);
    n->save(mean);
    n->save(rstd);
    n->save(bc);  // for layer_norm_recompute only
  }
  return out;
}

// ============================ dropout ============================
// Element i is dropped when the generator's counter-based uniform for it is
// below p, so the mask depends only on the generator state, not on threads.
// The saved mask holds 0 or 1/(1-p): backward is one multiply.
static void dropout_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor mask = n.saved_tensor(0);
  if (grad_enabled()) {  // recorded: linear in g, the mask a constant
    gin[0] = mul(g, mask);
    return;
  }
  gin[0] = empty(n.edges[0].shape, g.dtype());
  detail::dispatch_float(g.dtype(), "dropout", [&](auto tag) {
    using scalar_t = decltype(tag);
    detail::map2<scalar_t, scalar_t, scalar_t>(gin[0], g, mask, [](scalar_t a, scalar_t m) { return a * m; });
  });
}

static const OpDef dropout_op("dropout", 1, "dropout(x, p, training, generator) -> x * mask / (1 - p)",
                              "the scaled mask", dropout_backward, [] {
  // A fresh generator per call: every gradcheck evaluation sees the same mask.
  auto drop = [](double p, uint64_t seed) {
    return [p, seed](const std::vector<Tensor>& x) {
      Generator gen(seed);
      return dropout(x[0], p, true, &gen);
    };
  };
  return std::vector<OpSample>{
      {"(4,5) p 0.3 training", {samples::uniform({4, 5}, 341)}, drop(0.3, 7)},
      {"(2,3,4) p 0.5 training", {samples::uniform({2, 3, 4}, 342)}, drop(0.5, 8)},
      {"non-contiguous (3,4) p 0.2", {samples::strided({3, 4}, 343)}, drop(0.2, 9)},
  };
});

Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  ProfileScope prof("dropout");
  check_floating("dropout", x, "input");
  if (!(p >= 0.0 && p < 1.0))
    throw ValueError(fmt::format("dropout: probability p must be in [0, 1), got {} (input {})", p, x.shape()));
  if (!training || p == 0.0) return x;
  Generator& g = gen ? *gen : default_generator();
  const uint64_t first = g.reserve(static_cast<uint64_t>(x.numel()));
  // Dropped iff the 53-bit uniform draw u satisfies u < p * 2^53.
  const uint64_t threshold = static_cast<uint64_t>(p * 0x1.0p53);
  Tensor mask = empty(x.shape(), x.dtype());
  detail::dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using scalar_t = decltype(tag);
    using T = scalar_t;
    const T keep = static_cast<T>(1.0 / (1.0 - p));
    T* m = mask.data<T>();
    parallel_for(x.numel(), detail::kElementwiseGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) m[i] = (g.bits(first + i) >> 11) < threshold ? T(0) : keep;
    });
  });
  Tensor out = empty(x.shape(), x.dtype());
  detail::dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using scalar_t = decltype(tag);
    detail::map2<scalar_t, scalar_t, scalar_t>(out, x, mask, [](scalar_t a, scalar_t m) { return a * m; });
  });
  if (Node* n = record(dropout_op, out, x)) n->save(mask);
  return out;
}

void link_attention_ops();
void link_nn_ops() { link_attention_ops(); }

}  // namespace tg
