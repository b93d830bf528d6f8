// Higher-order derivatives: PyTorch parity (tests/fixtures/higher_order.json,
// made by make_higher_order.py) in float64 of
//  - Hessian-vector products H v = d (d loss / d params . v) / d params of an
//    MLP (tanh, MSE) and of a pre-LN causal transformer block (sum of squares,
//    and cross entropy under a fixed head);
//  - the parameter gradient of an input-gradient penalty
//    L = loss(x) + lambda ||d loss / d x||^2 on the MLP.
// First derivatives come from tg::grad with create_graph, so the second pass
// differentiates the recorded backward of every op the models use.
#define BOOST_TEST_MODULE higher_order
#include <boost/test/unit_test.hpp>

#include <functional>

#include "autograd/autograd.h"
#include "nn/linear.h"
#include "nn/loss.h"
#include "nn/transformer.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;

namespace {

constexpr double kTol = 1e-10;

const json& fixture_case(const std::string& name) {
  const json& cases = fixture("tests/fixtures/higher_order.json")["cases"];
  BOOST_REQUIRE_MESSAGE(cases.contains(name), "higher_order.json lacks case " << name);
  return cases[name];
}

// The fixture's MLP: fc1 (4 -> 6), tanh, fc2 (6 -> 3).
struct Mlp : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  Mlp() : Module("Mlp") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 4, .out = 6}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 6, .out = 3}));
  }
  Tensor forward(const Tensor& x) { return fc2->forward(tanh(fc1->forward(x))); }
};

// The fixture's block: pre-LN, C = 8, 2 heads, MLP 32 with exact GELU; run causal.
std::shared_ptr<nn::TransformerEncoderLayer> make_block() {
  return std::make_shared<nn::TransformerEncoderLayer>(nn::TransformerLayerOptions{
      .dim = 8, .heads = 2, .hidden_mult = 4, .activation = nn::Activation::gelu, .norm = nn::NormPosition::pre});
}

// c[key] must be a non-empty fixture tensor with as many values as its shape;
// failures name it as `where key`.
void require_tensor(const json& c, const std::string& key, const std::string& where) {
  BOOST_REQUIRE_MESSAGE(c.contains(key), where << " lacks " << key);
  const int64_t numel = shape_of(c[key]).numel();
  BOOST_REQUIRE_MESSAGE(numel > 0 && c[key]["data"].size() == static_cast<size_t>(numel),
                        where << " " << key << ": " << c[key]["data"].size() << " values for shape " << shape_of(c[key]).str());
}

// A fixture group (params, v, grads, hvp) must hold exactly the tensors of names.
void require_group(const json& c, const std::string& key, const std::vector<std::string>& names) {
  BOOST_REQUIRE_MESSAGE(c.contains(key) && c[key].is_object(), "fixture case lacks \"" << key << "\"");
  const json& g = c[key];
  BOOST_REQUIRE_MESSAGE(g.size() == names.size(), "\"" << key << "\" holds " << g.size() << " tensors, expected " << names.size());
  for (const std::string& n : names) require_tensor(g, n, "\"" + key + "\"");
}

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> out;
  for (auto& [n, p] : m.named_parameters()) out.push_back(n);
  return out;
}

// H v of loss_fn() w.r.t. m's parameters, loaded from case `name`: loss,
// first derivatives (create_graph) and H v against torch's.
void hvp_parity(const std::string& name, nn::Module& m, size_t n_params, const std::function<Tensor()>& loss_fn) {
  const json& c = fixture_case(name);
  BOOST_REQUIRE_EQUAL(m.named_parameters().size(), n_params);
  const std::vector<std::string> names = names_of(m);
  require_tensor(c, "loss", name);
  for (const char* key : {"params", "v", "grads", "hvp"}) require_group(c, key, names);
  load_params(m, c["params"], DType::f64);

  std::vector<Tensor> params, v;
  for (auto& [n, p] : m.named_parameters()) {
    params.push_back(p);
    v.push_back(load(c["v"][n]));
  }
  Tensor loss = loss_fn();
  std::vector<Tensor> g = tg::grad({loss}, params, {}, {.retain_graph = true, .create_graph = true});
  BOOST_REQUIRE_EQUAL(g.size(), params.size());
  Tensor gv;
  for (size_t k = 0; k < g.size(); ++k) {
    Tensor term = sum(mul(g[k], v[k]));
    gv = gv.defined() ? add(gv, term) : term;
  }
  std::vector<Tensor> hv = tg::grad({gv}, params);

  Parity p{kTol};
  p.check(name + " loss", loss, load(c["loss"]));
  for (size_t k = 0; k < names.size(); ++k) p.check(name + " grad " + names[k], g[k], load(c["grads"][names[k]]));
  Parity second{kTol};
  for (size_t k = 0; k < names.size(); ++k) second.check(name + " hvp " + names[k], hv[k], load(c["hvp"][names[k]]));
  BOOST_TEST_MESSAGE(name << ": max relative error vs torch: loss and gradients " << p.worst << ", H v " << second.worst);
}

}  // namespace

