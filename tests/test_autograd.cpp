// The tape: backward, accumulation, retain_graph, freed graphs, version
// counters, no_grad, detach, needs-grad per input, deep chains, to_dot and
// the misuse errors with their messages.
#define BOOST_TEST_MODULE autograd
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <string>

#include "autograd/autograd.h"
#include "autograd/ops/rnn_ops.h"
#include "autograd/op.h"
#include "autograd/ops/samples.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;

namespace {

Tensor leaf(std::initializer_list<double> v) {
  Tensor t = tensor(v);
  t.requires_grad_();
  return t;
}

std::vector<double> grad_of(const Tensor& t) {
  BOOST_TEST_REQUIRE(t.grad().defined());
  return t.grad().to_vector<double>();
}

// Every test frees the graphs it recorded: nodes alive after it are a leak.
struct ClearTape {
  int64_t nodes0 = live_nodes();
  ~ClearTape() { BOOST_TEST(live_nodes() == nodes0); }
  int64_t recorded() const { return live_nodes() - nodes0; }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(autograd, ClearTape)

BOOST_AUTO_TEST_CASE(backward_on_scalar) {
  Tensor x = leaf({1.0, -2.0, 3.0});
  Tensor y = sum(mul(x, x));  // d/dx = 2x
  BOOST_TEST(y.item<double>() == 14.0);
  BOOST_TEST(recorded() == 2);  // mul, sum
  y.backward();
  BOOST_TEST(grad_of(x) == (std::vector<double>{2.0, -4.0, 6.0}), boost::test_tools::per_element());
  y = Tensor();
  BOOST_TEST(recorded() == 0);  // the graph goes with the last tensor that depends on it
}

BOOST_AUTO_TEST_CASE(backward_with_explicit_gradient) {
  Tensor x = leaf({1.0, 2.0, 3.0, 4.0, 5.0, 6.0});
  Tensor y = mul(x.reshape({2, 3}), 3.0);
  y.backward(from_vector(std::vector<double>{1, 0, 2, 0, -1, 0.5}, {2, 3}));
  BOOST_TEST(grad_of(x) == (std::vector<double>{3, 0, 6, 0, -3, 1.5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(backward_of_a_leaf_accumulates_the_gradient_itself) {
  Tensor x = leaf({1.0, 2.0});
  x.backward(tensor({0.5, 0.25}));
  x.backward(tensor({0.5, 0.25}));
  BOOST_TEST(grad_of(x) == (std::vector<double>{1.0, 0.5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(broadcast_gradients_are_reduced_to_input_shapes) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3, 1});
  Tensor b = from_vector(std::vector<double>{10, 20, 30, 40}, {4});
  a.requires_grad_();
  b.requires_grad_();
  sum(mul(a, b)).backward();
  BOOST_TEST(a.grad().shape() == (Shape{3, 1}));
  BOOST_TEST(b.grad().shape() == (Shape{4}));
  BOOST_TEST(grad_of(a) == (std::vector<double>{100, 100, 100}), boost::test_tools::per_element());
  BOOST_TEST(grad_of(b) == (std::vector<double>{6, 6, 6, 6}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(accumulation_tensor_used_twice) {
  Tensor a = leaf({2.0, 3.0});
  Tensor b = leaf({5.0, 7.0});
  // y = a*b + a*a + a: dy/da = b + 2a + 1, dy/db = a
  sum(add(add(mul(a, b), mul(a, a)), a)).backward();
  BOOST_TEST(grad_of(a) == (std::vector<double>{10.0, 14.0}), boost::test_tools::per_element());
  BOOST_TEST(grad_of(b) == (std::vector<double>{2.0, 3.0}), boost::test_tools::per_element());
  // A second backward adds (+=) into .grad; zeroing is explicit.
  sum(mul(a, b)).backward();
  BOOST_TEST(grad_of(a) == (std::vector<double>{15.0, 21.0}), boost::test_tools::per_element());
  a.zero_grad();
  BOOST_TEST(!a.grad().defined());
  sum(mul(a, b)).backward();
  BOOST_TEST(grad_of(a) == (std::vector<double>{5.0, 7.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(accumulation_does_not_write_into_a_gradient_the_caller_holds) {
  // The first gradient reaching a leaf may be the caller's tensor itself; later
  // accumulation must not modify that tensor.
  Tensor x = leaf({1.0, 2.0});
  Tensor g = tensor({1.0, 1.0});
  x.backward(g);
  x.backward(g);
  BOOST_TEST(g.to_vector<double>() == (std::vector<double>{1.0, 1.0}), boost::test_tools::per_element());
  BOOST_TEST(grad_of(x) == (std::vector<double>{2.0, 2.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(shared_weights_across_a_50_step_loop) {
  // h_{t+1} = tanh(w * h_t + c) with the same w every step; the gradient of
  // h_50 w.r.t. w is compared with a hand-written reverse pass.
  const double w0 = 0.9, c0 = 0.3;
  Tensor w = leaf({w0});
  Tensor c = leaf({c0});
  Tensor h = tensor({0.1});
  for (int t = 0; t < 50; ++t) h = tanh(add(mul(w, h), c));
  sum(h).backward();

  std::vector<double> hs{0.1};
  for (int t = 0; t < 50; ++t) hs.push_back(std::tanh(w0 * hs.back() + c0));
  double g = 1, dw = 0, dc = 0;
  for (int t = 49; t >= 0; --t) {
    double pre = g * (1 - hs[t + 1] * hs[t + 1]);
    dw += pre * hs[t];
    dc += pre;
    g = pre * w0;
  }
  BOOST_TEST(h.item<double>() == hs.back(), boost::test_tools::tolerance(1e-14));
  BOOST_TEST(w.grad().item<double>() == dw, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(c.grad().item<double>() == dc, boost::test_tools::tolerance(1e-12));
}

BOOST_AUTO_TEST_CASE(retain_graph_allows_a_second_backward) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = sum(mul(x, x));
  y.backward(Tensor(), /*retain_graph=*/true);
  BOOST_TEST(y.impl()->grad_fn->saved.empty());  // sum saves nothing
  BOOST_TEST(!y.impl()->grad_fn->edges[0].node->saved.empty());  // mul still holds x
  y.backward();
  BOOST_TEST(grad_of(x) == (std::vector<double>{4.0, 8.0}), boost::test_tools::per_element());
}

// layer_norm and gelu can rebuild their output, so an op that saves it (here
// mul, which saves both inputs) keeps only a reference: the output's memory is
// gone once the caller drops it, and backward still gives the same gradients
// as when the output is held (a clone cannot be rebuilt, so mul holds it).
BOOST_AUTO_TEST_CASE(outputs_of_recomputable_ops_are_saved_by_reference) {
  const Tensor x0 = samples::uniform({3, 5}, 11, -2, 2), w0 = samples::uniform({5}, 12, 0.5, 1.5),
               b0 = samples::uniform({5}, 13);
  auto make = [&](const Tensor& t) { return t.detach().clone().requires_grad_(); };
  const std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> ops[] = {
      [](const Tensor& x, const Tensor& w, const Tensor& b) { return layer_norm(x, w, b); },
      [](const Tensor& x, const Tensor&, const Tensor&) { return gelu(x); },
  };
  for (const auto& op : ops) {
    for (bool retain : {true, false}) {
      Tensor x = make(x0), w = make(w0), b = make(b0), x2 = make(x0), w2 = make(w0), b2 = make(b0);
      Tensor y2 = op(x2, w2, b2).clone();
      Tensor loss2 = sum(mul(mul(y2, y2), y2));
      BOOST_TEST(y2.impl_ptr().use_count() > 1);  // the clone is held by mul
      loss2.backward();
      Tensor y = op(x, w, b);
      std::weak_ptr<Storage> memory = y.storage();
      Tensor loss = sum(mul(mul(y, y), y));
      y = Tensor();
      BOOST_TEST(memory.expired());  // nothing held the output
      loss.backward(Tensor(), retain);
      BOOST_TEST(loss.item<double>() == loss2.item<double>());
      BOOST_TEST(grad_of(x) == grad_of(x2), boost::test_tools::per_element());
      if (retain) {  // a second backward rebuilds the output again: the gradient doubles
        loss.backward();
        std::vector<double> twice = grad_of(x2);
        for (double& v : twice) v *= 2;
        BOOST_TEST(grad_of(x) == twice, boost::test_tools::per_element());
      }
    }
  }
}

// Tape::backward hands each node its gradient, and a unary op's backward
// writes into it when nothing else holds it: the allocations of a backward
// pass through a chain of unary ops do not grow with the chain's length.
// An output written in place after its op ran (here without recording) no
// longer equals what a rebuild would give: it is saved as a tensor.
BOOST_AUTO_TEST_CASE(an_output_written_in_place_is_saved_as_a_tensor) {
  Tensor x = tensor({0.5, -1.0, 2.0}).requires_grad_();
  Tensor y = gelu(x);
  {
    NoGradGuard no_grad;
    y.add_(tensor({1.0, 1.0, 1.0}));
  }
  std::vector<double> yv = y.to_vector<double>();
  sum(mul(y, y)).backward();  // d/dx sum(y^2) = 2 y gelu'(x), with y as written
  Tensor x2 = tensor({0.5, -1.0, 2.0}).requires_grad_();
  sum(gelu(x2)).backward();  // gelu'(x)
  std::vector<double> expected = grad_of(x2);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] *= 2 * yv[i];
  BOOST_TEST(grad_of(x) == expected, boost::test_tools::tolerance(1e-14) << boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(unary_backward_reuses_the_gradient_buffer) {
  auto backward_allocations = [](int chain) {
    Tensor x = samples::uniform({64, 64}, 21).detach().requires_grad_();
    Tensor y = x;
    for (int i = 0; i < chain; ++i) y = i % 2 ? tanh(y) : gelu(y);
    Tensor loss = sum(y);
    y = Tensor();
    const uint64_t before = memory_stats().allocations;
    loss.backward();
    return memory_stats().allocations - before;
  };
  BOOST_TEST(backward_allocations(6) == backward_allocations(1));
}

BOOST_AUTO_TEST_CASE(second_backward_without_retain_graph_is_an_error) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = sum(mul(x, x));
  y.backward();
  check_throws<AutogradError>([&] { y.backward(); }, {"'mul'", "freed by an earlier backward", "retain_graph"});
  BOOST_TEST(grad_of(x) == (std::vector<double>{2.0, 4.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(backward_through_freed_buffers_is_an_error) {
  Tensor x = leaf({1.0, 2.0});
  Tensor z = mul(x, x);  // recorded on the first graph
  sum(z).backward();     // frees it
  Tensor loss = sum(mul(z, 2.0));  // a new graph on top of z's, whose mul was freed
  check_throws<AutogradError>([&] { loss.backward(); }, {"freed", "'mul'"});
  // detach() is the documented way to reuse such a value.
  Tensor loss2 = sum(mul(z.detach(), x));
  x.zero_grad();
  loss2.backward();
  BOOST_TEST(grad_of(x) == (std::vector<double>{1.0, 4.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(in_place_change_of_a_saved_tensor_is_detected) {
  Tensor x = leaf({1.0, 2.0});
  Tensor b = tensor({3.0, 4.0});  // no grad: mul saves it for x's gradient
  Tensor y = sum(mul(x, b));
  uint64_t v = b.version();
  b.fill_(5.0);
  BOOST_TEST(b.version() == v + 1);
  check_throws<AutogradError>([&] { y.backward(); }, {"mul", "modified in place", "(2)"});
  BOOST_TEST(!x.grad().defined());
}

BOOST_AUTO_TEST_CASE(in_place_change_through_a_view_is_detected) {
  Tensor x = leaf({1.0, 2.0, 3.0, 4.0});
  Tensor y = exp(x);  // saves its output
  Tensor loss = sum(y);
  y.detach().narrow(0, 1, 2).mul_(2.0);  // shares y's storage, so y's version moves
  check_throws<AutogradError>([&] { loss.backward(); }, {"exp", "modified in place"});
}

BOOST_AUTO_TEST_CASE(in_place_write_to_a_tensor_requiring_grad_is_refused) {
  Tensor x = leaf({1.0, 2.0});
  check_throws<AutogradError>([&] { x.fill_(0.0); }, {"fill_", "requires grad"});
  check_throws<AutogradError>([&] { x.add_(tensor({1.0, 1.0})); }, {"add_"});
  {
    NoGradGuard ng;  // as optimizers do
    x.add_(tensor({1.0, 1.0}), -0.5);
  }
  BOOST_TEST(x.to_vector<double>() == (std::vector<double>{0.5, 1.5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(no_grad_guard) {
  Tensor x = leaf({1.0, 2.0});
  BOOST_TEST(grad_enabled());
  {
    NoGradGuard ng;
    BOOST_TEST(!grad_enabled());
    Tensor y = mul(x, x);
    BOOST_TEST(!y.requires_grad());
    BOOST_TEST(recorded() == 0);
    {
      EnableGradGuard eg;
      BOOST_TEST(mul(x, x).requires_grad());
      {
        NoGradGuard inner;
        BOOST_TEST(!grad_enabled());
      }
      BOOST_TEST(grad_enabled());
    }
    BOOST_TEST(!grad_enabled());
    check_throws<AutogradError>([&] { sum(y).backward(); }, {"does not require grad"});
  }
  BOOST_TEST(grad_enabled());
}

BOOST_AUTO_TEST_CASE(detach_shares_data_and_cuts_the_graph) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = mul(x, 3.0);
  Tensor d = y.detach();
  BOOST_TEST(!d.requires_grad());
  BOOST_TEST(d.is_leaf());
  BOOST_TEST(d.storage() == y.storage());
  // d is a constant: only the direct path x -> mul contributes.
  sum(mul(d, x)).backward();
  BOOST_TEST(grad_of(x) == (std::vector<double>{3.0, 6.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(requires_grad_flags) {
  Tensor a = tensor({1.0, 2.0});
  Tensor b = tensor({3.0, 4.0});
  BOOST_TEST(!a.requires_grad());
  BOOST_TEST(!mul(a, b).requires_grad());
  BOOST_TEST(recorded() == 0);  // nothing recorded when no input requires grad
  b.requires_grad_();
  Tensor y = mul(a, b);
  BOOST_TEST(y.requires_grad());
  BOOST_TEST(!y.is_leaf());
  BOOST_TEST(b.is_leaf());
  BOOST_TEST(recorded() == 1);
  check_throws<AutogradError>([&] { y.requires_grad_(false); }, {"non-leaf", "detach"});
  check_throws<DTypeError>([] { tensor({int64_t{1}, int64_t{2}}).requires_grad_(); }, {"int64"});
  b.requires_grad_(false);
  BOOST_TEST(!b.requires_grad());
}

// A custom op whose backward records which gradients it was asked for.
int g_asked[2];
void probe_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  for (int k = 0; k < 2; ++k) {
    g_asked[k] += n.needs(k);
    if (n.needs(k)) gin[k] = g;
  }
}
const OpDef probe_op({.name = "test_probe", .arity = 2, .signature = "probe(a, b) -> a + b",
                      .saves = saves_of<NoSaved>(), .backward = probe_backward});
Tensor probe(const Tensor& a, const Tensor& b) {
  Tensor out = add(a.detach(), b.detach());
  record(probe_op, out, a, b);
  return out;
}

BOOST_AUTO_TEST_CASE(needs_grad_per_input) {
  Tensor a = leaf({1.0, 2.0});
  Tensor b = tensor({3.0, 4.0});
  g_asked[0] = g_asked[1] = 0;
  sum(probe(a, b)).backward();
  BOOST_TEST(g_asked[0] == 1);
  BOOST_TEST(g_asked[1] == 0);  // nobody needs b's gradient: backward is not asked for it
  BOOST_TEST(!b.grad().defined());
  BOOST_TEST(grad_of(a) == (std::vector<double>{1.0, 1.0}), boost::test_tools::per_element());

  // Through a built-in op: the node records which inputs need a gradient.
  Tensor y = mul(b, a);
  BOOST_TEST(!y.impl()->grad_fn->needs(0));
  BOOST_TEST(y.impl()->grad_fn->needs(1));
  a.zero_grad();
  sum(y).backward();
  BOOST_TEST(!b.grad().defined());
  BOOST_TEST(grad_of(a) == (std::vector<double>{3.0, 4.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(ten_thousand_step_chain_without_recursion) {
  const int steps = 10000;
  const double w0 = 0.5, c0 = 0.2;
  Tensor w = leaf({w0});
  Tensor c = leaf({c0});
  Tensor h = tensor({0.0});
  for (int t = 0; t < steps; ++t) h = tanh(add(mul(w, h), c));
  BOOST_TEST(recorded() == 3 * steps);
  sum(h).backward();

  std::vector<double> hs{0.0};
  for (int t = 0; t < steps; ++t) hs.push_back(std::tanh(w0 * hs.back() + c0));
  double g = 1, dw = 0, dc = 0;
  for (int t = steps - 1; t >= 0; --t) {
    double pre = g * (1 - hs[t + 1] * hs[t + 1]);
    dw += pre * hs[t];
    dc += pre;
    g = pre * w0;
  }
  BOOST_TEST(w.grad().item<double>() == dw, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(c.grad().item<double>() == dc, boost::test_tools::tolerance(1e-12));
  h = Tensor();  // frees 30,000 nodes, iteratively
  BOOST_TEST(recorded() == 0);
}

BOOST_AUTO_TEST_CASE(to_dot_lists_ops_shapes_and_dtypes) {
  Tensor x = randn({2, 3}, DType::f64);
  x.requires_grad_();
  Tensor w = randn({3}, DType::f32);
  w.requires_grad_();
  Tensor y = tanh(mul(x, x));
  Tensor z = sum(relu(w));
  std::string dot = to_dot({y, z});
  BOOST_TEST(dot.find("digraph") == 0u);
  for (const char* part : {"mul", "tanh", "relu", "sum", "(2,3)", "(3)", "float64", "float32", "leaf", "n1 -> n0"})
    BOOST_TEST(dot.find(part) != std::string::npos, "'" << part << "' not in:\n" << dot);
  BOOST_TEST(dot.back() == '\n');
  BOOST_TEST(dot.find("}") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(mixing_float32_and_float64_is_a_dtype_error) {
  Tensor a = ones({2, 3}, DType::f32);
  Tensor b = ones({2, 3}, DType::f64);
  for (auto f : {add, sub, mul, div, minimum, maximum})
    check_throws<DTypeError>([&] { f(a, b); }, {"float32", "float64", "(2,3)"});
  check_throws<DTypeError>([&] { add(a, b); }, {"add:"});
  // Conversion makes them compatible.
  BOOST_TEST(sum(add(a.to(DType::f64), b)).item<double>() == 12.0);
}

BOOST_AUTO_TEST_CASE(misuse_messages) {
  Tensor x = randn({2, 3}, DType::f64);
  x.requires_grad_();
  Tensor y = mul(x, 2.0);
  check_throws<AutogradError>([&] { y.backward(); }, {"not a scalar", "(2,3)"});
  check_throws<ShapeError>([&] { y.backward(ones({3, 2}, DType::f64)); }, {"(3,2)", "(2,3)"});
  check_throws<DTypeError>([&] { y.backward(ones({2, 3}, DType::f32)); }, {"float32", "float64"});
  check_throws<AutogradError>([] { Tensor().backward(); }, {"undefined"});
  check_throws<AutogradError>([] { ones({1}).backward(); }, {"does not require grad"});
  check_throws<ShapeError>([&] { x.set_grad(ones({3}, DType::f64)); }, {"(3)", "(2,3)"});
  // A failed backward leaves the graph usable: the right gradient works after.
  y.backward(ones({2, 3}, DType::f64));
  BOOST_TEST(sum(x.grad()).item<double>() == 12.0);
}

BOOST_AUTO_TEST_CASE(cast_is_differentiable_between_float_dtypes) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = x.to(DType::f32);
  BOOST_TEST((y.dtype() == DType::f32));
  sum(mul(y, y)).backward();
  BOOST_TEST((x.grad().dtype() == DType::f64));
  BOOST_TEST(grad_of(x) == (std::vector<double>{2.0, 4.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(node_gradient_arriving_as_a_broadcast_view_then_accumulated) {
  // z first receives sum's gradient (a broadcast of a scalar), then two more
  // from z * z: accumulation must not write into the broadcast view.
  Tensor x = leaf({0.1, -0.2, 0.3});
  Tensor z = exp(x);
  Tensor y = add(sum(mul(z, z)), sum(z));
  y.backward();
  std::vector<double> want;
  for (double v : {0.1, -0.2, 0.3}) want.push_back(std::exp(v) * (1 + 2 * std::exp(v)));
  BOOST_TEST(grad_of(x) == want, boost::test_tools::tolerance(1e-14) << boost::test_tools::per_element());
}

// An op whose backward returns a broadcast (stride-0) view it alone owns.
void bsum_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = full({1}, g.item<double>(), DType::f64).expand(n.edges[0].shape);
}
const OpDef bsum_op({.name = "test_bsum", .arity = 1, .signature = "bsum(x) -> sum(x)", .saves = saves_of<NoSaved>(),
                     .backward = bsum_backward});
Tensor bsum(const Tensor& x) {
  Tensor out = sum(x.detach());
  record(bsum_op, out, x);
  return out;
}

BOOST_AUTO_TEST_CASE(accumulating_into_a_broadcast_view_gradient) {
  Tensor x = leaf({0.1, -0.2, 0.3});
  Tensor z = exp(x);
  Tensor y = add(sum(mul(z, z)), bsum(z));  // z's first gradient is bsum's stride-0 view
  y.backward();
  std::vector<double> want;
  for (double v : {0.1, -0.2, 0.3}) want.push_back(std::exp(v) * (1 + 2 * std::exp(v)));
  BOOST_TEST(grad_of(x) == want, boost::test_tools::tolerance(1e-14) << boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(profiler_counts_forward_and_backward_calls) {
  profiler_reset();
  profiler_enable(true);
  Tensor x = leaf({1.0, 2.0, 3.0});
  for (int i = 0; i < 3; ++i) sum(tanh(mul(x, x))).backward();
  profiler_enable(false);
  mul(x, x);  // not timed: the profiler is off
  std::string report = profiler_report();
  // "tanh" forward 3 calls, "tanh (backward)" 3 calls, "mul" 3 calls (not 4).
  for (const char* row : {"tanh ", "tanh (backward)", "mul ", "mul (backward)", "total"})
    BOOST_TEST(report.find(row) != std::string::npos, "'" << row << "' not in:\n" << report);
  auto calls = [&](const std::string& op) {
    size_t p = report.find("\n" + op + " ");
    BOOST_TEST_REQUIRE(p != std::string::npos, op << " not in:\n" << report);
    return std::stoi(report.substr(p + 1 + 33, 9));  // after the newline, a 32-wide name and a space
  };
  BOOST_TEST(calls("mul") == 3);
  BOOST_TEST(calls("tanh (backward)") == 3);
  BOOST_TEST(profiler_totals().seconds > 0.0);
  // linear saves gelu's output by reference: its backward rebuilds it, and
  // that is reported as "gelu (recompute)", once per backward, not as linear's.
  profiler_reset();
  profiler_enable(true);
  Tensor w = ones({4, 3}, DType::f64).requires_grad_();
  for (int i = 0; i < 2; ++i) sum(linear(gelu(x), w)).backward();
  profiler_enable(false);
  report = profiler_report();
  BOOST_TEST(calls("gelu (recompute)") == 2);
  BOOST_TEST(calls("linear (backward)") == 2);
  BOOST_TEST(calls("gelu") == 2);
  BOOST_TEST(profiler_totals().flops == 2 * (2.0 * 4 * 3 + 2 * 2.0 * 4 * 3));  // forward + two backward GEMMs
  profiler_reset();
  BOOST_TEST(profiler_totals().seconds == 0.0);
}

BOOST_AUTO_TEST_CASE(profiler_counts_the_work_of_every_gemm) {
  // matmul (M,K)x(K,N): 2MNK. The fused RNN (T,B,H) with h0: T GEMMs of
  // (B,H)x(H,H) forward; backward T-1 for dh (h0 needs no gradient) and
  // T*B rows of (H,H) products for dW.
  profiler_reset();
  profiler_enable(true);
  matmul(ones({4, 5}), ones({5, 6}));
  BOOST_TEST(profiler_totals().flops == 2.0 * 4 * 5 * 6);
  profiler_reset();
  const int64_t T = 3, B = 2, H = 4;
  Tensor w = ones({H, H}).requires_grad_(), h0 = zeros({B, H});
  Tensor out = rnn_tanh_recurrence(zeros({T, B, H}), w, h0);
  BOOST_TEST(profiler_totals().flops == 2.0 * T * B * H * H);
  sum(out).backward();
  profiler_enable(false);
  BOOST_TEST(profiler_totals().flops == 2.0 * B * H * H * (T + (T - 1) + T));
  BOOST_TEST(profiler_totals().model_flops == profiler_totals().flops);
  // Attention's heads run on the pool's threads: their GEMMs count too.
  // Forward: q k^T and P v per head; backward: P^T g, g v^T, dS k, dS^T q,
  // and where the node did not keep P (more keys than 2 (D + Dv)), q k^T
  // again, which the model's FLOPs leave out (it rebuilds the forward's P).
  const int threads = num_threads();
  set_num_threads(2);
  for (const int64_t Tq : {16, 64}) {
    profiler_reset();
    profiler_enable(true);
    const int64_t Bq = 4, Hq = 8, D = 8;
    const bool rebuilt = Tq > 4 * D;
    Tensor q = ones({Bq, Hq, Tq, D}).requires_grad_();
    Tensor att = scaled_dot_product_attention(q, q, q, /*causal=*/true);
    const double head_gemm = 2.0 * Tq * Tq * D * Bq * Hq;
    BOOST_TEST(profiler_totals().flops == 2 * head_gemm);
    BOOST_TEST(profiler_totals().model_flops == 2 * head_gemm);
    sum(att).backward();
    BOOST_TEST(profiler_totals().flops == (rebuilt ? 7 : 6) * head_gemm, "Tq " << Tq);
    BOOST_TEST(profiler_totals().model_flops == 6 * head_gemm, "Tq " << Tq);
  }
  set_num_threads(threads);
  profiler_enable(false);
  profiler_reset();
}

BOOST_AUTO_TEST_CASE(profiler_times_each_gemm_shape) {
  const int threads = num_threads();
  set_num_threads(2);
  profiler_reset();
  profiler_enable(true);
  matmul(ones({4, 5}), ones({5, 6}));
  matmul(ones({4, 5}), ones({5, 6}));
  matmul(ones({4, 5}, DType::f64), ones({5, 6}, DType::f64));
  {
    AutocastGuard bf16(DType::bf16);
    matmul(ones({4, 5}), ones({6, 5}).transpose(0, 1));
  }
  matmul(ones({256, 64}), ones({64, 64}));  // 2^20 multiply-adds: split over both threads
  // Attention's per-head GEMMs run whole on the pool's workers: one thread each.
  scaled_dot_product_attention(ones({2, 2, 16, 8}), ones({2, 2, 16, 8}), ones({2, 2, 16, 8}));
  profiler_enable(false);
  matmul(ones({4, 5}), ones({5, 6}));  // not timed: the profiler is off
  auto find = [](std::string_view precision, bool tb, int64_t M, int64_t N, int64_t K) {
    for (const GemmShapeStats& g : profiler_gemm_shapes())
      if (g.precision == precision && !g.ta && g.tb == tb && g.M == M && g.N == N && g.K == K) return g;
    BOOST_FAIL(fmt::format("no {} GEMM {}x{}x{} (tb {}) in\n{}", precision, M, N, K, tb, profiler_gemm_report()));
    return GemmShapeStats{};
  };
  const GemmShapeStats f32 = find("f32", false, 4, 6, 5);
  BOOST_TEST(f32.calls == 2u);
  BOOST_TEST(f32.threads == 1);
  BOOST_TEST(f32.seconds > 0.0);
  BOOST_TEST(f32.gflops_per_thread() == 2.0 * 4 * 6 * 5 * 2 / f32.seconds / 1e9);
  BOOST_TEST(find("f64", false, 4, 6, 5).calls == 1u);
  BOOST_TEST(find("bf16", true, 4, 6, 5).calls == 1u);
  BOOST_TEST(find("f32", false, 256, 64, 64).threads == 2);
  const GemmShapeStats head = find("f32", true, 16, 16, 8);  // q k^T of each of the 4 heads
  BOOST_TEST(head.calls == 4u);
  BOOST_TEST(head.threads == 1);
  const std::string report = profiler_gemm_report(100.0);
  BOOST_TEST(report.find("4x6x5") != std::string::npos);
  BOOST_TEST(report.find("of peak") != std::string::npos);
  BOOST_TEST(profiler_gemm_report(0.0, 1).find("(other shapes)") != std::string::npos);
  profiler_reset();
  BOOST_TEST(profiler_gemm_shapes().empty());
  set_num_threads(threads);
}

// pow with a learnable exponent and a zero base: d/db a^b = a^b log a -> 0 at a = 0.
BOOST_AUTO_TEST_CASE(pow_gradient_at_a_zero_base) {
  const Tensor a = from_vector(std::vector<double>{0.0, 0.5, 2.0}, {3});
  const Tensor b = from_vector(std::vector<double>{2.0}, Shape{}).requires_grad_();
  const double want = 0.25 * std::log(0.5) + 4 * std::log(2.0);  // 2.5993
  for (bool create_graph : {false, true}) {
    const Tensor g = grad({sum(pow(a, b))}, {b}, {}, {.create_graph = create_graph})[0];
    BOOST_TEST(g.item<double>() == want, boost::test_tools::tolerance(1e-15));
  }
  // 0 ** 0: both gradients 0, as in PyTorch (not NaN and -inf).
  const Tensor z = zeros({}, DType::f64).requires_grad_(), e = zeros({}, DType::f64).requires_grad_();
  for (bool create_graph : {false, true}) {
    const std::vector<Tensor> g = grad({pow(z, e)}, {z, e}, {}, {.create_graph = create_graph});
    BOOST_TEST(g[0].item<double>() == 0.0);
    BOOST_TEST(g[1].item<double>() == 0.0);
  }
}
