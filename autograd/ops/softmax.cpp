// Softmax, log_softmax and cross_entropy, each one node on the tape whose
// backward reuses the probabilities forward saved instead of recomputing
// through primitive ops; and softmax_jvp, softmax's Jacobian product, the one
// op that softmax's backward and tangent and attention's recorded forms call.
//
// Kernels work on contiguous rows (the row kernels of nn_kernels.h
// vectorise); an op over a non-last axis swaps it with the last one, runs
// the row kernel and swaps back. Large inputs are split over threads by rows.
#include "autograd/ops/softmax.h"

#include <cmath>
#include <vector>

#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/view.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_floating, detail::dense, detail::exp_shifted, detail::row_grain, detail::row_max, detail::row_sum,
    detail::vexp;

// Applies row(x0, x1, out, n) to each row of n along axis a of x0 and x1 (of
// x0's shape, or undefined: x1 rows are null), out a new tensor. The last
// axis is used in place (the fast path); another is swapped with it, copied,
// and swapped back.
template <class F>
static Tensor map_rows(const char* op, const Tensor& x0, const Tensor& x1, int a, F&& row) {
  NoGradGuard untracked;
  const int64_t end = x0.dim() - 1, n = x0.dim() == 0 ? 1 : x0.shape()[a], rows = n == 0 ? 0 : x0.numel() / n;
  const bool last = x0.dim() == 0 || a == end;
  auto rows_of = [&](const Tensor& x) {
    return !x.defined() ? x : last ? dense(x) : transpose(x, a, end).contiguous();
  };
  const Tensor r0 = rows_of(x0), r1 = rows_of(x1);
  Tensor out = empty(r0.shape(), r0.dtype());
  dispatch_float(x0.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T *p0 = r0.data<T>(), *p1 = r1.defined() ? r1.data<T>() : nullptr;
    T* po = out.data<T>();
    parallel_for(rows, row_grain(n), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) row(p0 + i * n, p1 ? p1 + i * n : p1, po + i * n, n);
    });
  });
  return last ? out : transpose(out, a, end).contiguous();
}

// ============================ softmax / log_softmax ============================
namespace {
struct SoftmaxAttrs {
  int64_t axis;  // normalised; 0 for a 0-d input
};
struct SoftmaxSaved {
  Tensor output;  // the probabilities (softmax) or their log (log_softmax)
  static constexpr std::tuple fields{saved_field("output", &SoftmaxSaved::output)};
};
}  // namespace

// The softmax axis as a reduction's axis list (a 0-d input has no axis: the
// empty list reduces over all of it, i.e. the one element).
static Axes softmax_axes(const Tensor& y, int64_t axis) { return y.dim() == 0 ? Axes{} : Axes{axis}; }

// softmax: its Jacobian product at the saved probabilities (softmax_jvp),
// for the gradient and, the Jacobian symmetric, the tangent alike.
static void softmax_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = softmax_jvp(n.saved_tensor(&SoftmaxSaved::output), g, n.attrs<SoftmaxAttrs>().axis);
}

// log_softmax: gx = g - exp(y) * sum(g) along the axis; the engine derives
// the tangent from the recorded form.
static void log_softmax_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor y = n.saved_tensor(&SoftmaxSaved::output);
  gin[0] = sub(g, mul(exp(y), sum(g, softmax_axes(y, n.attrs<SoftmaxAttrs>().axis), true)));
}
static void log_softmax_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const int axis = static_cast<int>(n.attrs<SoftmaxAttrs>().axis);
  auto row = [](const auto* g, const auto* y, auto* gx, int64_t len) {
    const auto s = row_sum(g, len);
#pragma omp simd
    for (int64_t i = 0; i < len; ++i) gx[i] = g[i] - vexp(y[i]) * s;
  };
  gin[0] = map_rows("log_softmax", g, n.saved_tensor(&SoftmaxSaved::output), axis, row);
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

