// Forward mode. The op-table walk checks every op's tangent rule over every
// one of its samples in float64, three ways: against central differences
// (jvpcheck), against the op's backward (<u, J v> = <J^T u, v>, which catches
// a transposed or mis-broadcast rule a finite-difference tolerance hides),
// and forward-over-reverse Hessian-vector products (the rule applied to the
// recorded backward) against reverse-over-reverse ones. An op without a
// tangent rule fails the walk. Then the API: dual tensors, jvp, vjp, hvp,
// jacobian in both modes, hessian, and the errors.
#define BOOST_TEST_MODULE forward_ad
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <limits>
#include <span>
#include <string>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/samples.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;

namespace {

// The largest |a - b| / (1 + |b|) over two tensors of one shape; infinite
// where either holds a NaN (std::max would drop it).
double max_rel_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.contiguous().to_vector<double>(), y = b.contiguous().to_vector<double>();
  double worst = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    const double d = std::abs(x[k] - y[k]) / (1 + std::abs(y[k]));
    if (std::isnan(d)) return std::numeric_limits<double>::infinity();
    worst = std::max(worst, d);
  }
  return worst;
}

// A sample as a function of its differentiable inputs only (the others, such
// as indices, stay as the sample has them).
struct Differentiable {
  std::vector<size_t> at;       // positions of the inputs that require grad
  std::vector<Tensor> primals;  // their values, detached
};
Differentiable differentiable(const OpSample& s) {
  Differentiable d;
  for (size_t k = 0; k < s.inputs.size(); ++k)
    if (s.inputs[k].defined() && s.inputs[k].requires_grad()) {
      d.at.push_back(k);
      d.primals.push_back(s.inputs[k].detach());
    }
  return d;
}
TensorListFn on_differentiable(const OpSample& s, const std::vector<size_t>& at) {
  return [s, at](const std::vector<Tensor>& x) {
    std::vector<Tensor> in = s.inputs;
    for (size_t k = 0; k < at.size(); ++k) in[at[k]] = x[k];
    return std::vector<Tensor>{s.fn(in)};
  };
}
std::vector<Tensor> random_like(const std::vector<Tensor>& ts, uint64_t seed) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts) out.push_back(samples::uniform(t.shape(), seed++).detach());
  return out;
}

// <u, J v> from forward mode against sum_k <J^T u, v_k> from reverse mode.
std::string adjoint_mismatch(const OpSample& s) {
  const Differentiable d = differentiable(s);
  const TensorListFn fn = on_differentiable(s, d.at);
  const std::vector<Tensor> v = random_like(d.primals, 501);
  const JvpResult fw = jvp(fn, d.primals, v);
  const Tensor u = samples::uniform(fw.outputs[0].shape(), 502).detach();
  const VjpResult rv = vjp(fn, d.primals, {u});
  const double forward = sum(mul(u, fw.tangents[0])).item<double>();
  double reverse = 0, scale = std::abs(forward);
  for (size_t k = 0; k < v.size(); ++k) {
    const double term = sum(mul(rv.grads[k], v[k])).item<double>();
    reverse += term;
    scale = std::max(scale, std::abs(term));
  }
  if (std::abs(forward - reverse) <= 1e-12 * std::max(1.0, scale)) return {};
  return fmt::format("<u, J v> = {:.17g} by forward mode but <J^T u, v> = {:.17g} by reverse mode", forward, reverse);
}

