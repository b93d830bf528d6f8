#include "autograd/gradcheck.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "autograd/forward_ad.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/tape.h"

namespace tg {
namespace {

// Pointer to the k-th element (row-major logical order) of a float64 tensor.
double* element(const Tensor& t, int64_t k) {
  int64_t off = 0;
  for (int d = t.dim() - 1; d >= 0; --d) {
    int64_t n = t.shape()[d];
    off += (k % n) * t.strides()[d];
    k /= n;
  }
  return static_cast<double*>(t.storage()->data) + t.offset() + off;
}

std::vector<int64_t> unravel(int64_t k, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int d = s.size() - 1; d >= 0; --d) {
    idx[d] = k % s[d];
    k /= s[d];
  }
  return idx;
}

// f(inputs) . u as a double, without recording.
double project(const TensorFn& fn, const std::vector<Tensor>& inputs, const Tensor& u) {
  NoGradGuard ng;
  Tensor out = fn(inputs);
  return sum(mul(out, u)).item<double>();
}

// Fresh leaves with the same values (so the caller's tensors keep no state).
std::vector<Tensor> fresh_leaves(const std::vector<Tensor>& inputs, bool noncontiguous) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      out.push_back(t);
      continue;
    }
    Tensor c;
    if (noncontiguous && t.dim() > 0 && t.numel() > 1) {
      // Same values, every element two places apart in a larger buffer.
      Tensor base = zeros({2 * t.numel()}, t.dtype());
      Shape strides = contiguous_strides(t.shape());
      for (int64_t& s : strides) s *= 2;
      c = make_view(base, t.shape(), strides, 0);
      NoGradGuard ng;
      c.copy_(t.detach());
    } else {
      c = t.detach().clone();
    }
    if (t.requires_grad()) c.requires_grad_();
    out.push_back(c);
  }
  return out;
}

// Gradients of f . u with respect to every input requiring grad (undefined
// where none requires it; zeros where the output does not reach it). Through
// grad(), so no input's .grad is touched.
std::vector<Tensor> analytic(const TensorFn& fn, const std::vector<Tensor>& leaves, const Tensor& u) {
  EnableGradGuard eg;
  Tensor out = fn(leaves);
  if (!(out.shape() == u.shape()))
    throw ShapeError(fmt::format("gradcheck: function output changed shape to {}", out.shape()));
  std::vector<Tensor> wrt;
  for (const Tensor& t : leaves)
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  std::vector<Tensor> g;
  if (out.requires_grad()) g = grad({out}, wrt, {u}, {.allow_unused = true});
  std::vector<Tensor> grads(leaves.size());
  for (size_t i = 0, k = 0; i < leaves.size(); ++i) {
    if (!leaves[i].defined() || !leaves[i].requires_grad()) continue;
    const Tensor gi = k < g.size() ? g[k] : Tensor();
    ++k;
    grads[i] = gi.defined() ? gi.contiguous() : zeros(leaves[i].shape(), DType::f64);
  }
  return grads;
}

void compare(GradcheckInput& r, double a, double n, const GradcheckOptions& o, std::vector<int64_t> where) {
  const double abs_err = std::abs(a - n);
  const bool ok = std::isfinite(a) && abs_err <= o.atol + o.rtol * std::abs(n);
  r.passed &= ok;
  r.max_rel_error = std::max(r.max_rel_error, abs_err / std::max(std::abs(n), o.atol));
  if (abs_err > r.max_abs_error || r.worst_index.empty() || !std::isfinite(a)) {
    r.max_abs_error = std::isfinite(a) ? abs_err : INFINITY;
    r.worst_index = std::move(where);
    r.analytic = a;
    r.numeric = n;
  }
}

// gradcheck's inputs: at least one requires grad, and those that do are float64.
void check_inputs(const std::vector<Tensor>& inputs) {
  if (std::none_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined() && t.requires_grad(); }))
    throw AutogradError(fmt::format("gradcheck: none of the {} inputs requires grad, so there is nothing to check",
                                    inputs.size()));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (t.defined() && t.requires_grad() && t.dtype() != DType::f64)
      throw DTypeError(fmt::format("gradcheck: input {} is {}; gradcheck needs float64 inputs (use .to(DType::f64))",
                                   i, dtype_name(t.dtype())));
  }
}