static const OpDef softmax_op({.name = "softmax", .arity = 1,
                               .signature = "softmax(x, axis) -> exp(x) / sum(exp(x)) along axis, max subtracted",
                               .saves = saves_of<SoftmaxSaved>(), .backward = softmax_backward,
                               .self_adjoint = true, .samples = softmax_samples<false>});
static const OpDef log_softmax_op({.name = "log_softmax", .arity = 1,
                                   .signature = "log_softmax(x, axis) -> x - logsumexp(x) along axis",
                                   .saves = saves_of<SoftmaxSaved>(), .backward = log_softmax_backward,
                                   .recorded_backward = log_softmax_backward_recorded,
                                   .samples = softmax_samples<true>});

// Records out = (log_)softmax(x) along axis a; the node keeps the output.
static void record_softmax(const OpDef& op, const Tensor& x, Tensor& out, int a) {
  if (Node* n = record(op, out, x)) {
    n->attrs<SoftmaxAttrs>() = {.axis = a};
    n->save(SoftmaxSaved{.output = out});
  }
}

template <bool Log>
static Tensor softmax_family(const Tensor& x, int64_t axis, const OpDef& op) {
  ProfileScope prof(op.name);
  check_floating(op.name, x, "input");
  const char* name = Log ? "log_softmax" : "softmax";
  const int a = x.dim() == 0 ? 0 : normalize_axis(axis, x.dim(), name);
  Tensor out = map_rows(name, x, Tensor(), a, [](const auto* x, const auto*, auto* y, int64_t n) {
    const auto m = row_max(x, n), s = exp_shifted(x, m, y, n);
    if constexpr (Log) {
      const auto lse = m + std::log(s);
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] = x[i] - lse;
    } else {
      const auto inv = 1 / s;
#pragma omp simd
      for (int64_t i = 0; i < n; ++i) y[i] *= inv;
    }
  });
  record_softmax(op, x, out, a);
  return out;
}
Tensor softmax(const Tensor& x, int64_t axis) { return softmax_family<false>(x, axis, softmax_op); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return softmax_family<true>(x, axis, log_softmax_op); }

// ============================ softmax_jvp ============================
// J v = y (v - sum(y v)) along the axis, J = diag(y) - y y^T at probabilities
// y. A linear primitive in v whose transpose is itself. In y it is not linear:
//   gradient: g (v - sum(y v)) - v sum(g y)
// in tensor ops, so recorded under create_graph like any backward; the engine
// derives the tangent from it.
namespace {
struct SoftmaxJvpSaved {
  Tensor y, v;
  static constexpr std::tuple fields{saved_field("y", &SoftmaxJvpSaved::y), saved_field("v", &SoftmaxJvpSaved::v)};
};
}  // namespace

static Tensor softmax_jvp_transpose(const Node& n, const Tensor& u) {
  return softmax_jvp(n.saved_tensor(&SoftmaxJvpSaved::y), u, n.attrs<SoftmaxAttrs>().axis);
}
static void softmax_jvp_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (!n.needs(0)) return;  // v's gradient is the transpose's (OpSpec::linear)
  const Tensor y = n.saved_tensor(&SoftmaxJvpSaved::y), v = n.saved_tensor(&SoftmaxJvpSaved::v);
  const Axes axes = softmax_axes(y, n.attrs<SoftmaxAttrs>().axis);
  gin[0] = sub(mul(g, sub(v, sum(mul(y, v), axes, true))), mul(v, sum(mul(g, y), axes, true)));
}
static const OpDef softmax_jvp_op({
    .name = "softmax_jvp",
    .arity = 2,
    .signature = "softmax_jvp(y, v, axis) -> y (v - sum(y v)) along axis: softmax's Jacobian at y times v",
    .saves = saves_of<SoftmaxJvpSaved>(),
    .backward = softmax_jvp_backward,
    .samples = [] {
      // y a softmax (rows summing to 1, as the op is used), detached into a leaf.
      auto probs = [](Shape s, uint64_t seed, int64_t axis) {
        return softmax(samples::uniform(s, seed, -2, 2), axis).detach().requires_grad_();
      };
      auto on = [](int64_t axis) {
        return [axis](const std::vector<Tensor>& x) { return softmax_jvp(x[0], x[1], axis); };
      };
      return std::vector<OpSample>{
          {"(3,5) axis -1", {probs({3, 5}, 311, -1), samples::uniform({3, 5}, 312)}, on(-1)},
          {"(2,3,4) axis 1", {probs({2, 3, 4}, 313, 1), samples::uniform({2, 3, 4}, 314)}, on(1)},
          {"non-contiguous v (3,4) axis -1", {probs({3, 4}, 315, -1), samples::strided({3, 4}, 316)}, on(-1)},
      };
    },
    .linear = {.input = 1, .transpose = softmax_jvp_transpose},
});

