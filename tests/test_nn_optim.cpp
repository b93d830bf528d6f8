// Optimizers against torch.optim (fixtures from tests/fixtures/make_nn_optim.py,
// float64 to 1e-12 relative), state round trips, schedulers against their
// formulas, gradient clipping, parameter groups and error paths.
#define BOOST_TEST_MODULE nn_optim
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <numbers>

#include "autograd/autograd.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;

namespace {

const std::string kFixture = "tests/fixtures/nn_optim.json";

Tensor to_tensor(const json& values, const Shape& shape, DType dtype = DType::f64) {
  return from_vector(values.get<std::vector<double>>(), shape).to(dtype).contiguous();
}

// max |a - b| / (|b| + 1e-3): relative where values are not tiny.
double rel_err(const Tensor& a, const json& expected) {
  auto x = a.to(DType::f64).contiguous().to_vector<double>();
  auto y = expected.get<std::vector<double>>();
  BOOST_REQUIRE_EQUAL(x.size(), y.size());
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]) / (std::abs(y[i]) + 1e-3));
  return m;
}

std::unique_ptr<nn::Optimizer> make_optimizer(const std::string& kind, const json& o, std::vector<nn::ParamGroup> groups) {
  if (kind == "SGD")
    return std::make_unique<nn::SGD>(groups, nn::SGDOptions{.lr = o.value("lr", 0.0),
                                                            .momentum = o.value("momentum", 0.0),
                                                            .dampening = o.value("dampening", 0.0),
                                                            .nesterov = o.value("nesterov", false),
                                                            .weight_decay = o.value("weight_decay", 0.0)});
  if (kind == "Adam")
    return std::make_unique<nn::Adam>(groups, nn::AdamOptions{.lr = o.value("lr", 1e-3),
                                                              .beta1 = o.value("beta1", 0.9),
                                                              .beta2 = o.value("beta2", 0.999),
                                                              .eps = o.value("eps", 1e-8),
                                                              .weight_decay = o.value("weight_decay", 0.0)});
  if (kind == "AdamW")
    return std::make_unique<nn::AdamW>(groups, nn::AdamWOptions{.lr = o.value("lr", 1e-3),
                                                                .beta1 = o.value("beta1", 0.9),
                                                                .beta2 = o.value("beta2", 0.999),
                                                                .eps = o.value("eps", 1e-8),
                                                                .weight_decay = o.value("weight_decay", 0.01)});
  if (kind == "Adagrad")
    return std::make_unique<nn::Adagrad>(
        groups, nn::AdagradOptions{.lr = o.value("lr", 1e-2),
                                   .lr_decay = o.value("lr_decay", 0.0),
                                   .weight_decay = o.value("weight_decay", 0.0),
                                   .eps = o.value("eps", 1e-10),
                                   .initial_accumulator_value = o.value("initial_accumulator_value", 0.0)});
  if (kind == "RMSprop")
    return std::make_unique<nn::RMSprop>(groups, nn::RMSpropOptions{.lr = o.value("lr", 1e-2),
                                                                    .alpha = o.value("alpha", 0.99),
                                                                    .eps = o.value("eps", 1e-8),
                                                                    .weight_decay = o.value("weight_decay", 0.0),
                                                                    .momentum = o.value("momentum", 0.0),
                                                                    .centered = o.value("centered", false)});
  BOOST_FAIL("unknown optimizer " << kind);
  return nullptr;
}

struct Case {
  std::vector<Tensor> params;
  std::unique_ptr<nn::Optimizer> opt;
  std::vector<std::pair<size_t, size_t>> where;  // param k -> (group, index)
};

Case build(const json& c, DType dtype = DType::f64) {
  Case out;
  for (const auto& p : c["params"])
    out.params.push_back(to_tensor(p["data"], p["shape"].get<std::vector<int64_t>>(), dtype).requires_grad_());
  out.where.resize(out.params.size());
  std::vector<nn::ParamGroup> groups;
  for (const auto& g : c["groups"]) {
    nn::ParamGroup group{.params = {}, .lr = g.value("lr", -1.0), .weight_decay = g.value("weight_decay", -1.0)};
    for (size_t k : g["params"].get<std::vector<size_t>>()) {
      out.where[k] = {groups.size(), group.params.size()};
      group.params.push_back(out.params[k]);
    }
    groups.push_back(group);
  }
  out.opt = make_optimizer(c["optimizer"], c["options"], groups);
  return out;
}