// H v of <u, fn(x)> forward over reverse (hvp) against reverse over reverse.
std::string hvp_mismatch(const OpSample& s) {
  const Differentiable d = differentiable(s);
  const TensorListFn fn = on_differentiable(s, d.at);
  Tensor u;
  {
    NoGradGuard ng;
    u = samples::uniform(fn(d.primals)[0].shape(), 503).detach();
  }
  const TensorListFn loss = [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{sum(mul(fn(x)[0], u))}; };
  const std::vector<Tensor> v = random_like(d.primals, 504);
  const HvpResult fw = hvp(loss, d.primals, v);
  // Reverse over reverse.
  EnableGradGuard with_grad;
  std::vector<Tensor> xs;
  for (const Tensor& p : d.primals) xs.push_back(p.detach().requires_grad_());
  const std::vector<Tensor> g = grad({loss(xs)[0]}, xs, {}, {.create_graph = true, .allow_unused = true});
  Tensor gv;
  for (size_t k = 0; k < g.size(); ++k)
    if (g[k].defined() && g[k].requires_grad()) gv = gv.defined() ? add(gv, sum(mul(g[k], v[k]))) : sum(mul(g[k], v[k]));
  std::vector<Tensor> rr(xs.size());
  if (gv.defined()) rr = grad({gv}, xs, {}, {.allow_unused = true});
  for (size_t k = 0; k < xs.size(); ++k) {
    const Tensor want = rr[k].defined() ? rr[k] : zeros_like(xs[k]);
    const double diff = max_rel_diff(fw.hvp[k], want);
    if (diff > 1e-12)
      return fmt::format("input {}: H v forward over reverse differs from reverse over reverse by {:.3g} (relative)",
                         d.at[k], diff);
  }
  return {};
}

// Every check of every sample of `op`; the failures, each described.
std::vector<std::string> check_op_forward(const OpDef& op) {
  std::vector<std::string> failures;
  for (const OpSample& sample : op.samples()) {
    auto fail = [&](const std::string& what) { failures.push_back(fmt::format("{} / {}: {}", op.name, sample.desc, what)); };
    try {
      GradcheckReport r = jvpcheck(sample.fn, sample.inputs);
      if (!r.passed) fail("jvpcheck against finite differences:\n" + r.str());
      if (std::string m = adjoint_mismatch(sample); !m.empty()) fail(m);
      if (std::string m = hvp_mismatch(sample); !m.empty()) fail(m);
    } catch (const std::exception& e) {
      fail(fmt::format("threw {}", e.what()));
    }
  }
  return failures;
}

}  // namespace

BOOST_AUTO_TEST_CASE(tangents_of_every_op_float64) {
  int ops = 0, passed = 0;
  for (const OpDef* op : op_table()) {
    std::vector<std::string> failures = check_op_forward(*op);
    for (const std::string& f : failures) BOOST_ERROR(f);
    ++ops;
    passed += failures.empty();
  }
  BOOST_TEST_MESSAGE("forward mode: " << passed << " of " << ops
                                      << " ops pass jvpcheck, <u,Jv> = <J^T u,v> and forward-over-reverse H v");
  BOOST_TEST(passed == ops);
}

// An op declared with a backward only: forward mode derives its tangent
// from the backward (tangent_from_backward), and the walk checks that one.
void plain_double_backward(const Node&, const Tensor& g, std::span<Tensor> gin) { gin[0] = mul(g, 2.0); }
const OpDef* g_plain_double = nullptr;
Tensor plain_double(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(x, 2.0);
  }
  record(*g_plain_double, out, x);
  return out;
}

BOOST_AUTO_TEST_CASE(an_op_without_a_tangent_rule_gets_one_from_its_backward) {
  OpDef op({
      .name = "test_no_tangent",
      .arity = 1,
      .signature = "2x, no tangent rule",
      .saves = saves_of<NoSaved>(),
      .backward = plain_double_backward,
      .samples = [] {
        return std::vector<OpSample>{{"(3)", {samples::uniform({3}, 1)}, [](auto& x) { return plain_double(x[0]); }}};
      },
  });
  g_plain_double = &op;
  const std::vector<std::string> f = check_op_forward(op);
  BOOST_TEST(f.empty(), (f.empty() ? std::string() : f.front()));
  ForwardADGuard level;
  const Tensor t = from_vector(std::vector<double>{1, -2, 3}, {3});
  const Tensor y = plain_double(make_dual(samples::uniform({3}, 2).detach(), t));
  BOOST_TEST(tangent(y).to_vector<double>() == (std::vector<double>{2, -4, 6}), boost::test_tools::per_element());
}