// The shape of fn(leaves), which must be float64.
Shape float64_output_shape(const TensorFn& fn, const std::vector<Tensor>& leaves) {
  NoGradGuard ng;
  Tensor out = fn(leaves);
  if (out.dtype() != DType::f64)
    throw DTypeError(fmt::format("gradcheck: the function returned {}, expected float64", dtype_name(out.dtype())));
  return out.shape();
}

// One entry per input, passing until a comparison fails; checked where it requires grad.
GradcheckReport unchecked_report(const std::vector<Tensor>& leaves) {
  GradcheckReport report;
  for (size_t i = 0; i < leaves.size(); ++i) {
    GradcheckInput r;
    r.index = static_cast<int>(i);
    r.shape = leaves[i].defined() ? leaves[i].shape() : Shape();
    r.checked = leaves[i].defined() && leaves[i].requires_grad();
    report.inputs.push_back(r);
  }
  return report;
}

// Full mode: the whole Jacobian. Analytic rows by one backward per output
// element, numeric columns by two forwards per input element.
void check_jacobian(const TensorFn& fn, const std::vector<Tensor>& leaves, const Shape& out_shape,
                    const GradcheckOptions& o, GradcheckReport& report) {
  const int64_t n_out = out_shape.numel();
  std::vector<std::vector<Tensor>> rows;
  for (int64_t j = 0; j < n_out; ++j) {
    Tensor u = zeros(out_shape, DType::f64);
    u.data<double>()[j] = 1.0;
    rows.push_back(analytic(fn, leaves, u));
  }
  for (size_t i = 0; i < leaves.size(); ++i) {
    GradcheckInput& r = report.inputs[i];
    if (!r.checked) continue;
    const Tensor& x = leaves[i];
    bool any_grad = false;
    for (int64_t k = 0; k < x.numel(); ++k) {
      double* p = element(x, k);
      const double x0 = *p;
      // Numeric column: (f(x + eps) - f(x - eps)) / 2 eps, every output at once.
      Tensor plus, minus;
      {
        NoGradGuard ng;
        *p = x0 + o.eps;
        plus = fn(leaves).clone();  // clone: a view output would alias x
        *p = x0 - o.eps;
        minus = fn(leaves).clone();
        *p = x0;
      }
      for (int64_t j = 0; j < n_out; ++j) {
        double num = (plus.data<double>()[j] - minus.data<double>()[j]) / (2 * o.eps);
        double ana = rows[j][i].data<double>()[k];
        any_grad |= ana != 0;
        compare(r, ana, num, o, unravel(k, x.shape()));
      }
    }
    if (!any_grad) r.note = "gradient is zero everywhere";
  }
}

// f(leaves with x_i + scale * v) . u, restoring x_i afterwards.
double project_perturbed(const TensorFn& fn, const std::vector<Tensor>& leaves, size_t i, const Tensor& v,
                         double scale, const Tensor& u) {
  const Tensor& x = leaves[i];
  std::vector<double> saved(x.numel());
  for (int64_t k = 0; k < x.numel(); ++k) {
    double* p = element(x, k);
    saved[k] = *p;
    *p += scale * v.data<double>()[k];
  }
  double val = project(fn, leaves, u);
  for (int64_t k = 0; k < x.numel(); ++k) *element(x, k) = saved[k];
  return val;
}

// Fast mode: u^T J v along random directions u (output) and v (each input).
void check_directions(const TensorFn& fn, const std::vector<Tensor>& leaves, const Shape& out_shape,
                      const GradcheckOptions& o, Generator& gen, GradcheckReport& report) {
  for (int d = 0; d < o.directions; ++d) {
    Tensor u = randn(out_shape, DType::f64, &gen);
    std::vector<Tensor> g = analytic(fn, leaves, u);
    for (size_t i = 0; i < leaves.size(); ++i) {
      GradcheckInput& r = report.inputs[i];
      if (!r.checked) continue;
      Tensor v = randn(leaves[i].shape(), DType::f64, &gen);
      double ana = sum(mul(g[i], v)).item<double>();
      double num =
          (project_perturbed(fn, leaves, i, v, o.eps, u) - project_perturbed(fn, leaves, i, v, -o.eps, u)) /
          (2 * o.eps);
      compare(r, ana, num, o, {d});
    }
  }
}