void set_grads(Case& k, const json& grads, DType dtype = DType::f64) {
  for (size_t i = 0; i < k.params.size(); ++i) {
    k.params[i].zero_grad();
    if (!grads[i].is_null()) k.params[i].set_grad(to_tensor(grads[i], k.params[i].shape(), dtype));
  }
}

Tensor state_of(const nn::Optimizer& opt, const std::string& name) {
  for (auto& [n, t] : opt.state_dict())
    if (n == name) return t;
  BOOST_FAIL("no state " << name);
  return {};
}

}  // namespace

BOOST_AUTO_TEST_CASE(matches_torch_optim_float64) {
  const json& cases = fixture(kFixture)["cases"];
  BOOST_TEST_REQUIRE(cases.size() == 21u);
  double worst = 0;
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT("case " << c["name"].get<std::string>()) {
      Case k = build(c);
      for (size_t s = 0; s < 3; ++s) {
        set_grads(k, c["grads"][s]);
        k.opt->step();
        for (size_t i = 0; i < k.params.size(); ++i) {
          double e = rel_err(k.params[i], c["after"][s][i]);
          worst = std::max(worst, e);
          BOOST_TEST(e < 1e-12, "step " << s + 1 << " param " << i << " relative error " << e);
        }
      }
      BOOST_TEST(k.opt->steps() == 3);
      // The moments after three steps, under torch's names.
      for (size_t i = 0; i < k.params.size(); ++i)
        for (const auto& [name, v] : c["state"][i].items()) {
          auto [g, idx] = k.where[i];
          Tensor t = state_of(*k.opt, fmt::format("{}.{}.{}", g, idx, name));
          if (name == "step")
            BOOST_TEST(t.item() == v.get<double>());
          else
            BOOST_TEST(rel_err(t, v) < 1e-12, name << " of param " << i);
        }
    }
  }
  BOOST_TEST_MESSAGE("worst relative error against torch.optim: " << worst);
}