// And for a wrong rule: 2x with tangent 3 t fails against finite differences
// and against its backward.
void wrong_tangent(const Node&, std::span<const Tensor> t, std::span<Tensor> out) { out[0] = mul(t[0], 3.0); }

BOOST_AUTO_TEST_CASE(walk_fails_for_a_wrong_tangent_rule) {
  OpDef op({
      .name = "test_wrong_tangent",
      .arity = 1,
      .signature = "2x, tangent 3t",
      .saves = saves_of<NoSaved>(),
      .backward = plain_double_backward,
      .tangent = wrong_tangent,
      .samples = [] {
        return std::vector<OpSample>{{"(3)", {samples::uniform({3}, 1)}, [](auto& x) { return plain_double(x[0]); }}};
      },
  });
  g_plain_double = &op;
  const std::vector<std::string> f = check_op_forward(op);
  BOOST_TEST_REQUIRE(f.size() == 2u);  // against finite differences, and against the backward
  for (const std::string& m : f) BOOST_TEST(m.find("test_wrong_tangent") != std::string::npos, m);
  BOOST_TEST(f[0].find("jvpcheck") != std::string::npos, f[0]);
  BOOST_TEST(f[1].find("<u, J v>") != std::string::npos, f[1]);
}

// With a symmetric Jacobian (2x), a once-differentiable backward is the
// tangent where tangents are not recorded; recorded, a raw-kernel tangent
// would fall out of the graph, so it is the error below.
BOOST_AUTO_TEST_CASE(a_self_adjoint_once_differentiable_op_has_a_tangent_where_not_recorded) {
  OpDef op({.name = "test_self_adjoint_raw", .arity = 1, .signature = "2x, self-adjoint", .saves = saves_of<NoSaved>(),
            .backward = plain_double_backward, .self_adjoint = true, .once_differentiable = true});
  g_plain_double = &op;
  const Tensor x0 = samples::uniform({3}, 2).detach(), t = full({3}, 0.5, DType::f64);
  {
    ForwardADGuard level(false);
    BOOST_TEST(max_rel_diff(tangent(plain_double(make_dual(x0, t))), full({3}, 1.0, DType::f64)) == 0.0);
  }
  ForwardADGuard recorded;
  const Tensor y = plain_double(make_dual(x0, t));
  try {
    tangent(y);
    BOOST_FAIL("no error");
  } catch (const AutogradError& e) {
    BOOST_TEST(std::string(e.what()).find("'test_self_adjoint_raw'") != std::string::npos, e.what());
  }
}

// A once-differentiable backward (raw kernels) gives no tangent to derive:
// forward mode through such an op without a rule is an error naming it.
BOOST_AUTO_TEST_CASE(missing_tangent_rule_of_a_once_differentiable_op_is_an_error_naming_it) {
  OpDef op({.name = "test_no_tangent_2", .arity = 1, .signature = "2x, no tangent rule", .saves = saves_of<NoSaved>(),
            .backward = plain_double_backward, .once_differentiable = true});
  g_plain_double = &op;
  ForwardADGuard level;
  Tensor x = make_dual(samples::uniform({3}, 2).detach(), ones({3}, DType::f64));
  Tensor y = plain_double(x);
  try {
    tangent(y);
    BOOST_FAIL("no error");
  } catch (const AutogradError& e) {
    BOOST_TEST(std::string(e.what()).find("'test_no_tangent_2'") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("no tangent rule") != std::string::npos, e.what());
  }
}

// ---------------------------------------------------------------- the API

// f(x, w) = tanh(w x) * x[0]: 3 inputs, 4 outputs.
std::vector<Tensor> small_net(const std::vector<Tensor>& in) {
  return {mul(tanh(matmul(in[1], in[0])), select(in[0], 0, 0))};
}