Tensor softmax_jvp(const Tensor& y, const Tensor& v, int64_t axis) {
  ProfileScope prof(softmax_jvp_op.name);
  check_floating(softmax_jvp_op.name, y, "y");
  check_floating(softmax_jvp_op.name, v, "v");
  if (!(y.shape() == v.shape()) || y.dtype() != v.dtype())
    throw ShapeError(fmt::format("{}: y {} {} and v {} {} must match", softmax_jvp_op.name, y.shape(),
                                 dtype_name(y.dtype()), v.shape(), dtype_name(v.dtype())));
  const int a = y.dim() == 0 ? 0 : normalize_axis(axis, y.dim(), "softmax_jvp");
  Tensor out = map_rows("softmax_jvp", y, v, a, [](const auto* y, const auto* v, auto* out, int64_t n) {
    detail::softmax_jacobian_row(y, v, out, n);
  });
  if (Node* node = record(softmax_jvp_op, out, y, v)) {
    node->attrs<SoftmaxAttrs>() = {.axis = a};
    node->save(SoftmaxJvpSaved{.y = y, .v = v});
  }
  return out;
}

// ============================ cross_entropy ============================
// Per position with target t over C classes and smoothing e (torch's formula):
//   loss = (1 - e) * (lse - x_t) + (e / C) * sum_c (lse - x_c)
//        = lse - (1 - e) x_t - (e / C) sum_c x_c
//   dloss/dx_c = p_c - (1 - e) [c == t] - e / C
// Ignored positions contribute 0 and are left out of the mean's count (all
// ignored: the mean is 0/0 = NaN, as in torch).
// (N,C,d...) logits are moved to rows (N*d..., C) first so one row kernel
// serves both layouts. The engine derives the tangent from the recorded backward.
namespace {
struct CrossEntropyAttrs {
  int64_t ignore_index;
  double label_smoothing;
  Reduction reduction;
  int64_t count;  // targets not ignored: the mean's denominator
};
struct CrossEntropySaved {
  // (R,C) softmax of the rows (recorded as the softmax of the logits' rows), (R) int64 targets
  Tensor probs, targets;
  static constexpr std::tuple fields{
      saved_field("probs", &CrossEntropySaved::probs), saved_field("targets", &CrossEntropySaved::targets)};
};
}  // namespace

// The axis order that moves (N,C,d...) logits to (N,d...,C): rows of classes.
static Shape classes_last(int rank) {
  Shape order{0};
  for (int d = 2; d < rank; ++d) order.push_back(d);
  order.push_back(1);
  return order;
}