BOOST_AUTO_TEST_CASE(float32_matches_torch_to_float_precision) {
  BOOST_TEST_REQUIRE(fixture(kFixture)["cases"].size() == 21u);
  for (const auto& c : fixture(kFixture)["cases"]) {
    BOOST_TEST_CONTEXT("case " << c["name"].get<std::string>()) {
      Case k = build(c, DType::f32);
      for (size_t s = 0; s < 3; ++s) {
        set_grads(k, c["grads"][s], DType::f32);
        k.opt->step();
      }
      BOOST_TEST((k.params[0].dtype() == DType::f32));
      for (size_t i = 0; i < k.params.size(); ++i) BOOST_TEST(rel_err(k.params[i], c["after"][2][i]) < 2e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(skipped_parameters_keep_their_state) {
  const json& c = fixture(kFixture)["cases"][19];  // sgd_momentum_skip: the bias has no grad at step 2
  BOOST_REQUIRE_EQUAL(c["name"], "sgd_momentum_skip");
  Case k = build(c);
  set_grads(k, c["grads"][0]);
  k.opt->step();
  std::vector<double> before = k.params[1].to_vector<double>();
  set_grads(k, c["grads"][1]);
  k.opt->step();
  BOOST_TEST(k.params[1].to_vector<double>() == before, boost::test_tools::per_element());
  BOOST_TEST(state_of(*k.opt, "0.1.step").item() == 1.0);
  BOOST_TEST(state_of(*k.opt, "0.0.step").item() == 2.0);
}

BOOST_AUTO_TEST_CASE(state_dict_round_trip_resumes_exactly) {
  BOOST_TEST_REQUIRE(fixture(kFixture)["cases"].size() == 21u);
  for (const auto& c : fixture(kFixture)["cases"]) {
    BOOST_TEST_CONTEXT("case " << c["name"].get<std::string>()) {
      Case full = build(c), first = build(c);
      set_grads(first, c["grads"][0]);
      first.opt->step();
      // A fresh optimizer over copies of the parameters, loaded with the state.
      Case resumed = build(c);
      for (size_t i = 0; i < resumed.params.size(); ++i) {
        NoGradGuard ng;
        resumed.params[i].copy_(first.params[i]);
      }
      resumed.opt->load_state_dict(first.opt->state_dict());
      BOOST_TEST(resumed.opt->steps() == 1);
      for (size_t s = 0; s < 3; ++s) {
        set_grads(full, c["grads"][s]);
        full.opt->step();
        if (s == 0) continue;
        set_grads(resumed, c["grads"][s]);
        resumed.opt->step();
      }
      for (size_t i = 0; i < full.params.size(); ++i)
        BOOST_TEST(full.params[i].to_vector<double>() == resumed.params[i].to_vector<double>(),
                   boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(load_state_dict_lists_every_problem_and_changes_nothing) {
  const json& c = fixture(kFixture)["cases"][5];  // adam
  Case k = build(c);
  set_grads(k, c["grads"][0]);
  k.opt->step();
  auto state = k.opt->state_dict();
  Case other = build(c);
  std::vector<std::pair<std::string, Tensor>> bad;
  for (auto& [n, t] : state)
    if (n == "0.1.exp_avg_sq") continue;  // missing
    else if (n == "0.0.exp_avg") bad.emplace_back(n, zeros({2, 2}, DType::f64));  // mis-shaped
    else bad.emplace_back(n, t);
  bad.emplace_back("0.0.momentum_buffer", zeros({3, 4}, DType::f64));  // not an Adam buffer
  bad.emplace_back("0.7.exp_avg", zeros({3, 4}, DType::f64));          // no such parameter
  check_throws<ValueError>([&] { other.opt->load_state_dict(bad); },
                           {"missing key '0.1.exp_avg_sq'", "'0.0.exp_avg' is (2,2)", "0.0.momentum_buffer",
                            "unexpected key '0.7.exp_avg'", "4 problem(s)"});
  BOOST_TEST(other.opt->steps() == 0);
  BOOST_TEST(other.opt->state_dict().size() == 3u);  // steps, groups, 0.lr: still no moments

  // A state for another layout of parameters.
  Case groups = build(fixture(kFixture)["cases"][16]);  // adam_groups: two groups of one parameter
  BOOST_CHECK_THROW(groups.opt->load_state_dict(state), ValueError);

  // Group sizes that are no counts (found by fuzz_safetensors_optimizer: 5e141
  // was converted to int64_t, which is undefined) are refused by name.
  for (double size : {5.18765e141, -1.0, 2.5, std::nan("")}) {
    std::vector<std::pair<std::string, Tensor>> sized;
    for (auto& [n, t] : state) sized.emplace_back(n, n == "groups" ? full({1}, size, DType::f64) : t);
    check_throws<ValueError>([&] { other.opt->load_state_dict(sized); }, {"'groups' must hold whole non-negative counts"});
  }
}

BOOST_AUTO_TEST_CASE(steps_update_in_place_without_reallocating) {
  Tensor w = randn({64, 32}, DType::f32).requires_grad_();
  Tensor b = randn({32}, DType::f32).requires_grad_();
  nn::AdamW opt({w, b}, {.lr = 1e-2});
  const void* wdata = w.storage()->data;
  std::vector<const void*> buffers;
  uint64_t version = w.version();
  for (int s = 0; s < 3; ++s) {
    w.set_grad(ones({64, 32}));
    b.set_grad(ones({32}));
    opt.step();
    std::vector<const void*> now;
    for (auto& [n, t] : opt.state_dict())
      if (n.find("exp_avg") != std::string::npos) now.push_back(t.storage()->data);
    if (s == 0) buffers = now;
    BOOST_TEST(now == buffers, boost::test_tools::per_element());
  }
  BOOST_TEST(w.storage()->data == wdata);
  BOOST_TEST(w.version() > version);  // the tape sees the in-place update
  BOOST_TEST(opt.steps() == 3);
  opt.zero_grad();
  BOOST_TEST(!w.grad().defined());
  BOOST_TEST(!b.grad().defined());
}

BOOST_AUTO_TEST_CASE(non_contiguous_parameters_and_float32_gradients) {
  Tensor base = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor p = base.t();  // (3,2) view, not contiguous
  BOOST_REQUIRE(!p.is_contiguous());
  p.requires_grad_();
  nn::SGD opt({p}, {.lr = 0.5});
  p.set_grad(full({3, 2}, 2.0, DType::f64));
  opt.step();
  BOOST_TEST(base.to_vector<double>() == (std::vector<double>{0, 1, 2, 3, 4, 5}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(param_groups_and_learning_rates) {
  Tensor a = zeros({2, 2}).requires_grad_(), b = zeros({2}).requires_grad_();
  nn::SGD opt(std::vector<nn::ParamGroup>{{.params = {a}, .lr = -1, .weight_decay = -1}, {.params = {b}, .lr = 0.5, .weight_decay = -1}},
              {.lr = 0.1});
  BOOST_TEST(opt.param_groups()[0].lr == 0.1);
  BOOST_TEST(opt.param_groups()[1].lr == 0.5);
  BOOST_TEST(opt.lr() == 0.1);
  a.set_grad(ones({2, 2}));
  b.set_grad(ones({2}));
  opt.step();
  BOOST_TEST(a.to_vector<float>()[0] == -0.1f);
  BOOST_TEST(b.to_vector<float>()[0] == -0.5f);
  opt.set_lr(0.25);
  BOOST_TEST(opt.param_groups()[1].lr == 0.25);
  BOOST_CHECK_THROW(opt.set_lr(-1), ValueError);
}

BOOST_AUTO_TEST_CASE(weight_decay_groups_split_by_rank) {
  struct Tiny : nn::Module {
    Tensor w, bias, gain;
    Tiny() : Module("Tiny") {
      w = register_parameter("w", zeros({3, 4}));
      bias = register_parameter("bias", zeros({4}));
      gain = register_parameter("gain", ones({4}));
    }
  } m;
  auto groups = nn::weight_decay_groups(m, 0.1);
  BOOST_REQUIRE_EQUAL(groups.size(), 2u);
  BOOST_TEST(groups[0].weight_decay == 0.1);
  BOOST_TEST(groups[1].weight_decay == 0.0);
  BOOST_REQUIRE_EQUAL(groups[0].params.size(), 1u);
  BOOST_TEST(groups[0].params[0].impl() == m.w.impl());
  BOOST_REQUIRE_EQUAL(groups[1].params.size(), 2u);
  nn::AdamW opt(groups, {.lr = 0.1, .weight_decay = 0.5});
  BOOST_TEST(opt.param_groups()[0].weight_decay == 0.1);  // the group's own value wins over the default
  // With zero gradients AdamW only decays: w *= 1 - lr * wd; the biases stay.
  {
    NoGradGuard ng;
    m.w.fill_(2.0);
  }
  for (auto& p : m.parameters()) p.set_grad(zeros_like(p));
  opt.step();
  BOOST_TEST(m.w.to_vector<float>()[0] == 2.0f * (1 - 0.1f * 0.1f), boost::test_tools::tolerance(1e-6f));
  BOOST_TEST(m.gain.to_vector<float>()[0] == 1.0f);
}

BOOST_AUTO_TEST_CASE(schedulers_follow_their_formulas) {
  nn::ConstantLR constant(0.3);
  BOOST_TEST(constant.lr_at(0) == 0.3);
  BOOST_TEST(constant.lr_at(1000) == 0.3);

  nn::StepLR step(1.0, 10, 0.5);
  BOOST_TEST(step.lr_at(0) == 1.0);
  BOOST_TEST(step.lr_at(9) == 1.0);
  BOOST_TEST(step.lr_at(10) == 0.5);
  BOOST_TEST(step.lr_at(35) == 0.125);

  nn::LinearDecayLR linear(1.0, 0.1, 100);
  BOOST_TEST(linear.lr_at(0) == 1.0);
  BOOST_TEST(linear.lr_at(50) == 0.55, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(linear.lr_at(100) == 0.1, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(linear.lr_at(500) == 0.1, boost::test_tools::tolerance(1e-15));

  nn::CosineWarmupLR cosine(1e-3, 10, 110, 1e-4);
  BOOST_TEST(cosine.lr_at(0) == 1e-4, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(cosine.lr_at(4) == 5e-4, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(cosine.lr_at(9) == 1e-3, boost::test_tools::tolerance(1e-15));
  BOOST_TEST(cosine.lr_at(10) == 1e-3, boost::test_tools::tolerance(1e-15));
  for (int64_t s : {10, 35, 60, 85, 109}) {
    double expect = 1e-4 + 0.5 * (1 + std::cos(std::numbers::pi * (s - 10) / 100.0)) * (1e-3 - 1e-4);
    BOOST_TEST(cosine.lr_at(s) == expect, boost::test_tools::tolerance(1e-14));
  }
  BOOST_TEST(cosine.lr_at(60) == 5.5e-4, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(cosine.lr_at(110) == 1e-4);
  BOOST_TEST(cosine.lr_at(10000) == 1e-4);

  Tensor p = zeros({2}).requires_grad_();
  nn::Adam opt({p}, {.lr = 1.0});
  cosine.step(opt, 4);
  BOOST_TEST(opt.lr() == 5e-4, boost::test_tools::tolerance(1e-15));

  BOOST_CHECK_THROW(nn::StepLR(1.0, 0), ValueError);
  BOOST_CHECK_THROW(nn::CosineWarmupLR(1.0, 20, 10), ValueError);
  BOOST_CHECK_THROW(nn::LinearDecayLR(-1.0, 0.0, 10), ValueError);
  BOOST_CHECK_THROW(constant.lr_at(-1), ValueError);
}

BOOST_AUTO_TEST_CASE(clipping_matches_torch) {
  const json& clip = fixture(kFixture)["clip"];
  BOOST_TEST_REQUIRE(clip["input"].size() == 2u);  // a (3,4) and a (4) gradient
  auto make = [&] {
    std::vector<Tensor> ps;
    for (const auto& g : clip["input"]) {
      Shape s = g.size() == 12 ? Shape{3, 4} : Shape{4};
      Tensor p = zeros(s, DType::f64).requires_grad_();
      p.set_grad(to_tensor(g, s));
      ps.push_back(p);
    }
    ps.push_back(zeros({5}, DType::f64).requires_grad_());  // no grad: skipped
    return ps;
  };
  for (const char* key : {"norm_0.5", "norm_100.0"}) {
    auto ps = make();
    double total = nn::clip_grad_norm_(ps, clip[key]["max_norm"]);
    BOOST_TEST(total == clip[key]["total"].get<double>(), boost::test_tools::tolerance(1e-13));
    for (size_t i = 0; i < 2; ++i) BOOST_TEST(rel_err(ps[i].grad(), clip[key]["grads"][i]) < 1e-13);
    BOOST_TEST(!ps[2].grad().defined());
  }
  auto ps = make();
  nn::clip_grad_value_(ps, clip["value_0.7"]["clip"]);
  for (size_t i = 0; i < 2; ++i) BOOST_TEST(rel_err(ps[i].grad(), clip["value_0.7"]["grads"][i]) == 0.0);
  // float32 gradients, norm accumulated in double: 3-4-5.
  Tensor p = zeros({2}).requires_grad_();
  p.set_grad(from_vector(std::vector<float>{3, 4}, {2}));
  BOOST_TEST(nn::clip_grad_norm_({p}, 1.0) == 5.0);
  BOOST_TEST(p.grad().to_vector<float>()[0] == 3.0f / (5.0f + 1e-6f), boost::test_tools::tolerance(1e-6f));
  BOOST_CHECK_THROW(nn::clip_grad_norm_({p}, -1.0), ValueError);
  BOOST_CHECK_THROW(nn::clip_grad_value_({p}, -1.0), ValueError);
}

BOOST_AUTO_TEST_CASE(invalid_construction_and_steps) {
  Tensor p = zeros({2}).requires_grad_();
  BOOST_CHECK_THROW(nn::SGD(std::vector<Tensor>{}, {.lr = 0.1}), ValueError);
  BOOST_CHECK_THROW(nn::SGD({p, p}, {.lr = 0.1}), ValueError);
  BOOST_CHECK_THROW(nn::SGD({p}, {.lr = -0.1}), ValueError);
  BOOST_CHECK_THROW(nn::SGD({p}, {.lr = 0.1, .nesterov = true}), ValueError);
  BOOST_CHECK_THROW(nn::Adam({p}, {.beta1 = 1.0}), ValueError);
  BOOST_CHECK_THROW(nn::RMSprop({p}, {.alpha = -1}), ValueError);
  BOOST_CHECK_THROW(nn::Adagrad({p}, {.lr_decay = -1}), ValueError);
  BOOST_CHECK_THROW(nn::Adam({zeros({2}, DType::i64)}), DTypeError);
  BOOST_CHECK_THROW(nn::Adam({Tensor()}), ValueError);
  // A gradient of the wrong shape (set behind the optimizer's back) is a ShapeError at step.
  nn::Adam opt({p});
  p.impl()->grad = zeros({3});
  BOOST_CHECK_THROW(opt.step(), ShapeError);
}