BOOST_AUTO_TEST_CASE(jacobian_forward_equals_reverse_and_jvp) {
  const std::vector<Tensor> in{samples::uniform({3}, 11).detach(), samples::uniform({4, 3}, 12).detach()};
  const auto fw = jacobian(small_net, in, {.mode = JacobianMode::forward});
  const auto rv = jacobian(small_net, in, {.mode = JacobianMode::reverse});
  BOOST_TEST_REQUIRE(fw.size() == 1u);
  BOOST_TEST((fw[0][0].shape() == Shape{4, 3}));
  BOOST_TEST((fw[0][1].shape() == Shape{4, 4, 3}));
  for (size_t j = 0; j < 2; ++j) BOOST_TEST(max_rel_diff(fw[0][j], rv[0][j]) < 1e-14);
  // J v by jvp is the Jacobian times v.
  const Tensor v = samples::uniform({3}, 13).detach();
  const JvpResult r = jvp(small_net, in, {v, Tensor()});
  BOOST_TEST(max_rel_diff(r.tangents[0], matmul(fw[0][0], v)) < 1e-14);
  BOOST_TEST(max_rel_diff(r.outputs[0], small_net(in)[0]) == 0.0);
  BOOST_TEST(!r.tangents[0].requires_grad());
}

// f(x) = sum(x^3) + x0 x1: H = diag(6 x) + (e0 e1^T + e1 e0^T).
BOOST_AUTO_TEST_CASE(hessian_of_a_cubic) {
  const Tensor x = from_vector(std::vector<double>{0.5, -1.0, 2.0}, {3});
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{add(sum(pow(in[0], 3.0)), mul(select(in[0], 0, 0), select(in[0], 0, 1)))};
  };
  const Tensor H = hessian(f, {x})[0][0];
  const std::vector<double> want{3, 1, 0, 1, -6, 0, 0, 0, 12};
  BOOST_TEST(H.contiguous().to_vector<double>() == want, boost::test_tools::per_element());
}

// Reverse over forward: the gradient of jvp(f, x, v) = <grad f, v> is H v.
BOOST_AUTO_TEST_CASE(reverse_over_forward_equals_forward_over_reverse) {
  const Tensor x0 = samples::uniform({4}, 21).detach(), v = samples::uniform({4}, 22).detach();
  auto f = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(mul(tanh(in[0]), mul(in[0], in[0])))}; };
  const Tensor x = x0.clone().requires_grad_();
  BOOST_TEST(!jvp(f, {x}, {v}).tangents[0].requires_grad());  // detached without create_graph
  const JvpResult r = jvp(f, {x}, {v}, true);
  BOOST_TEST_REQUIRE(r.tangents[0].requires_grad());
  const Tensor rof = grad({r.tangents[0]}, {x})[0];
  const HvpResult h = hvp(f, {x0}, {v});
  BOOST_TEST(max_rel_diff(rof, h.hvp[0]) < 1e-14);
  BOOST_TEST(max_rel_diff(h.grads[0], grad({f({x})[0]}, {x})[0]) < 1e-15);
}

// Forward over reverse frees the forward's graph as its backward passes it,
// as a plain backward does: a second pass over it is refused, unless the
// first retained it (and then gives the same).
BOOST_AUTO_TEST_CASE(grad_and_tangents_frees_the_graph_unless_retained) {
  const Tensor x0 = samples::uniform({8}, 41).detach(), v = samples::uniform({8}, 42).detach();
  ForwardADGuard level(false);
  const Tensor x = make_dual(x0, v);
  const Tensor y = sum(mul(tanh(x), x));
  const GradTangents kept = grad_and_tangents({y}, {x}, {}, /*retain_graph=*/true);
  const GradTangents again = grad_and_tangents({y}, {x});
  BOOST_TEST(max_rel_diff(kept.tangents[0], again.tangents[0]) == 0.0);
  BOOST_CHECK_THROW(grad_and_tangents({y}, {x}), AutogradError);
}