// Plain: the formula above per row, in one pass.
static Tensor cross_entropy_grad_rows(const Node& n, const Tensor& g, const Tensor& p, const Tensor& targets) {
  const CrossEntropyAttrs& a = n.attrs<CrossEntropyAttrs>();
  const int64_t R = p.shape()[0], C = p.shape()[1], ignore = a.ignore_index;
  const Reduction reduction = a.reduction;
  Tensor gc = dense(g);
  Tensor gx = empty(p.shape(), p.dtype());
  dispatch_float(p.dtype(), n.op->name, [&](auto tag) {
    using T = decltype(tag);
    const T *pp = p.data<T>(), *gp = gc.data<T>();
    const int64_t* t = targets.data<int64_t>();
    T* out = gx.data<T>();
    const T scale = reduction == Reduction::mean ? T(1) / static_cast<T>(a.count) : T(1);
    const T smooth = static_cast<T>(a.label_smoothing / static_cast<double>(C));
    const T hit = static_cast<T>(1.0 - a.label_smoothing);
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
// The weight w is 0 on ignored rows by where(), not by keep: under the mean
// with every target ignored it is NaN, and 0 * NaN is not the plain form's 0.
static Tensor cross_entropy_grad_recorded(const Node& n, const Tensor& g, const Tensor& p, const Tensor& targets) {
  const CrossEntropyAttrs& a = n.attrs<CrossEntropyAttrs>();
  const int64_t R = p.shape()[0], C = p.shape()[1];
  const double eps = a.label_smoothing;
  Tensor q = zeros({R, C}, p.dtype()), keep = zeros({R, 1}, p.dtype()), ignored = ones({R, 1}, DType::i64);
  dispatch_float(p.dtype(), n.op->name, [&](auto tag) {
    using T = decltype(tag);
    const int64_t* t = targets.data<int64_t>();
    T *qp = q.data<T>(), *kp = keep.data<T>();
    int64_t* ip = ignored.data<int64_t>();
    for (int64_t r = 0; r < R; ++r) {
      if (t[r] == a.ignore_index) continue;
      kp[r] = T(1);
      ip[r] = 0;
      std::fill(qp + r * C, qp + (r + 1) * C, static_cast<T>(eps / static_cast<double>(C)));
      qp[r * C + t[r]] += static_cast<T>(1.0 - eps);
    }
  });
  // w: g per row (none), or the scalar g, over the count for the mean (all
  // ignored: every row is 0 anyway).
  Tensor w = a.reduction == Reduction::none ? reshape(g, {R, 1}) : g;
  if (a.reduction == Reduction::mean && a.count > 0) w = mul(w, 1.0 / static_cast<double>(a.count));
  if (a.count < R) w = where(ignored, zeros({}, w.dtype()), w);
  return mul(w, sub(mul(p, keep), q));
}

// The logits' gradient as (R, C) rows, by either form, back in the logits'
// layout: (N,d...,C) -> (N,C,d...).
template <Tensor (*Rows)(const Node&, const Tensor&, const Tensor&, const Tensor&)>
static void cross_entropy_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (!n.needs(0)) return;
  const Tensor gx = Rows(n, g, n.saved_tensor(&CrossEntropySaved::probs), n.saved_tensor(&CrossEntropySaved::targets));
  const Shape& ls = n.edges[0].shape;
  if (ls.size() <= 2) {
    gin[0] = reshape(gx, ls);
    return;
  }
  const Shape order = classes_last(ls.size());
  Shape moved;  // (N,d...,C)
  for (int64_t d : order) moved.push_back(ls[static_cast<int>(d)]);
  gin[0] = detail::unpermute(reshape(gx, moved), order).contiguous();
}

static const OpDef cross_entropy_op({
    .name = "cross_entropy",
    .arity = 2,
    .signature = "cross_entropy(logits (N,C[,d...]), targets (N[,d...]) int64, ignore_index, label_smoothing, "
                 "reduction)",
    .saves = saves_of<CrossEntropySaved>(),
    .backward = cross_entropy_backward<cross_entropy_grad_rows>,
    .recorded_backward = cross_entropy_backward<cross_entropy_grad_recorded>,
    .samples = [] {
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
    },
});

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, double label_smoothing,
                     Reduction reduction) {
  const std::string_view op = cross_entropy_op.name;
  ProfileScope prof(op);
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0))
    throw ValueError(fmt::format("{}: label_smoothing must be in [0, 1], got {}", op, label_smoothing));
  check_floating(op, logits, "logits");
  detail::check_defined(op, targets, "targets tensor");
  if (targets.dtype() != DType::i64)
    throw DTypeError(fmt::format("{}: targets must be int64 class indices, got {} {}", op, targets.shape(),
                                 dtype_name(targets.dtype())));
  const Shape& ls = logits.shape();
  if (ls.size() == 0) throw ShapeError(fmt::format("{}: logits () need a class axis: (C), (N,C) or (N,C,d...)", op));
  const int class_axis = ls.size() == 1 ? 0 : 1;
  Shape want = ls;
  want.erase(class_axis);
  if (!(targets.shape() == want))
    throw ShapeError(fmt::format("{}: logits {} need targets of shape {}, got {}", op, ls, want, targets.shape()));
  const int64_t R = want.numel(), C = ls[class_axis];
  if (C == 0) throw ShapeError(fmt::format("{}: logits {} have no classes", op, ls));
  // (R,C) rows of classes and (R) targets. With the logits recorded, these
  // views (and the copy) are recorded too; they save nothing.
  const Tensor rows = reshape((ls.size() > 2 ? permute(logits, classes_last(ls.size())) : logits).contiguous(), {R, C});
  const Tensor row_targets = reshape(targets.contiguous(), {R});
  const int64_t* t = row_targets.data<int64_t>();
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) {
    if (t[r] == ignore_index) continue;
    if (t[r] < 0 || t[r] >= C)
      throw IndexError(fmt::format("{}: target {} at position {} is out of range for {} classes "
                                   "(logits {}, targets {}, ignore_index {})",
                                   op, t[r], r, C, logits.shape(), targets.shape(), ignore_index));
    ++count;
  }
  const bool recording = may_record(logits);
  Tensor probs = recording ? empty({R, C}, logits.dtype()) : Tensor();
  Tensor losses = empty(targets.shape(), logits.dtype());
  dispatch_float(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* x = rows.data<T>();
    T* loss = losses.data<T>();
    T* p = recording ? probs.data<T>() : nullptr;
    const T smooth = static_cast<T>(label_smoothing / static_cast<double>(C));
    const T hit = static_cast<T>(1.0 - label_smoothing);
    parallel_for(R, row_grain(C), [&](int64_t r0, int64_t r1) {
      std::vector<T> scratch(p ? 0 : C);  // the exponentials, where no probabilities are kept
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = x + r * C;
        T* pr = p ? p + r * C : scratch.data();
        const T m = row_max(xr, C), s = exp_shifted(xr, m, pr, C);
        if (p) {  // keep the probabilities for backward
          const T inv = T(1) / s;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) pr[c] *= inv;
        }
        if (t[r] == ignore_index) {
          loss[r] = 0;
          continue;
        }
        T l = m + std::log(s) - hit * xr[t[r]];
        if (smooth != 0) l -= smooth * row_sum(xr, C);
        loss[r] = l;
      }
    });
  });
  // The probabilities are the softmax of the rows: recorded as such, they
  // carry the graph to the logits for a recorded backward, without keeping
  // the logits alive.
  if (recording) record_softmax(softmax_op, rows, probs, 1);
  Tensor out;
  if (reduction == Reduction::none) {
    out = losses;
  } else {
    double total = 0;  // summed serially in double: the same value at any thread count
    dispatch_float(logits.dtype(), op, [&](auto tag) {
      const auto* l = losses.data<decltype(tag)>();
      for (int64_t r = 0; r < R; ++r) total += l[r];
    });
    if (reduction == Reduction::mean) total /= static_cast<double>(count);
    out = full({}, total, logits.dtype());
  }
  if (Node* n = record(cross_entropy_op, out, logits, targets)) {
    n->attrs<CrossEntropyAttrs>() = {
        .ignore_index = ignore_index, .label_smoothing = label_smoothing, .reduction = reduction, .count = count};
    n->save(CrossEntropySaved{.probs = probs, .targets = row_targets});
  }
  return out;
}

}  // namespace tg
