// Losses: PyTorch parity (tests/fixtures/nn_rnn.json, made by
// make_nn_rnn.py), float64 gradchecks, stability at huge logits, errors.
#define BOOST_TEST_MODULE nn_loss
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "autograd/autograd.h"
#include "autograd/ops/samples.h"
#include "nn/loss.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;

namespace {

const std::string kFixture = "tests/fixtures/nn_rnn.json";

Reduction reduction_of(const std::string& s) {
  return s == "mean" ? Reduction::mean : s == "sum" ? Reduction::sum : Reduction::none;
}

// The loss a fixture case describes, applied to its inputs.
Tensor loss_of(const json& c, const std::vector<Tensor>& in) {
  const std::string op = c["op"];
  const Reduction r = reduction_of(c["reduction"]);
  if (op == "cross_entropy")
    return nn::cross_entropy(
        in[0], load_ids(c["targets"]),
        {.ignore_index = c["ignore_index"], .label_smoothing = c["label_smoothing"], .reduction = r});
  if (op == "nll_loss") return nn::nll_loss(in[0], load_ids(c["targets"]), c["ignore_index"], r);
  if (op == "mse_loss") return nn::mse_loss(in[0], in[1], r);
  return nn::binary_cross_entropy_with_logits(in[0], in[1], r, in.size() > 2 ? in[2] : Tensor());
}

}  // namespace

BOOST_AUTO_TEST_CASE(losses_match_torch_float64) {
  double worst = 0;
  const json& losses = fixture(kFixture)["losses"];
  BOOST_TEST_REQUIRE(losses.size() == 19u);
  for (const json& c : losses) {
    const std::string name = c["name"];
    BOOST_TEST_REQUIRE(c["grads"].size() == c["inputs"].size(), name << ": one gradient entry per input");
    std::vector<Tensor> in;
    for (size_t k = 0; k < c["inputs"].size(); ++k) {
      in.push_back(load(c["inputs"][k]));
      if (!c["grads"][k].is_null()) in.back().requires_grad_();
    }
    Tensor out = loss_of(c, in);
    sum(mul(out, load(c["probe"]))).backward();
    double e = rel_error(out, load(c["output"]));
    BOOST_TEST(e <= 1e-10, name << " output: relative error " << e);
    worst = std::max(worst, e);
    for (size_t k = 0; k < in.size(); ++k) {
      if (c["grads"][k].is_null()) continue;
      double g = rel_error(in[k].grad(), load(c["grads"][k]));
      BOOST_TEST(g <= 1e-10, name << " grad of input " << k << ": relative error " << g);
      worst = std::max(worst, g);
    }
  }
  BOOST_TEST_MESSAGE("losses, float64: worst relative error vs torch " << worst);
}

BOOST_AUTO_TEST_CASE(cross_entropy_float32_matches_float64) {
  const json& c = fixture(kFixture)["losses"][1];  // mean, label smoothing 0.1
  Tensor x64 = load(c["inputs"][0]);
  Tensor x32 = x64.to(DType::f32).requires_grad_();
  Tensor out = loss_of(c, {x32});
  out.backward();
  BOOST_TEST(rel_error(out, load(c["output"])) <= 1e-5);
}