// A forward at a level without recorded tangents keeps an activation's
// tangent only as long as the activation: exp(3 x) holds exp's output and
// its tangent (exp saves its output), not the tangent of 3 x, which is gone.
BOOST_AUTO_TEST_CASE(a_dead_activation_takes_its_tangent_with_it) {
  const int64_t n = 1 << 16;  // 512 KiB of float64 per tensor
  const Tensor x0 = samples::uniform({n}, 43).detach(), v = samples::uniform({n}, 44).detach();
  const size_t bytes = n * sizeof(double);
  ForwardADGuard level(false);
  const Tensor x = make_dual(x0, v);
  const size_t before = memory_stats().bytes_in_use;
  const Tensor y = sum(exp(mul(x, 3.0)));
  const double ty = tangent(y).item<double>();
  const size_t held = memory_stats().bytes_in_use - before;
  BOOST_TEST_MESSAGE("held after the forward: " << held << " bytes");
  BOOST_TEST(held >= 2 * bytes);  // exp's output and its tangent
  BOOST_TEST(held < 3 * bytes);   // and not 3 x's tangent
  BOOST_TEST(std::abs(ty - sum(mul(exp(mul(x0, 3.0)), mul(v, 3.0))).item<double>()) < 1e-9 * std::abs(ty));
}

BOOST_AUTO_TEST_CASE(dual_tensors) {
  const Tensor x0 = samples::uniform({2, 3}, 31).detach(), t = samples::uniform({2, 3}, 32).detach();
  BOOST_CHECK_THROW(make_dual(x0, t), AutogradError);  // no level open
  ForwardADGuard level;
  BOOST_TEST(forward_ad_enabled());
  BOOST_CHECK_THROW(ForwardADGuard(), AutogradError);  // one level at a time
  try {
    make_dual(x0, ones({3, 2}, DType::f64));
    BOOST_FAIL("no error");
  } catch (const ShapeError& e) {
    BOOST_TEST(std::string(e.what()).find("make_dual") != std::string::npos, e.what());
    BOOST_TEST(std::string(e.what()).find("(3,2)") != std::string::npos, e.what());
  }
  const Tensor x = make_dual(x0, t);
  const Dual d = unpack_dual(mul(x, 3.0));
  BOOST_TEST(max_rel_diff(d.primal, mul(x0, 3.0)) == 0.0);
  BOOST_TEST(max_rel_diff(d.tangent, mul(t, 3.0)) == 0.0);
  BOOST_TEST(!tangent(ones({2}, DType::f64)).defined());  // no tangent: zero
}

// ---------------------------------------------------------------- parity with PyTorch
// tests/fixtures/forward_ad.json, made by make_forward_ad.py with
// torch.autograd.forward_ad. The models are written with explicit weights,
// as the script writes them, so every weight can be a primal.

const json& fixture_case(const std::string& name) {
  const json& cases = fixture("tests/fixtures/forward_ad.json")["cases"];
  BOOST_REQUIRE_MESSAGE(cases.contains(name), "forward_ad.json lacks case " << name);
  return cases[name];
}

using Weights = std::map<std::string, Tensor>;

Tensor mlp(const Weights& p, const Tensor& x) {
  return linear(tanh(linear(x, p.at("fc1.weight"), p.at("fc1.bias"))), p.at("fc2.weight"), p.at("fc2.bias"));
}

// Pre-LN causal block, C = 8, 2 heads, MLP 32, exact GELU; x (B,T,C).
Tensor block(const Weights& p, const Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = 8, H = 2, D = C / H;
  const Tensor a = layer_norm(x, p.at("ln1.weight"), p.at("ln1.bias"));
  // (B,T,3C) -> (3,B,H,T,D): q, k, v with head h in rows h*D .. h*D+D-1
  const Tensor qkv = permute(reshape(linear(a, p.at("attn.qkv.weight"), p.at("attn.qkv.bias")), {B, T, 3, H, D}),
                             {2, 0, 3, 1, 4});
  const Tensor y = scaled_dot_product_attention(select(qkv, 0, 0), select(qkv, 0, 1), select(qkv, 0, 2), true);
  const Tensor h = add(x, linear(reshape(transpose(y, 1, 2), {B, T, C}), p.at("attn.proj.weight"), p.at("attn.proj.bias")));
  const Tensor m = layer_norm(h, p.at("ln2.weight"), p.at("ln2.bias"));
  return add(h, linear(gelu(linear(m, p.at("mlp.fc.weight"), p.at("mlp.fc.bias"))), p.at("mlp.proj.weight"),
                       p.at("mlp.proj.bias")));
}