// The same backward through non-contiguous copies of the inputs must give the
// same gradients (bit for bit, up to 1e-12 relative).
void check_noncontiguous(const TensorFn& fn, const std::vector<Tensor>& leaves, const Shape& out_shape,
                         Generator& gen, GradcheckReport& report) {
  Tensor u = randn(out_shape, DType::f64, &gen);
  std::vector<Tensor> dense = analytic(fn, leaves, u);
  std::vector<Tensor> strided = analytic(fn, fresh_leaves(leaves, true), u);
  for (size_t i = 0; i < leaves.size(); ++i) {
    GradcheckInput& r = report.inputs[i];
    if (!r.checked) continue;
    for (int64_t k = 0; k < leaves[i].numel(); ++k) {
      double a = strided[i].data<double>()[k], b = dense[i].data<double>()[k];
      if (std::abs(a - b) > 1e-12 * (1 + std::abs(b))) {
        r.passed = false;
        r.note = fmt::format("non-contiguous input gives a different gradient at element {} ({} vs {})", k, a, b);
        break;
      }
    }
  }
}

// The positions of the inputs that require grad.
std::vector<size_t> requiring_grad(const std::vector<Tensor>& inputs) {
  std::vector<size_t> wrt;
  for (size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined() && inputs[i].requires_grad()) wrt.push_back(i);
  return wrt;
}

// fn's backward as a function of (x_0 .. x_{n-1}, u): the gradients of
// fn(x) . u with respect to the inputs at `wrt`, recorded (create_graph) and
// flattened into one vector. Its derivatives with respect to the inputs are
// fn's second derivatives; with respect to u, the first ones again.
TensorFn backward_as_function(const TensorFn& fn, std::vector<size_t> wrt, size_t n) {
  return [&fn, wrt = std::move(wrt), n](const std::vector<Tensor>& x) {
    std::vector<Tensor> xs(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n)), wrt_x;
    for (size_t i : wrt) wrt_x.push_back(x[i]);
    EnableGradGuard eg;  // gradcheck evaluates it under no_grad too: the inner grad() needs a graph
    Tensor out = fn(xs);
    std::vector<Tensor> parts;
    std::vector<Tensor> g =
        out.requires_grad() ? grad({out}, wrt_x, {x[n]}, {.create_graph = true, .allow_unused = true})
                            : std::vector<Tensor>(wrt_x.size());
    for (size_t k = 0; k < wrt.size(); ++k) {
      // An input the output does not reach has a zero gradient, constant in everything.
      Tensor gk = g[k].defined() ? g[k] : zeros(wrt_x[k].shape(), DType::f64);
      parts.push_back(reshape(gk, {gk.numel()}));
    }
    return concat(parts, 0);
  };
}

// jvpcheck: J v by forward mode against the central difference of fn along v
// (v one-hot in full mode, random in fast mode), every output element.
void check_tangents(const TensorFn& fn, const std::vector<Tensor>& leaves, const GradcheckOptions& o, Generator& gen,
                    GradcheckReport& report) {
  const TensorListFn as_list = [&fn](const std::vector<Tensor>& x) { return std::vector<Tensor>{fn(x)}; };
  for (size_t i = 0; i < leaves.size(); ++i) {
    GradcheckInput& r = report.inputs[i];
    if (!r.checked) continue;
    const Tensor& x = leaves[i];
    const int64_t n_dirs = o.fast ? o.directions : x.numel();
    bool any_tangent = false;
    for (int64_t d = 0; d < n_dirs; ++d) {
      Tensor v = zeros(x.shape(), DType::f64);
      if (o.fast)
        v = randn(x.shape(), DType::f64, &gen);
      else
        v.data<double>()[d] = 1.0;
      std::vector<Tensor> tangents(leaves.size());
      tangents[i] = v;
      const Tensor jv = jvp(as_list, leaves, tangents).tangents[0].contiguous();
      std::vector<double> saved(x.numel());
      Tensor plus, minus;
      {
        NoGradGuard ng;
        for (int64_t k = 0; k < x.numel(); ++k) saved[k] = *element(x, k);
        for (int64_t k = 0; k < x.numel(); ++k) *element(x, k) = saved[k] + o.eps * v.data<double>()[k];
        plus = fn(leaves).contiguous().clone();
        for (int64_t k = 0; k < x.numel(); ++k) *element(x, k) = saved[k] - o.eps * v.data<double>()[k];
        minus = fn(leaves).contiguous().clone();
        for (int64_t k = 0; k < x.numel(); ++k) *element(x, k) = saved[k];
      }
      for (int64_t j = 0; j < jv.numel(); ++j) {
        const double num = (plus.data<double>()[j] - minus.data<double>()[j]) / (2 * o.eps);
        const double ana = jv.data<double>()[j];
        any_tangent |= ana != 0;
        compare(r, ana, num, o, o.fast ? std::vector<int64_t>{d} : unravel(d, x.shape()));
      }
    }
    if (!any_tangent) r.note = "tangent is zero everywhere";
  }
}

}  // namespace