BOOST_AUTO_TEST_CASE(losses_gradcheck_float64) {
  using samples::uniform;
  Tensor t = from_vector(std::vector<int64_t>{2, 0, -100, 3}, {4});
  Tensor t3 = from_vector(std::vector<int64_t>{1, 4, 0, 2, 2, 3}, {2, 3});
  struct Case {
    std::string name;
    std::vector<Tensor> in;
    TensorFn fn;
  };
  std::vector<Case> cases;
  for (Reduction r : {Reduction::mean, Reduction::sum, Reduction::none}) {
    const std::string rn = r == Reduction::mean ? "mean" : r == Reduction::sum ? "sum" : "none";
    cases.push_back({"cross_entropy " + rn, {uniform({4, 5}, 1, -3, 3)}, [=](auto& x) {
                       return nn::cross_entropy(x[0], t, {.label_smoothing = 0.15, .reduction = r});
                     }});
    cases.push_back({"cross_entropy (N,C,d) " + rn, {uniform({2, 5, 3}, 2, -3, 3)}, [=](auto& x) {
                       return nn::cross_entropy(x[0], t3, {.ignore_index = 2, .reduction = r});
                     }});
    cases.push_back(
        {"nll_loss " + rn, {uniform({4, 5}, 3, -3, 0)}, [=](auto& x) { return nn::nll_loss(x[0], t, -100, r); }});
    cases.push_back({"nll_loss (N,C,d) " + rn, {uniform({2, 5, 3}, 4, -3, 0)}, [=](auto& x) {
                       return nn::nll_loss(x[0], t3, 4, r);
                     }});
    cases.push_back({"mse_loss " + rn, {uniform({3, 4}, 5), samples::strided({3, 4}, 6)}, [=](auto& x) {
                       return nn::mse_loss(x[0], x[1], r);
                     }});
    cases.push_back({"bce_with_logits " + rn, {uniform({3, 4}, 7, -4, 4), uniform({3, 4}, 8, 0, 1)}, [=](auto& x) {
                       return nn::binary_cross_entropy_with_logits(x[0], x[1], r);
                     }});
    cases.push_back({"bce_with_logits pos_weight " + rn,
                     {uniform({3, 4}, 9, -4, 4), uniform({3, 4}, 10, 0, 1), uniform({4}, 11, 0.5, 3)},
                     [=](auto& x) { return nn::binary_cross_entropy_with_logits(x[0], x[1], r, x[2]); }});
  }
  for (const Case& c : cases) {
    GradcheckReport rep = gradcheck(c.fn, c.in);
    BOOST_TEST(rep.passed, c.name << "\n" << rep.str());
  }
}

// Logits of +-1e4: exact losses, finite gradients (softmax - one-hot; sigmoid - y).
BOOST_AUTO_TEST_CASE(stable_at_huge_logits) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = from_vector(std::vector<double>{1e4, 0, -1e4, -1e4, 0, 1e4}, {2, 3}).to(dt).requires_grad_();
    Tensor t = from_vector(std::vector<int64_t>{0, 0}, {2});
    Tensor l = nn::cross_entropy(x, t, {.reduction = Reduction::none});
    BOOST_TEST(l.at({0}) == 0.0, "cross_entropy at the max logit " << l.at({0}));
    BOOST_TEST(std::abs(l.at({1}) - 2e4) <= 1e-6 * 2e4, "cross_entropy 2e4 below the max " << l.at({1}));
    sum(l).backward();
    Tensor want = from_vector(std::vector<double>{0, 0, 0, -1, 0, 1}, {2, 3});
    BOOST_TEST(rel_error(x.grad(), want) <= 1e-6);

    Tensor z = from_vector(std::vector<double>{1e4, -1e4, 1e4, -1e4}, {4}).to(dt).requires_grad_();
    Tensor y = from_vector(std::vector<double>{0, 1, 1, 0}, {4}).to(dt);
    Tensor b = nn::binary_cross_entropy_with_logits(z, y, Reduction::none, full({4}, 2.0, dt));
    Tensor bwant = from_vector(std::vector<double>{1e4, 2e4, 0, 0}, {4});
    BOOST_TEST(rel_error(b, bwant) <= 1e-6);
    sum(b).backward();
    Tensor gwant = from_vector(std::vector<double>{1, -2, 0, 0}, {4});  // (1 - y) - w y sigmoid(-x)
    BOOST_TEST(rel_error(z.grad(), gwant) <= 1e-6);
  }
}