// The case's weights (name order) and a function of (x, weights...) calling model.
struct Functional {
  std::vector<std::string> names;
  std::vector<Tensor> primals;  // x, then the weights
  TensorListFn fn;
};
Functional functional(const json& c, Tensor (*model)(const Weights&, const Tensor&)) {
  Functional f;
  f.primals.push_back(load(c["x"]));
  for (auto& [name, w] : c["params"].items()) {
    f.names.push_back(name);
    f.primals.push_back(load(w));
  }
  f.fn = [names = f.names, model](const std::vector<Tensor>& in) {
    Weights p;
    for (size_t k = 0; k < names.size(); ++k) p[names[k]] = in[k + 1];
    return std::vector<Tensor>{model(p, in[0])};
  };
  return f;
}

void jvp_parity(const std::string& name, Tensor (*model)(const Weights&, const Tensor&), size_t n_weights) {
  const json& c = fixture_case(name);
  const Functional f = functional(c, model);
  BOOST_REQUIRE_EQUAL(f.names.size(), n_weights);
  std::vector<Tensor> tangents{load(c["x_tangent"])};
  for (const std::string& n : f.names) tangents.push_back(load(c["tangents"][n]));
  const JvpResult r = jvp(f.fn, f.primals, tangents);
  Parity p{1e-12};
  p.check(name + " output", r.outputs[0], load(c["output"]));
  p.check(name + " output tangent", r.tangents[0], load(c["output_tangent"]));
  BOOST_TEST_MESSAGE(name << ": max relative error vs torch.autograd.forward_ad: " << p.worst);
}

BOOST_AUTO_TEST_CASE(mlp_jvp_matches_torch) { jvp_parity("mlp_jvp", mlp, 4); }

BOOST_AUTO_TEST_CASE(transformer_block_jvp_matches_torch) { jvp_parity("block_jvp", block, 12); }

BOOST_AUTO_TEST_CASE(transformer_block_hvp_matches_torch) {
  const json& c = fixture_case("block_hvp");
  const Functional f = functional(c, block);
  BOOST_REQUIRE_EQUAL(f.names.size(), 12u);
  const Tensor x = f.primals[0];
  const std::vector<Tensor> weights(f.primals.begin() + 1, f.primals.end());
  const TensorListFn loss = [&](const std::vector<Tensor>& w) {
    std::vector<Tensor> in{x};
    in.insert(in.end(), w.begin(), w.end());
    const Tensor y = f.fn(in)[0];
    return std::vector<Tensor>{sum(mul(y, y))};
  };
  std::vector<Tensor> v;
  for (const std::string& n : f.names) v.push_back(load(c["v"][n]));
  const HvpResult r = hvp(loss, weights, v);
  Parity p{1e-12};
  p.check("block_hvp loss", r.value, load(c["loss"]));
  for (size_t k = 0; k < f.names.size(); ++k) {
    p.check("block_hvp grad " + f.names[k], r.grads[k], load(c["grads"][f.names[k]]));
    p.check("block_hvp H v " + f.names[k], r.hvp[k], load(c["hvp"][f.names[k]]));
  }
  BOOST_TEST_MESSAGE("block_hvp: max relative error of forward-over-reverse H v vs torch: " << p.worst);
}

// H v by reverse over reverse: the reference the forward-over-reverse cases
// below are checked against.
namespace {
Tensor hvp_by_reverse(const TensorListFn& f, const Tensor& x0, const Tensor& v) {
  const Tensor x = x0.detach().clone().requires_grad_();
  const Tensor g = grad({f({x})[0]}, {x}, {}, {.create_graph = true})[0];
  return grad({sum(mul(g, v))}, {x}, {}, {.allow_unused = true})[0];
}
}  // namespace

