// Defining a brand-new differentiable op outside the library, in three steps:
//
//   1. one derivative rule, the backward: given the gradient of the output,
//      fill the gradient of each input that needs one (node.needs(k)),
//      reading what forward saved;
//   2. an OpDef: the op's name, arity, signature, what it saves (a struct
//      naming its fields), its backward;
//   3. a forward that computes the output without recording its inner ops,
//      then record()s itself on the tape and saves what backward needs.
//
// The engine derives the rest from the backward. Written with library ops, it
// is recorded under create_graph, so second and higher derivatives come free;
// and forward mode (jvp, forward-over-reverse Hessian-vector products) takes
// J v = d/du <J^T u, v>, the backward applied to a cotangent u and
// differentiated in u. That costs two backward passes of the op; an op on a
// hot path may add a tangent rule of its own (OpSpec::tangent).
//
// Then gradcheck compares the backward with finite differences in float64,
// gradgradcheck its second derivatives, and jvpcheck the derived tangent.
// The op here is swish(x) = x * sigmoid(x) (a.k.a. SiLU), recorded as a single
// node instead of the two (mul, sigmoid) the library would otherwise record.
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/op.h"

namespace {

// What forward saves: one struct, and its field list, which gives each field
// its name (what opcheck prints) and its slot.
struct SwishSaved {
  tg::Tensor x;  // the input
  static constexpr std::tuple fields{tg::saved_field("x", &SwishSaved::x)};
};

// 1. d/dx [x s(x)] = s + x s (1 - s), with s = sigmoid(x). Written with
// library ops, the backward is itself differentiable: under create_graph
// (second derivatives, Hessian-vector products) these ops are recorded.
void swish_backward(const tg::Node& node, const tg::Tensor& grad_out, std::span<tg::Tensor> grad_in) {
  if (!node.needs(0)) return;
  const tg::Tensor x = node.saved_tensor(&SwishSaved::x);  // throws if x was modified in place since
  tg::Tensor s = tg::sigmoid(x);
  grad_in[0] = grad_out * (s + x * s * (1.0 - s));
}

// 2. The OpDef. Defining it registers the op; a static one lives for the program.
// No samples: user ops are not part of the library's own op table test.
const tg::OpDef swish_op({.name = "swish", .arity = 1, .signature = "swish(x) -> x * sigmoid(x)",
                          .saves = tg::saves_of<SwishSaved>(), .backward = swish_backward});

// 3. The forward.
tg::Tensor swish(const tg::Tensor& x) {
  tg::Tensor out;
  {
    tg::NoGradGuard no_grad;  // the inner mul/sigmoid are not recorded...
    out = x * tg::sigmoid(x);
  }
  if (tg::Node* node = tg::record(swish_op, out, x)) node->save(SwishSaved{.x = x});  // ...swish is, once
  return out;
}

}  // namespace

int main() {
  // gradcheck wants float64 leaves that require grad.
  tg::Generator gen(42);
  tg::Tensor x = tg::randn({4, 5}, tg::DType::f64, &gen);
  x.requires_grad_();

  auto fn = [](const std::vector<tg::Tensor>& in) { return swish(in[0]); };
  tg::GradcheckReport report = tg::gradcheck(fn, {x});
  fmt::print("gradcheck of swish on {}:\n{}", x.shape(), report.str());
  // Second derivatives come free with a backward written in ops.
  tg::GradcheckReport twice = tg::gradgradcheck(fn, {x});
  fmt::print("gradgradcheck of swish:\n{}", twice.str());
  // Forward mode: J v from the tangent derived from the backward, against finite differences.
  tg::GradcheckReport forward = tg::jvpcheck(fn, {x});
  fmt::print("jvpcheck of swish:\n{}", forward.str());

  // The op works like any other: compose it, call backward, read .grad.
  tg::Tensor loss = tg::sum(swish(x * 2.0));
  loss.backward();
  fmt::print("loss = {:.6f}, |grad| sum = {:.6f}\n", loss.item<double>(), tg::sum(tg::abs(x.grad())).item<double>());

  const bool ok = report.passed && twice.passed && forward.passed;
  fmt::print("{}\n", ok ? "swish: gradcheck, gradgradcheck and jvpcheck passed" : "swish: a check FAILED");
  return ok ? 0 : 1;
}
