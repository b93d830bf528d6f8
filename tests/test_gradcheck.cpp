// gradcheck itself: it passes on correct ops and FAILS on wrong ones (full and
// fast mode, non-contiguous re-run), reports the worst element, and proves the
// user-defined-op mechanism (a custom OpDef recorded from outside the library).
#define BOOST_TEST_MODULE gradcheck
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/loop.h"
#include "autograd/ops/samples.h"

using namespace tg;

namespace {

// The test ops below save their input x.
struct XSaved {
  Tensor x;
  static constexpr std::tuple fields{saved_field("x", &XSaved::x)};
};

// ---- a user-defined op, as examples/custom_op.cpp shows: swish(x) = x * sigmoid(x)
void swish_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  // d/dx x*s(x) = s + x*s*(1-s)
  const Tensor x = n.saved_tensor(&XSaved::x);
  Tensor s = sigmoid(x);
  gin[0] = mul(g, add(s, mul(mul(x, s), rsub(1.0, s))));
}
const OpDef swish_op({.name = "test_swish", .arity = 1, .signature = "swish(x) -> x * sigmoid(x)",
                      .saves = saves_of<XSaved>(), .backward = swish_backward});
Tensor swish(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;  // the forward's own ops are not recorded: swish is one node
    out = mul(x, sigmoid(x));
  }
  if (Node* n = record(swish_op, out, x)) n->save(XSaved{.x = x});
  return out;
}

// ---- a deliberately wrong op: y = x^3 with backward 3x (should be 3x^2)
void cube_wrong_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = mul(g, mul(n.saved_tensor(&XSaved::x), 3.0));
}
const OpDef cube_wrong_op({.name = "test_cube_wrong", .arity = 1, .signature = "cube(x) -> x^3, wrong backward",
                           .saves = saves_of<XSaved>(), .backward = cube_wrong_backward});
Tensor cube_wrong(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(mul(x, x), x);
  }
  if (Node* n = record(cube_wrong_op, out, x)) n->save(XSaved{.x = x});
  return out;
}

// ---- right for contiguous inputs only: backward reads the saved input as if it were dense
void square_dense_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(&XSaved::x);
  Tensor out = empty(x.shape(), DType::f64);
  const double* xp = x.data<double>();
  Tensor gc = g.contiguous();
  for (int64_t k = 0; k < x.numel(); ++k) out.data<double>()[k] = 2 * xp[k] * gc.data<double>()[k];
  gin[0] = out;
}
const OpDef square_dense_op({.name = "test_square_dense", .arity = 1,
                             .signature = "square(x), contiguous-only backward", .saves = saves_of<XSaved>(),
                             .backward = square_dense_backward});
Tensor square_dense(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(x, x);
  }
  if (Node* n = record(square_dense_op, out, x)) n->save(XSaved{.x = x});
  return out;
}

Tensor f64_leaf(const Shape& s, uint64_t seed) { return samples::uniform(s, seed); }

struct ClearTape {
  int64_t nodes0 = live_nodes();
  ~ClearTape() { BOOST_TEST(live_nodes() == nodes0); }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(gradcheck_suite, ClearTape)

BOOST_AUTO_TEST_CASE(passes_on_correct_ops) {
  Tensor a = f64_leaf({3, 4}, 1), b = f64_leaf({4}, 2);
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& x) { return tanh(mul(x[0], x[1])); }, {a, b});
  BOOST_TEST(r.passed, r.str());
  BOOST_TEST_REQUIRE(r.inputs.size() == 2u);
  for (const GradcheckInput& in : r.inputs) {
    BOOST_TEST(in.checked);
    BOOST_TEST(in.max_abs_error < 1e-8);
  }
  BOOST_TEST(r.inputs[1].shape == (Shape{4}));
  // The caller's tensors are untouched: no .grad, same values.
  BOOST_TEST(!a.grad().defined());
}

BOOST_AUTO_TEST_CASE(user_defined_op_passes) {
  Tensor x = f64_leaf({5, 3}, 3);
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& v) { return swish(v[0]); }, {x});
  BOOST_TEST(r.passed, r.str());
  BOOST_TEST(r.inputs[0].max_abs_error < 1e-8);
  // And its forward is right: swish(1) = 1 / (1 + e^-1).
  BOOST_TEST(swish(tensor({1.0})).item<double>() == 1.0 / (1.0 + std::exp(-1.0)), boost::test_tools::tolerance(1e-15));
  // It composes with library ops on the tape.
  Tensor y = sum(swish(mul(x, 2.0)));
  BOOST_TEST(y.impl()->grad_fn->edges[0].node->op == &swish_op);
  y.backward();
  BOOST_TEST(x.grad().shape() == x.shape());
}