BOOST_AUTO_TEST_CASE(count_errors_name_what_is_counted) {
  auto two_outputs = [](const std::vector<Tensor>& in) { return std::vector<Tensor>{exp(in[0]), tanh(in[0])}; };
  const Tensor x = samples::uniform({3}, 51).detach();
  check_throws<ValueError>([&] { (void)vjp(two_outputs, {x}, {ones({3}, DType::f64)}); },
                           {"vjp: 1 cotangents for 2 outputs"});
  check_throws<ValueError>([&] { (void)jvp(two_outputs, {x}, {}); }, {"jvp: 0 tangents for 1 primals"});
  check_throws<ValueError>([&] { (void)hvp(two_outputs, {x}, {x, x}); }, {"hvp: 2 directions for 1 primals"});
}

// Forward over reverse through a checkpoint whose input depends on the
// primals: the checkpoint's backward reruns its function with a graph, and
// the pass must carry the tangents of what it returns on.
BOOST_AUTO_TEST_CASE(hvp_through_a_checkpoint_of_a_computed_input) {
  const Tensor x0 = samples::uniform({2, 6, 8}, 52).detach(), v = samples::uniform({2, 6, 8}, 53).detach();
  auto f = [](const std::vector<Tensor>& in) {
    const Tensor h = checkpoint([](const std::vector<Tensor>& a) { return mul(tanh(a[0]), a[0]); }, {mul(in[0], 2.0)});
    return std::vector<Tensor>{sum(mul(add(h, in[0]), h))};
  };
  const HvpResult r = hvp(f, {x0}, {v});
  BOOST_TEST(max_rel_diff(r.hvp[0], hvp_by_reverse(f, x0, v)) < 1e-12);
  const Tensor x = x0.clone().requires_grad_();
  BOOST_TEST(max_rel_diff(r.grads[0], grad({f({x})[0]}, {x})[0]) < 1e-14);
}

// cross_entropy with every target ignored: the mean is 0/0 = NaN, so a loss
// y*y sends a NaN gradient into it; like the plain backward (and PyTorch),
// forward over reverse gives 0 for the logits' gradient and for H v.
BOOST_AUTO_TEST_CASE(hvp_of_cross_entropy_with_every_target_ignored_is_zero) {
  const Tensor targets = from_vector(std::vector<int64_t>{-100, -100, -100}, {3});
  auto f = [&](const std::vector<Tensor>& in) {
    const Tensor y = cross_entropy(in[0], targets);
    return std::vector<Tensor>{mul(y, y)};
  };
  const Tensor x0 = samples::uniform({3, 4}, 54).detach(), v = samples::uniform({3, 4}, 55).detach();
  const HvpResult r = hvp(f, {x0}, {v});
  BOOST_TEST(std::isnan(r.value.item()));
  BOOST_TEST(max_rel_diff(r.grads[0], zeros({3, 4}, DType::f64)) == 0.0);
  BOOST_TEST(max_rel_diff(r.hvp[0], zeros({3, 4}, DType::f64)) == 0.0);
  BOOST_TEST(max_rel_diff(hvp_by_reverse(f, x0, v), zeros({3, 4}, DType::f64)) == 0.0);
}

// pow(a, b) at a = b = 0: the value is 1 and its gradients are finite; the
// second derivatives must be too, by reverse over reverse and by forward over
// reverse alike.
BOOST_AUTO_TEST_CASE(pow_at_zero_to_the_zero_has_finite_second_derivatives) {
  // x = (a, b) stacked: pow(a, b) elementwise, a = b = 0 at the first.
  auto f = [](const std::vector<Tensor>& in) {
    return std::vector<Tensor>{sum(pow(select(in[0], 0, 0), select(in[0], 0, 1)))};
  };
  const Tensor x0 = from_vector(std::vector<double>{0.0, 0.5, 2.0, 0.0, 1.0, 2.0}, {2, 3});
  const Tensor v = samples::uniform({2, 3}, 56).detach();
  const Tensor ror = hvp_by_reverse(f, x0, v);
  const HvpResult r = hvp(f, {x0}, {v});
  for (double e : ror.to_vector<double>()) BOOST_TEST(std::isfinite(e));
  BOOST_TEST(max_rel_diff(r.hvp[0], ror) < 1e-14);
}

