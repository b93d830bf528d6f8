// The autograd engine's semantics: who owns a graph and when it is freed,
// grad() with respect to chosen tensors, derivatives of higher order, hooks,
// and the errors of misuse.
#define BOOST_TEST_MODULE graph
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/samples.h"
#include "nn/gradcheck_module.h"
#include "nn/linear.h"
#include "tests/testing.h"

using namespace tg;
using testing::check_throws;

namespace {

Tensor leaf(std::vector<double> v) {
  Tensor t = from_vector(v, {static_cast<int64_t>(v.size())});
  t.requires_grad_();
  return t;
}

std::vector<double> values(const Tensor& t) {
  BOOST_TEST_REQUIRE(t.defined());
  return t.contiguous().to_vector<double>();
}

// Every test frees what it recorded: a node alive after it is a leak.
struct NoLeak {
  int64_t nodes0 = live_nodes();
  ~NoLeak() { BOOST_TEST(live_nodes() == nodes0); }
};

}  // namespace

BOOST_FIXTURE_TEST_SUITE(graph, NoLeak)

// ---------------------------------------------------------------- lifetime
BOOST_AUTO_TEST_CASE(two_independent_losses_backpropagate_one_after_the_other) {
  Tensor a = leaf({1.0, 2.0}), b = leaf({3.0, -1.0});
  Tensor la = sum(mul(a, a));
  Tensor lb = sum(mul(b, b));
  la.backward();  // frees la's graph only
  lb.backward();
  BOOST_TEST(values(a.grad()) == (std::vector<double>{2.0, 4.0}), boost::test_tools::per_element());
  BOOST_TEST(values(b.grad()) == (std::vector<double>{6.0, -2.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_loss_in_pieces_backpropagated_piece_by_piece) {
  // Gradient accumulation over micro-batches: each piece has its own graph.
  Tensor w = leaf({0.5, -0.25});
  std::vector<Tensor> pieces;
  for (int k = 1; k <= 3; ++k) pieces.push_back(sum(mul(w, static_cast<double>(k))));
  for (Tensor& p : pieces) p.backward();
  BOOST_TEST(values(w.grad()) == (std::vector<double>{6.0, 6.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(discarded_forwards_are_freed_with_their_last_tensor) {
  nn::Linear fc({.in = 16, .out = 16});
  Tensor x = randn({8, 16});
  const MemoryStats before = memory_stats();
  const int64_t nodes = live_nodes();
  for (int k = 0; k < 200; ++k) {
    Tensor loss = sum(tanh(fc(x)));  // recorded (fc's weight requires grad), never backpropagated
    BOOST_TEST(live_nodes() == nodes + 3);
  }
  BOOST_TEST(live_nodes() == nodes);
  BOOST_TEST(memory_stats().bytes_in_use == before.bytes_in_use);
}

BOOST_AUTO_TEST_CASE(backward_frees_saved_tensors_but_not_other_graphs) {
  Tensor x = leaf({1.0, 2.0});
  Tensor keep = mul(x, x);          // another graph on the same thread
  Tensor y = sum(mul(x, 3.0) * x);  // mul_scalar, mul, sum
  y.backward();
  BOOST_TEST(!keep.impl()->grad_fn->saved.empty());  // untouched
  sum(keep).backward();
  BOOST_TEST(values(x.grad()) == (std::vector<double>{8.0, 16.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_graph_backpropagated_twice_without_retain_graph_names_the_op) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = sum(tanh(x));
  y.backward();
  check_throws<AutogradError>([&] { y.backward(); }, {"'tanh'", "freed by an earlier backward", "retain_graph"});
  Tensor z = leaf({1.0});
  Tensor w = sum(tanh(z));
  w.backward(Tensor(), /*retain_graph=*/true);
  w.backward();  // retained: fine
  BOOST_TEST(z.grad().item<double>() == 2 * (1 - std::pow(std::tanh(1.0), 2)), boost::test_tools::tolerance(1e-15));
}

// ---------------------------------------------------------------- grad()
BOOST_AUTO_TEST_CASE(grad_returns_gradients_and_touches_no_grad_field) {
  Tensor x = leaf({1.0, 2.0, 3.0}), w = leaf({0.5, -1.0, 2.0});
  Tensor h = mul(x, w);  // a non-leaf input too
  Tensor loss = sum(mul(h, h));
  std::vector<Tensor> g = grad({loss}, {x, h}, {}, {.retain_graph = true});
  BOOST_TEST(values(g[0]) == (std::vector<double>{0.5, 4.0, 24.0}), boost::test_tools::per_element());  // 2 w^2 x
  BOOST_TEST(values(g[1]) == (std::vector<double>{1.0, -4.0, 12.0}), boost::test_tools::per_element());  // 2h
  BOOST_TEST(!x.grad().defined());
  BOOST_TEST(!w.grad().defined());
  BOOST_TEST(!g[0].requires_grad());  // no create_graph: plain tensors
}

BOOST_AUTO_TEST_CASE(grad_of_an_unused_input) {
  Tensor x = leaf({1.0}), unused = leaf({2.0});
  Tensor y = sum(mul(x, 2.0));
  check_throws<AutogradError>([&] { grad({y}, {x, unused}, {}, {.retain_graph = true}); },
                              {"input 1", "not reached", "allow_unused"});
  std::vector<Tensor> g = grad({y}, {x, unused}, {}, {.allow_unused = true});
  BOOST_TEST(g[0].item<double>() == 2.0);
  BOOST_TEST(!g[1].defined());
}

BOOST_AUTO_TEST_CASE(grad_with_several_outputs_and_output_gradients) {
  Tensor x = leaf({1.0, 2.0});
  Tensor a = mul(x, x), b = mul(x, 3.0);
  std::vector<Tensor> g = grad({a, b}, {x}, {tensor({1.0, 0.5}), tensor({2.0, 2.0})});
  BOOST_TEST(values(g[0]) == (std::vector<double>{2.0 + 6.0, 2.0 + 6.0}), boost::test_tools::per_element());
}

// ---------------------------------------------------------------- higher order
BOOST_AUTO_TEST_CASE(hessian_vector_product_by_double_backward) {
  // f = sum(x^3) -> grad 3x^2, Hessian diag(6x): H v = 6 x v.
  Tensor x = leaf({1.0, -2.0, 0.5});
  Tensor v = tensor({1.0, 0.5, -2.0});
  Tensor f = sum(mul(mul(x, x), x));
  Tensor g = grad({f}, {x}, {}, {.create_graph = true})[0];
  BOOST_TEST(g.requires_grad());
  Tensor hv = grad({sum(mul(g, v))}, {x})[0];
  BOOST_TEST(values(hv) == (std::vector<double>{6.0, -6.0, -6.0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(derivatives_of_any_order) {
  // d^k/dx^k of sin-free polynomial x^5 at x = 1.5: 5x^4, 20x^3, 60x^2, 120x, 120.
  Tensor x = leaf({1.5});
  Tensor y = pow(x, 5.0);
  const double want[] = {5 * std::pow(1.5, 4), 20 * std::pow(1.5, 3), 60 * 1.5 * 1.5, 120 * 1.5, 120};
  for (double w : want) {
    y = grad({sum(y)}, {x}, {}, {.create_graph = true})[0];
    BOOST_TEST(y.item<double>() == w, boost::test_tools::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(backward_with_create_graph_gives_a_differentiable_grad_field) {
  Tensor x = leaf({2.0});
  sum(mul(mul(x, x), x)).backward(Tensor(), std::nullopt, /*create_graph=*/true);  // .grad = 3x^2
  Tensor g = x.grad();
  BOOST_TEST(g.requires_grad());
  Tensor h = grad({sum(g)}, {x})[0];  // 6x
  BOOST_TEST(h.item<double>() == 12.0);
  // x.grad holds a graph that holds x: a cycle, as in PyTorch. Dropping the gradient breaks it.
  x.zero_grad();
}

BOOST_AUTO_TEST_CASE(gradient_penalty_trains_through_the_input_gradient) {
  // L = sum((w x)^2) + ||dL0/dx||^2 with L0 = sum((w x)^2): dL0/dx = 2 w^2 x,
  // ||.||^2 = 4 w^4 x^2, so dL/dw = 2 w x^2 + 16 w^3 x^2.
  Tensor x = tensor({1.5});
  Tensor w = leaf({0.5});
  x.requires_grad_();
  Tensor l0 = sum(mul(mul(w, x), mul(w, x)));
  Tensor gx = grad({l0}, {x}, {}, {.create_graph = true})[0];
  Tensor loss = add(l0, sum(mul(gx, gx)));
  Tensor gw = grad({loss}, {w})[0];
  const double wv = 0.5, xv = 1.5;
  BOOST_TEST(gw.item<double>() == 2 * wv * xv * xv + 16 * wv * wv * wv * xv * xv, boost::test_tools::tolerance(1e-14));
}

// A user's op whose backward is raw kernels: once-differentiable.
void raw_double_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  Tensor out = g.detach().clone();
  NoGradGuard ng;
  gin[0] = out.mul_(2.0);
}
const OpDef raw_double_op({.name = "test_raw_double", .arity = 1, .signature = "2x, backward outside the graph",
                           .saves = saves_of<NoSaved>(), .backward = raw_double_backward,
                           .once_differentiable = true});
const OpDef unmarked_raw_op({.name = "test_unmarked_raw_double", .arity = 1,
                             .signature = "2x, backward outside the graph, not declared", .saves = saves_of<NoSaved>(),
                             .backward = raw_double_backward});
Tensor raw_double(const Tensor& x, const OpDef& op) {
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(x, 2.0);
  }
  record(op, out, x);
  return out;
}

BOOST_AUTO_TEST_CASE(create_graph_through_a_once_differentiable_op_names_it) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = sum(mul(raw_double(x, raw_double_op), x));
  BOOST_TEST(values(grad({y}, {x}, {}, {.retain_graph = true})[0]) == (std::vector<double>{4.0, 8.0}),
             boost::test_tools::per_element());  // first order is fine
  check_throws<AutogradError>([&] { grad({y}, {x}, {}, {.create_graph = true}); },
                              {"'test_raw_double'", "once-differentiable"});
  // Not declared: caught when the incoming gradient is recorded and the result is not.
  Tensor u = leaf({1.0, 1.0});
  Tensor q = raw_double(x, unmarked_raw_op);
  check_throws<AutogradError>([&] { grad({q}, {x}, {u}, {.create_graph = true}); },
                              {"'test_unmarked_raw_double'", "not differentiable"});
}

// ---------------------------------------------------------------- side outputs
// A fused op whose recorded backward reads an intermediate of its forward:
// y = x^3, with s = 3x^2 saved as a side output. Backward returns g s (+ the
// gradient that reached s, times ds/dx = 6x): in grad mode s comes attached
// to the node, so a second pass sends its gradient back to this backward.
struct SideCubeSaved {
  Tensor x;
  SideOutput slope;  // 3x^2
  static constexpr std::tuple fields{saved_field("x", &SideCubeSaved::x), saved_field("slope", &SideCubeSaved::slope)};
};
static_assert(side_output(&SideCubeSaved::slope) == 1);
enum class SideUse { add, ignore, hook };
template <SideUse use>
void side_cube_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(&SideCubeSaved::x), s = n.saved_tensor(&SideCubeSaved::slope);
  if (use == SideUse::hook && grad_enabled()) s.register_hook([](const Tensor& t) { return t; });
  gin[0] = mul(g, s);
  if (const Tensor& ds = n.side_grad(&SideCubeSaved::slope); ds.defined() && use != SideUse::ignore)
    gin[0] = add(gin[0], mul(ds, mul(x, 6.0)));
}
// With a recompute function, as an op whose output others save by reference
// has: the side output s, saved by the mul in backward, must not be
// "rebuilt" as the output.
Tensor cube_recompute(const Node& n) {
  const Tensor x = n.saved_tensor(&SideCubeSaved::x);
  return mul(mul(x, x), x);
}
const OpDef side_cube_op({.name = "test_side_cube", .arity = 1, .signature = "x^3, its slope 3x^2 a side output",
                          .saves = saves_of<SideCubeSaved>(), .backward = side_cube_backward<SideUse::add>,
                          .recompute = cube_recompute});
const OpDef side_cube_ignored_op({.name = "test_side_cube_ignored", .arity = 1,
                                  .signature = "x^3, whose backward drops its side output's gradient",
                                  .saves = saves_of<SideCubeSaved>(), .backward = side_cube_backward<SideUse::ignore>});
const OpDef side_cube_hooked_op({.name = "test_side_cube_hooked", .arity = 1,
                                 .signature = "x^3, whose backward hooks its side output",
                                 .saves = saves_of<SideCubeSaved>(), .backward = side_cube_backward<SideUse::hook>});
Tensor side_cube(const Tensor& x, const OpDef& op = side_cube_op) {
  Tensor out, s;
  {
    NoGradGuard ng;
    out = mul(mul(x, x), x);
    s = mul(mul(x, x), 3.0);
  }
  if (Node* n = record(op, out, x)) n->save(SideCubeSaved{.x = x, .slope = s});
  return out;
}

BOOST_AUTO_TEST_CASE(a_side_output_carries_higher_derivatives_back_to_its_op) {
  // x^3 at 1.5: 3x^2, 6x, 6, 0, each order through the side output's gradient.
  Tensor x = leaf({1.5});
  Tensor y = side_cube(x);
  const double want[] = {3 * 1.5 * 1.5, 6 * 1.5, 6, 0};
  for (double w : want) {
    y = grad({sum(y)}, {x}, {}, {.create_graph = true, .allow_unused = true})[0];
    if (!y.defined()) y = zeros({1}, DType::f64);  // the fourth derivative reaches nothing
    BOOST_TEST(y.item<double>() == w, boost::test_tools::tolerance(1e-12));
  }
  Tensor v = samples::uniform({4}, 31);
  BOOST_TEST(gradgradcheck([](const std::vector<Tensor>& in) { return side_cube(in[0]); }, {v}).passed);
  // A backward that drops what reached its side output has a wrong second derivative.
  GradcheckReport r = gradgradcheck([](const std::vector<Tensor>& in) { return side_cube(in[0], side_cube_ignored_op); }, {v});
  BOOST_TEST(!r.passed);
}

BOOST_AUTO_TEST_CASE(a_side_output_takes_no_hooks_and_is_not_a_grad_input) {
  Tensor x = leaf({1.0, 2.0});
  check_throws<AutogradError>(
      [&] { grad({sum(side_cube(x, side_cube_hooked_op))}, {x}, {}, {.create_graph = true}); },
      {"register_hook", "side output 1 of 'test_side_cube_hooked'"});
  // A backward that asks grad() for its side output's gradient is refused too.
  Tensor y = side_cube(x);
  Tensor g = grad({sum(y)}, {x}, {}, {.create_graph = true})[0];  // 3x^2 = g * s, s attached
  Node* mul_node = g.impl()->grad_fn.get();
  BOOST_TEST_REQUIRE(mul_node != nullptr);
  int side_edges = 0;
  for (const Edge& e : mul_node->edges)
    if (e.output == 1) {
      ++side_edges;
      // Rebuild the attached side output the way saved_tensor does, and ask for its gradient.
      Tensor s = e.node->saved_tensor(&SideCubeSaved::slope);
      BOOST_TEST(s.impl()->output_nr == 1u);
      check_throws<AutogradError>([&] { grad({sum(g)}, {s}); }, {"side output of 'test_side_cube'"});
    }
  BOOST_TEST(side_edges == 1);
}

// ---------------------------------------------------------------- typed saved state
// An op saves the struct its OpDef declares, once, and backward reads it as
// that struct; anything else is an AutogradError naming the op.
struct XSaved {
  Tensor x;
  static constexpr std::tuple fields{saved_field("x", &XSaved::x)};
};
BOOST_AUTO_TEST_CASE(saving_or_reading_another_struct_than_declared_is_an_error) {
  static const OpDef declares_nothing({.name = "test_declares_nothing", .arity = 1,
                                       .signature = "x^3, declaring no saved state", .saves = saves_of<NoSaved>(),
                                       .backward = side_cube_backward<SideUse::add>});
  Tensor x = leaf({1.0, 2.0});
  check_throws<AutogradError>([&] { side_cube(x, declares_nothing); }, {"'test_declares_nothing'", "::SideCubeSaved", "OpDef declares"});
  // side_cube_op declares SideCubeSaved; a backward reading XSaved from it is refused.
  Tensor y = side_cube(x);
  check_throws<AutogradError>([&] { (void)y.impl()->grad_fn->saved_tensor(&XSaved::x); },
                              {"backward of 'test_side_cube'", "OpDef declares"});
  // Each field is checked for in-place writes on its own: x was modified, the side output was not.
  Tensor x2 = mul(leaf({1.0, 2.0}), 1.0);
  Tensor y2 = side_cube(x2);
  const Node& n = *y2.impl()->grad_fn.get();
  {
    NoGradGuard ng;
    x2.add_(ones({2}, DType::f64));
  }
  BOOST_TEST(n.saved_tensor(&SideCubeSaved::slope).defined());
  check_throws<AutogradError>([&] { (void)n.saved_tensor(&SideCubeSaved::x); },
                              {"'test_side_cube'", "modified in place"});
}

// ---------------------------------------------------------------- hooks
BOOST_AUTO_TEST_CASE(tensor_hooks_read_and_replace_gradients) {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = mul(x, 3.0);
  std::vector<double> seen;
  h.register_hook([&](const Tensor& g) {
    seen = values(g);
    return mul(g, 10.0);  // replaces the gradient flowing on into x
  });
  HookHandle leaf_hook = x.register_hook([](const Tensor& g) { return add(g, 1.0); });
  sum(mul(h, h)).backward();
  BOOST_TEST(seen == (std::vector<double>{6.0, 12.0}), boost::test_tools::per_element());  // 2h
  BOOST_TEST(values(x.grad()) == (std::vector<double>{181.0, 361.0}), boost::test_tools::per_element());
  leaf_hook.remove();
  x.zero_grad();
  sum(mul(x, 2.0)).backward();
  BOOST_TEST(values(x.grad()) == (std::vector<double>{2.0, 2.0}), boost::test_tools::per_element());
  check_throws<AutogradError>([&] { tensor({1.0}).register_hook([](const Tensor& g) { return g; }); },
                              {"does not require grad"});
}

BOOST_AUTO_TEST_CASE(retain_grad_keeps_a_non_leaf_gradient) {
  Tensor x = leaf({1.0, 2.0});
  Tensor h = mul(x, x);
  Tensor plain = mul(x, 2.0);
  h.retain_grad();
  BOOST_TEST(h.retains_grad());
  sum(add(mul(h, 3.0), plain)).backward();
  BOOST_TEST(values(h.grad()) == (std::vector<double>{3.0, 3.0}), boost::test_tools::per_element());
  BOOST_TEST(!plain.grad().defined());
}

BOOST_AUTO_TEST_CASE(post_accumulate_hook_fires_once_with_the_final_gradient) {
  // w is used by three nodes: the hook must see the sum of all three.
  Tensor w = leaf({1.0, 2.0});
  int calls = 0;
  std::vector<double> at_call;
  w.register_post_accumulate_grad_hook([&](const Tensor& p) {
    ++calls;
    at_call = values(p.grad());
  });
  Tensor loss = add(add(sum(mul(w, 2.0)), sum(mul(w, w))), sum(tanh(mul(w, 0.0))));
  loss.backward();
  BOOST_TEST(calls == 1);
  BOOST_TEST(at_call == (std::vector<double>{2.0 + 2.0 + 0.0, 2.0 + 4.0 + 0.0}), boost::test_tools::per_element());
  sum(mul(w, 1.0)).backward();
  BOOST_TEST(calls == 2);
  check_throws<AutogradError>([&] { mul(w, 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}); },
                              {"only leaves"});
}

BOOST_AUTO_TEST_CASE(module_forward_hooks) {
  nn::Linear fc({.in = 2, .out = 2});
  int pre = 0;
  HookHandle h1 = fc.register_forward_pre_hook([&](nn::Module& m, std::span<const Tensor> in) {
    ++pre;
    BOOST_TEST(m.type_name() == "Linear");
    BOOST_TEST(in.size() == 1u);
  });
  fc.register_forward_hook([](nn::Module&, std::span<const Tensor>, const Tensor& out) { return mul(out, 0.0); });
  Tensor y = fc(ones({3, 2}));
  BOOST_TEST(pre == 1);
  BOOST_TEST(sum(abs(y)).item() == 0.0);
  h1.remove();
  fc(ones({3, 2}));
  BOOST_TEST(pre == 1);
}

// ---------------------------------------------------------------- misuse
BOOST_AUTO_TEST_CASE(gradcheck_with_nothing_to_check_is_an_error) {
  Tensor x = samples::uniform({3}, 1).detach();
  auto fn = [](const std::vector<Tensor>& in) { return tanh(in[0]); };
  check_throws<AutogradError>([&] { gradcheck(fn, {x}); }, {"gradcheck", "requires grad"});
  check_throws<AutogradError>([&] { gradgradcheck(fn, {x}); }, {"gradgradcheck", "requires grad"});
}

BOOST_AUTO_TEST_CASE(gradcheck_module_gives_the_module_back_in_its_dtype) {
  nn::Linear fc({.in = 3, .out = 2});
  GradcheckReport r = nn::gradcheck_module(fc, [&](auto& in) { return fc(in[0]); }, {samples::uniform({2, 3}, 1)});
  BOOST_TEST(r.passed, r.str());
  for (auto& [name, p] : fc.named_parameters()) BOOST_TEST((p.dtype() == DType::f32), name);
  GradcheckReport rr =
      nn::gradgradcheck_module(fc, [&](auto& in) { return tanh(fc(in[0])); }, {samples::uniform({2, 3}, 2)});
  BOOST_TEST(rr.passed, rr.str());
  for (auto& [name, p] : fc.named_parameters()) BOOST_TEST((p.dtype() == DType::f32), name);
}

BOOST_AUTO_TEST_CASE(an_op_name_is_registered_once) {
  check_throws<ValueError>(
      [] { OpDef again({.name = "mul", .arity = 2, .signature = "another mul", .saves = saves_of<NoSaved>(),
                        .backward = nullptr}); },
      {"'mul'", "already registered"});
  BOOST_TEST(find_op("mul")->signature.find("broadcasting") != std::string_view::npos);  // the original stays
  check_throws<ValueError>(
      [] { OpDef nameless({.name = "", .arity = 1, .signature = "f(x)", .backward = nullptr}); },
      {"needs a name and a backward"});
  check_throws<ValueError>([] { OpDef no_backward({.name = "no_backward", .arity = 1, .signature = "f(x)"}); },
                           {"'no_backward'", "needs a name and a backward"});
  BOOST_TEST(find_op("no_backward") == nullptr);
  // A symmetric Jacobian is square: one input, and no tangent rule beside it.
  check_throws<ValueError>([] { OpDef two({.name = "self_adjoint_of_two", .arity = 2, .signature = "f(a, b)",
                                         .backward = [](const Node&, const Tensor&, std::span<Tensor>) {},
                                         .self_adjoint = true}); },
                           {"'self_adjoint_of_two'", "one input"});
}

BOOST_AUTO_TEST_CASE(to_dot_shows_a_live_graph_and_what_backward_freed) {
  Tensor x = leaf({1.0, 2.0});
  Tensor y = sum(tanh(x));
  std::string dot = to_dot({y});
  for (const char* part : {"tanh", "sum", "(2)", "float64", "leaf"})
    BOOST_TEST(dot.find(part) != std::string::npos, "'" << part << "' not in:\n" << dot);
  y.backward();
  BOOST_TEST(to_dot({y}).find("freed by backward") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