GradcheckError::GradcheckError(GradcheckReport r) : std::runtime_error("gradcheck failed:\n" + r.str()), report(std::move(r)) {}

std::string GradcheckReport::str() const {
  std::string out = fmt::format("{:<6} {:<14} {:>12} {:>12} {:>18} {:>14} {:>14}  {}\n", "input", "shape", "max abs",
                                "max rel", "worst at", "analytic", "numeric", "result");
  for (const GradcheckInput& in : inputs) {
    if (!in.name.empty()) out += fmt::format("{}:\n", in.name);
    if (!in.checked) {
      out += fmt::format("{:<6} {:<14} {:>12} {:>12} {:>18} {:>14} {:>14}  skipped ({})\n", in.index, in.shape.str(),
                         "", "", "", "", "", in.note.empty() ? "no grad" : in.note);
      continue;
    }
    out += fmt::format("{:<6} {:<14} {:>12.3e} {:>12.3e} {:>18} {:>14.6e} {:>14.6e}  {}{}\n", in.index,
                       in.shape.str(), in.max_abs_error, in.max_rel_error,
                       fmt::format("({})", fmt::join(in.worst_index, ",")), in.analytic, in.numeric,
                       in.passed ? "pass" : "FAIL", in.note.empty() ? "" : " — " + in.note);
  }
  return out;
}

GradcheckReport gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& o) {
  check_inputs(inputs);
  std::vector<Tensor> leaves = o.in_place ? inputs : fresh_leaves(inputs, false);
  const Shape out_shape = float64_output_shape(fn, leaves);
  Generator gen(o.seed ^ 0x9e3779b97f4a7c15ULL);
  GradcheckReport report = unchecked_report(leaves);
  if (o.fast)
    check_directions(fn, leaves, out_shape, o, gen, report);
  else
    check_jacobian(fn, leaves, out_shape, o, report);
  if (o.check_noncontiguous && !o.in_place) check_noncontiguous(fn, leaves, out_shape, gen, report);
  for (const GradcheckInput& r : report.inputs) report.passed &= r.passed;
  if (!report.passed && o.raise) throw GradcheckError(report);
  return report;
}

GradcheckReport jvpcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& o) {
  check_inputs(inputs);
  std::vector<Tensor> leaves = fresh_leaves(inputs, false);
  float64_output_shape(fn, leaves);
  Generator gen(o.seed ^ 0xbb67ae8584caa73bULL);
  GradcheckReport report = unchecked_report(leaves);
  check_tangents(fn, leaves, o, gen, report);
  for (const GradcheckInput& r : report.inputs) report.passed &= r.passed;
  if (!report.passed && o.raise) throw GradcheckError(report);
  return report;
}

GradcheckReport gradgradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& o) {
  std::vector<size_t> wrt = requiring_grad(inputs);
  if (wrt.empty())
    throw AutogradError(fmt::format(
        "gradgradcheck: none of the {} inputs requires grad, so there is nothing to check", inputs.size()));
  Shape out_shape;
  {
    NoGradGuard ng;
    out_shape = fn(inputs).shape();
  }
  // The backward, gradchecked as a whole at a random output gradient u.
  Generator gen(o.seed ^ 0x6a09e667f3bcc909ULL);
  Tensor u = randn(out_shape, DType::f64, &gen);
  u.requires_grad_();
  std::vector<Tensor> all = inputs;
  all.push_back(u);
  GradcheckOptions inner = o;
  inner.raise = false;
  GradcheckReport report = gradcheck(backward_as_function(fn, std::move(wrt), inputs.size()), all, inner);
  report.inputs.back().name = "grad_output";
  if (!report.passed && o.raise) throw GradcheckError(report);
  return report;
}

}  // namespace tg