// A checkpoint whose input depends on a tensor its function also reads:
// h = tanh(x w) into a checkpoint of tanh(h w). Its backward differentiates
// the rerun with respect to h and w; the path from h back to w is the outer
// pass's, and must not be counted by the rerun as well. With create_graph,
// and by forward over reverse, gradients and H v equal those without the
// checkpoint.
BOOST_AUTO_TEST_CASE(checkpoint_reading_what_its_input_depends_on) {
  const Tensor x = samples::uniform({3, 4}, 57).detach(), w0 = samples::uniform({4, 4}, 58).detach();
  const Tensor v = samples::uniform({4, 4}, 59).detach();
  auto loss = [&](const Tensor& w, bool checkpointed) {
    const Tensor h = tanh(matmul(x, w));
    auto body = [w](const std::vector<Tensor>& in) { return tanh(matmul(in[0], w)); };
    const Tensor y = checkpointed ? checkpoint(body, {h}) : body({h});
    return sum(mul(y, y));
  };
  std::vector<Tensor> grads, hvs;
  for (bool checkpointed : {false, true})
    for (bool create_graph : {false, true}) {
      const Tensor w = w0.clone().requires_grad_();
      const Tensor g = grad({loss(w, checkpointed)}, {w}, {}, {.create_graph = create_graph})[0];
      grads.push_back(g.detach());
      if (create_graph) hvs.push_back(grad({sum(mul(g, v))}, {w})[0]);
    }
  for (bool checkpointed : {false, true}) {
    auto f = [&](const std::vector<Tensor>& p) { return std::vector<Tensor>{loss(p[0], checkpointed)}; };
    const HvpResult r = hvp(f, {w0}, {v});
    grads.push_back(r.grads[0]);
    hvs.push_back(r.hvp[0]);
  }
  for (size_t k = 1; k < grads.size(); ++k) BOOST_TEST(max_rel_diff(grads[k], grads[0]) < 1e-14, "gradient " << k);
  for (size_t k = 1; k < hvs.size(); ++k) BOOST_TEST(max_rel_diff(hvs[k], hvs[0]) < 1e-14, "H v " << k);
}

// An in-place write to a tensor whose tangent is live would leave the tangent
// stale: every in-place method refuses it, naming itself, even under
// NoGradGuard (which turns off recording, not tangents). A tensor without a
// tangent is written as usual under the level, and a dual one once it closes.
BOOST_AUTO_TEST_CASE(in_place_writes_to_a_tensor_with_a_tangent_are_refused) {
  const Tensor x0 = samples::uniform({2, 3}, 60).detach(), v = samples::uniform({2, 3}, 61).detach();
  Tensor dual, made;
  {
    ForwardADGuard level;
    dual = make_dual(x0.clone(), v);
    made = exp(dual);
    NoGradGuard no_grad;
    for (const Tensor& t : {dual, made}) {
      check_throws<AutogradError>([&] { t.add_(ones({2, 3}, DType::f64)); }, {"add_:", "forward-mode tangent"});
      check_throws<AutogradError>([&] { t.mul_(2.0); }, {"mul_:", "forward-mode tangent"});
      check_throws<AutogradError>([&] { t.fill_(0.0); }, {"fill_:", "forward-mode tangent"});
      check_throws<AutogradError>([&] { t.copy_(x0); }, {"copy_:", "forward-mode tangent"});
    }
    BOOST_TEST(max_rel_diff(tangent(made), mul(v, exp(x0))) < 1e-15);  // untouched
    Tensor plain = x0.clone();
    plain.mul_(2.0);
    BOOST_TEST(max_rel_diff(plain, mul(x0, 2.0)) == 0.0);
  }
  NoGradGuard no_grad;
  made.mul_(2.0);
  BOOST_TEST(max_rel_diff(made, mul(exp(x0), 2.0)) < 1e-15);
}