BOOST_AUTO_TEST_CASE(reductions_and_ignored_targets) {
  Tensor lp = log_softmax(from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3}), 1);
  Tensor t = from_vector(std::vector<int64_t>{2, -100}, {2});
  // Only the first row counts, and the mean divides by 1.
  BOOST_TEST(std::abs(nn::nll_loss(lp, t).item() + lp.at({0, 2})) < 1e-15);
  BOOST_TEST(std::abs(nn::nll_loss(lp, t, -100, Reduction::sum).item() + lp.at({0, 2})) < 1e-15);
  Tensor none = nn::nll_loss(lp, t, -100, Reduction::none);
  BOOST_TEST(none.at({1}) == 0.0);
  // All ignored: torch's 0/0 = NaN.
  BOOST_TEST(std::isnan(nn::nll_loss(lp, from_vector(std::vector<int64_t>{-100, -100}, {2})).item()));
}

// Every target ignored under the mean: the loss is NaN, and the gradient zero
// on both backward paths (plain and create_graph), as torch's, for nll_loss and
// cross_entropy.
BOOST_AUTO_TEST_CASE(every_target_ignored_gives_zero_gradients) {
  const Tensor x = from_vector(std::vector<double>{0.3, -1.2, 2.0, 0.5, 0.1, -0.7}, {2, 3}).requires_grad_();
  const Tensor ignored = from_vector(std::vector<int64_t>{-100, -100}, {2});
  const std::function<Tensor()> losses[] = {[&] { return nn::nll_loss(log_softmax(x, 1), ignored); },
                                            [&] { return nn::cross_entropy(x, ignored); }};
  for (const auto& loss : losses)
    for (bool create_graph : {false, true}) {
      const Tensor l = loss();
      BOOST_TEST(std::isnan(l.item()));
      const Tensor g = tg::grad({l}, {x}, {}, {.create_graph = create_graph})[0];
      for (double v : g.contiguous().to_vector<double>()) BOOST_TEST(v == 0.0, "create_graph " << create_graph);
    }
  Tensor a = from_vector(std::vector<double>{1, 2, 3}, {3}), b = from_vector(std::vector<double>{1, 4, 0}, {3});
  BOOST_TEST(nn::mse_loss(a, b).item() == 13.0 / 3);
  BOOST_TEST(nn::mse_loss(a, b, Reduction::sum).item() == 13.0);
}

BOOST_AUTO_TEST_CASE(loss_errors) {
  Tensor x = zeros({2, 3}, DType::f64);
  BOOST_CHECK_EXCEPTION(nn::mse_loss(x, zeros({3, 2}, DType::f64)), ShapeError,
                        says<ShapeError>({"mse_loss", "(2,3)", "(3,2)"}));
  BOOST_CHECK_EXCEPTION(nn::mse_loss(x, zeros({2, 3})), DTypeError,
                        says<DTypeError>({"mse_loss", "float64", "float32"}));
  BOOST_CHECK_EXCEPTION(nn::binary_cross_entropy_with_logits(x, zeros({2, 1}, DType::f64)), ShapeError,
                        says<ShapeError>({"binary_cross_entropy_with_logits", "(2,1)"}));
  BOOST_CHECK_EXCEPTION(nn::binary_cross_entropy_with_logits(x, x, Reduction::mean, zeros({4}, DType::f64)), ShapeError,
                        says<ShapeError>({"pos_weight", "(4)", "(2,3)"}));
  BOOST_CHECK_EXCEPTION(nn::nll_loss(x, from_vector(std::vector<int64_t>{0, 3}, {2})), IndexError,
                        says<IndexError>({"nll_loss", "target 3", "3 classes"}));
  BOOST_CHECK_EXCEPTION(nn::nll_loss(x, from_vector(std::vector<int64_t>{0, 1, 2}, {3})), ShapeError,
                        says<ShapeError>({"nll_loss", "(2,3)", "(3)"}));
  BOOST_CHECK_EXCEPTION(nn::nll_loss(x, zeros({2}, DType::f64)), DTypeError, says<DTypeError>({"nll_loss", "int64"}));
  BOOST_CHECK_THROW(nn::cross_entropy(x, from_vector(std::vector<int64_t>{0, 7}, {2})), IndexError);
}
