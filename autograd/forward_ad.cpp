// The functional API over both modes: jvp, vjp, hvp, jacobian, hessian. The
// forward-AD mechanism itself (levels, dual tensors, running tangent rules)
// is in tape.cpp, where record() keeps the tangents.
#include "autograd/forward_ad.h"

#include <fmt/format.h>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/tape.h"

namespace tg {
namespace {

// `what` names what was passed, `against` what it must match one for one
// ("primals", "outputs").
void check_count(const char* api, const char* what, size_t got, const char* against, size_t want) {
  if (got != want) throw ValueError(fmt::format("{}: {} {} for {} {}", api, got, what, want, against));
}

// t, or zeros of like's shape where t is undefined (a zero tangent or gradient).
Tensor or_zeros(const Tensor& t, const Tensor& like) { return t.defined() ? t : zeros_like(like); }

// A one-hot tensor of t's shape and dtype: 1 at flat index k.
Tensor one_hot(const Tensor& t, int64_t k) {
  Tensor e = zeros({t.numel()}, t.dtype());
  NoGradGuard no_grad;
  e.narrow(0, k, 1).fill_(1.0);
  return reshape(e, t.shape());
}

// The single output of a scalar function.
Tensor scalar_output(const char* api, const std::vector<Tensor>& outs) {
  if (outs.size() != 1 || outs[0].numel() != 1)
    throw ShapeError(fmt::format("{}: the function must return one scalar, got {} outputs ({})", api, outs.size(),
                                 describe(outs)));
  return outs[0];
}

// Columns (or rows) of a Jacobian block, each flattened, joined into the block
// of shape out.shape + in.shape: `columns` stacks along the input axis.
Tensor jacobian_block(const std::vector<Tensor>& parts, const Tensor& out, const Tensor& in, bool columns) {
  std::vector<Tensor> flat;
  for (const Tensor& p : parts) flat.push_back(reshape(p, {-1}));
  Shape shape = out.shape();
  for (int64_t d : in.shape()) shape.push_back(d);
  if (flat.empty()) return zeros(shape, in.dtype());
  return reshape(stack(flat, columns ? 1 : 0).contiguous(), shape);
}

}  // namespace

JvpResult jvp(const TensorListFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents,
              bool create_graph) {
  check_count("jvp", "tangents", tangents.size(), "primals", primals.size());
  const bool keep = create_graph;  // the tangent rules recorded, the results left on the tape
  EnableGradGuard with_grad;
  ForwardADGuard level(keep);
  std::vector<Tensor> duals;
  for (size_t k = 0; k < primals.size(); ++k)
    duals.push_back(tangents[k].defined() ? make_dual(primals[k], tangents[k]) : primals[k]);
  JvpResult r;
  for (const Tensor& out : fn(duals)) {
    Tensor t = or_zeros(out.requires_grad() ? tangent(out) : Tensor(), out);
    r.outputs.push_back(keep ? out : out.detach());
    r.tangents.push_back(keep ? t : t.detach());
  }
  return r;
}

VjpResult vjp(const TensorListFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& cotangents,
              bool create_graph) {
  const bool keep = create_graph;
  EnableGradGuard with_grad;
  std::vector<Tensor> xs;
  for (const Tensor& p : primals) xs.push_back(p.requires_grad() ? p : p.detach().requires_grad_());
  std::vector<Tensor> outs = fn(xs);
  check_count("vjp", "cotangents", cotangents.size(), "outputs", outs.size());
  std::vector<Tensor> reached, seeds;
  for (size_t k = 0; k < outs.size(); ++k)
    if (outs[k].requires_grad()) reached.push_back(outs[k]), seeds.push_back(cotangents[k]);
  VjpResult r;
  std::vector<Tensor> grads(xs.size());
  if (!reached.empty()) grads = grad(reached, xs, seeds, {.create_graph = keep, .allow_unused = true});
  for (const Tensor& out : outs) r.outputs.push_back(keep ? out : out.detach());
  for (size_t k = 0; k < xs.size(); ++k) {
    Tensor g = or_zeros(grads[k], xs[k]);
    r.grads.push_back(keep ? g : g.detach());
  }
  return r;
}

HvpResult hvp(const TensorListFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& v) {
  check_count("hvp", "directions", v.size(), "primals", primals.size());
  EnableGradGuard with_grad;
  ForwardADGuard level(false);  // H v is not differentiated again: no graph of the tangents
  std::vector<Tensor> xs;
  // Parameters (leaves requiring grad) carry the tangent themselves, so fn may
  // reach them through a module; anything else is differentiated as a fresh leaf.
  for (size_t k = 0; k < primals.size(); ++k) {
    const Tensor& p = primals[k];
    xs.push_back(make_dual(p.requires_grad() && p.is_leaf() ? p : p.detach(), v[k]));
  }
  const Tensor y = scalar_output("hvp", fn(xs));
  HvpResult r;
  r.value = y.detach();
  // The tangent of the gradient along v is H v.
  GradTangents g = grad_and_tangents({y}, xs);
  for (size_t k = 0; k < xs.size(); ++k) {
    r.grads.push_back(or_zeros(g.grads[k], xs[k]).detach());
    r.hvp.push_back(or_zeros(g.tangents[k], xs[k]).detach());
  }
  return r;
}

std::vector<std::vector<Tensor>> jacobian(const TensorListFn& fn, const std::vector<Tensor>& inputs,
                                          const JacobianOptions& options) {
  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    outs = fn(inputs);
  }
  std::vector<std::vector<Tensor>> J(outs.size(), std::vector<Tensor>(inputs.size()));
  if (options.mode == JacobianMode::forward) {
    for (size_t j = 0; j < inputs.size(); ++j) {
      std::vector<std::vector<Tensor>> columns(outs.size());  // per output, one per element of input j
      for (int64_t e = 0; e < inputs[j].numel(); ++e) {
        std::vector<Tensor> tangents(inputs.size());
        tangents[j] = one_hot(inputs[j], e);
        JvpResult r = jvp(fn, inputs, tangents);
        for (size_t i = 0; i < outs.size(); ++i) columns[i].push_back(r.tangents[i]);
      }
      for (size_t i = 0; i < outs.size(); ++i) J[i][j] = jacobian_block(columns[i], outs[i], inputs[j], true);
    }
    return J;
  }
  for (size_t i = 0; i < outs.size(); ++i) {
    std::vector<std::vector<Tensor>> rows(inputs.size());  // per input, one per element of output i
    for (int64_t e = 0; e < outs[i].numel(); ++e) {
      std::vector<Tensor> cotangents;
      for (size_t o = 0; o < outs.size(); ++o) cotangents.push_back(o == i ? one_hot(outs[o], e) : zeros_like(outs[o]));
      VjpResult r = vjp(fn, inputs, cotangents);
      for (size_t j = 0; j < inputs.size(); ++j) rows[j].push_back(r.grads[j]);
    }
    for (size_t j = 0; j < inputs.size(); ++j) J[i][j] = jacobian_block(rows[j], outs[i], inputs[j], false);
  }
  return J;
}

std::vector<std::vector<Tensor>> hessian(const TensorListFn& fn, const std::vector<Tensor>& inputs) {
  std::vector<std::vector<Tensor>> H(inputs.size(), std::vector<Tensor>(inputs.size()));
  for (size_t j = 0; j < inputs.size(); ++j) {
    std::vector<std::vector<Tensor>> columns(inputs.size());
    for (int64_t e = 0; e < inputs[j].numel(); ++e) {
      std::vector<Tensor> v;
      for (size_t k = 0; k < inputs.size(); ++k) v.push_back(k == j ? one_hot(inputs[k], e) : zeros_like(inputs[k]));
      HvpResult r = hvp(fn, inputs, v);
      for (size_t i = 0; i < inputs.size(); ++i) columns[i].push_back(r.hvp[i]);
    }
    for (size_t i = 0; i < inputs.size(); ++i) H[i][j] = jacobian_block(columns[i], inputs[i], inputs[j], true);
  }
  return H;
}

}  // namespace tg