BOOST_AUTO_TEST_CASE(fails_on_a_wrong_backward_and_fills_the_worst_element) {
  Tensor x = from_vector(std::vector<double>{0.5, -0.5, 2.0, 0.25}, {2, 2});
  x.requires_grad_();
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& v) { return cube_wrong(v[0]); }, {x});
  BOOST_TEST(!r.passed);
  const GradcheckInput& in = r.inputs[0];
  BOOST_TEST(!in.passed);
  // Worst element: x = 2 (index (1,0)), analytic 3x = 6, numeric 3x^2 = 12.
  BOOST_TEST(in.worst_index == (std::vector<int64_t>{1, 0}), boost::test_tools::per_element());
  BOOST_TEST(in.analytic == 6.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(in.numeric == 12.0, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(in.max_abs_error == 6.0, boost::test_tools::tolerance(1e-6));
  // Largest relative error: at 0.25 and -0.5, |3x - 3x^2| / 3x^2 = 3.
  BOOST_TEST(in.max_rel_error == 3.0, boost::test_tools::tolerance(1e-6));
  std::string s = r.str();
  BOOST_TEST(s.find("FAIL") != std::string::npos, s);
  BOOST_TEST(s.find("(1,0)") != std::string::npos, s);
}

BOOST_AUTO_TEST_CASE(fast_mode_on_a_larger_input) {
  Tensor x = f64_leaf({64, 48}, 4), w = f64_leaf({48}, 5);
  GradcheckOptions o;
  o.fast = true;
  o.directions = 3;
  auto fn = [](const std::vector<Tensor>& v) { return sigmoid(mul(v[0], v[1])); };
  GradcheckReport r = gradcheck(fn, {x, w}, o);
  BOOST_TEST(r.passed, r.str());
  BOOST_TEST(r.inputs[0].max_abs_error < 1e-7);
  // Fast mode catches a wrong backward too.
  Tensor big = f64_leaf({40, 30}, 6);
  GradcheckReport bad = gradcheck([](const std::vector<Tensor>& v) { return cube_wrong(v[0]); }, {big}, o);
  BOOST_TEST(!bad.passed);
  BOOST_TEST(bad.inputs[0].max_abs_error > 1e-3);
}

BOOST_AUTO_TEST_CASE(non_contiguous_rerun_catches_stride_bugs) {
  Tensor x = f64_leaf({3, 4}, 7);
  auto fn = [](const std::vector<Tensor>& v) { return square_dense(v[0]); };
  GradcheckOptions plain;
  plain.check_noncontiguous = false;
  BOOST_TEST(gradcheck(fn, {x}, plain).passed);  // right on dense inputs
  GradcheckReport r = gradcheck(fn, {x});
  BOOST_TEST(!r.passed);
  BOOST_TEST(r.inputs[0].note.find("non-contiguous") != std::string::npos, r.str());
  // A correct op passes the same re-run, also from a non-contiguous sample.
  BOOST_TEST(gradcheck([](const std::vector<Tensor>& v) { return mul(v[0], v[0]); }, {samples::strided({3, 4}, 8)}).passed);
}

BOOST_AUTO_TEST_CASE(output_not_depending_on_an_input_gives_zero_gradient) {
  Tensor a = f64_leaf({3}, 9), unused = f64_leaf({2}, 10);
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& v) { return exp(v[0]); }, {a, unused});
  BOOST_TEST(r.passed, r.str());
  BOOST_TEST(r.inputs[1].checked);
  BOOST_TEST(r.inputs[1].max_abs_error == 0.0);
  BOOST_TEST(r.inputs[1].note.find("zero") != std::string::npos, r.str());
  // A non-differentiable (int64) input is skipped, not failed.
  Tensor idx = samples::indices({2}, 3, 11);
  GradcheckReport r2 = gradcheck([](const std::vector<Tensor>& v) { return mul(v[0], 2.0); }, {a, idx});
  BOOST_TEST(r2.passed);
  BOOST_TEST(!r2.inputs[1].checked);
}

BOOST_AUTO_TEST_CASE(missing_gradient_is_a_failure) {
  // An op whose backward forgets an input that does influence the output.
  Tensor a = f64_leaf({3}, 12), b = f64_leaf({3}, 13);
  GradcheckReport r = gradcheck([](const std::vector<Tensor>& v) { return add(v[0], v[1].detach()) * v[1].detach(); },
                                {a, b});
  BOOST_TEST(r.inputs[0].passed);
  BOOST_TEST(!r.inputs[1].passed);
  BOOST_TEST(!r.passed);
}

BOOST_AUTO_TEST_CASE(raise_throws_gradcheck_error_with_the_report) {
  Tensor x = f64_leaf({2, 2}, 14);
  GradcheckOptions o;
  o.raise = true;
  try {
    gradcheck([](const std::vector<Tensor>& v) { return cube_wrong(v[0]); }, {x}, o);
    BOOST_ERROR("no GradcheckError");
  } catch (const GradcheckError& e) {
    BOOST_TEST(!e.report.passed);
    BOOST_TEST(e.report.inputs.size() == 1u);
    BOOST_TEST(std::string(e.what()).find("FAIL") != std::string::npos);
  }
  BOOST_CHECK_NO_THROW(gradcheck([](const std::vector<Tensor>& v) { return swish(v[0]); }, {x}, o));
}

BOOST_AUTO_TEST_CASE(input_errors) {
  Tensor f = ones({2}, DType::f32);
  f.requires_grad_();
  BOOST_CHECK_THROW(gradcheck([](const std::vector<Tensor>& v) { return mul(v[0], 2.0); }, {f}), DTypeError);
  Tensor x = f64_leaf({2}, 15);
  BOOST_CHECK_THROW(gradcheck([](const std::vector<Tensor>& v) { return v[0].to(DType::f32); }, {x}), DTypeError);
}

BOOST_AUTO_TEST_SUITE_END()