BOOST_AUTO_TEST_CASE(mlp_hessian_vector_product_matches_torch) {
  const json& in = fixture_case("mlp_hvp")["inputs"];
  const Tensor x = load(in["x"]), target = load(in["target"]);
  Mlp mlp;
  hvp_parity("mlp_hvp", mlp, 4, [&] { return nn::mse_loss(mlp.forward(x), target); });
}

BOOST_AUTO_TEST_CASE(transformer_block_hessian_vector_product_matches_torch) {
  const Tensor x = load(fixture_case("block_sumsq")["inputs"]["x"]);
  auto block = make_block();
  hvp_parity("block_sumsq", *block, 12, [&] {
    Tensor y = block->forward(x, {.causal = true});
    return sum(mul(y, y));
  });
}

BOOST_AUTO_TEST_CASE(transformer_block_cross_entropy_hessian_vector_product_matches_torch) {
  const json& in = fixture_case("block_ce")["inputs"];
  const Tensor x = load(in["x"]), head = load(in["head"]), targets = load_ids(in["targets"]);
  BOOST_REQUIRE_EQUAL(targets.numel(), 8);
  auto block = make_block();
  hvp_parity("block_ce", *block, 12, [&] {
    // head (V, C): logits (B*T, V) against targets (B*T).
    Tensor logits = linear(block->forward(x, {.causal = true}), head).reshape({targets.numel(), head.size(0)});
    return nn::cross_entropy(logits, targets);
  });
}

BOOST_AUTO_TEST_CASE(mlp_input_gradient_penalty_matches_torch) {
  const json& c = fixture_case("mlp_penalty");
  Mlp mlp;
  BOOST_REQUIRE_EQUAL(mlp.named_parameters().size(), 4u);
  const std::vector<std::string> names = names_of(mlp);
  for (const char* key : {"loss", "input_grad", "total"}) require_tensor(c, key, "mlp_penalty");
  for (const char* key : {"params", "grads"}) require_group(c, key, names);
  load_params(mlp, c["params"], DType::f64);
  const double lambda = c["lambda"].get<double>();
  const Tensor x = load(c["inputs"]["x"]).requires_grad_(), target = load(c["inputs"]["target"]);

  Tensor loss = nn::mse_loss(mlp.forward(x), target);
  Tensor gx = tg::grad({loss}, {x}, {}, {.retain_graph = true, .create_graph = true})[0];
  Tensor total = add(loss, mul(sum(mul(gx, gx)), lambda));
  std::vector<Tensor> g = tg::grad({total}, mlp.parameters());

  Parity first{kTol};
  first.check("mlp_penalty loss", loss, load(c["loss"]));
  first.check("mlp_penalty d loss / d x", gx, load(c["input_grad"]));
  first.check("mlp_penalty total", total, load(c["total"]));
  Parity second{kTol};
  BOOST_REQUIRE_EQUAL(g.size(), names.size());
  for (size_t k = 0; k < names.size(); ++k) second.check("mlp_penalty grad " + names[k], g[k], load(c["grads"][names[k]]));
  BOOST_TEST_MESSAGE("mlp_penalty: max relative error vs torch: loss and d loss / d x " << first.worst
                     << ", d L / d params " << second.worst);
}
