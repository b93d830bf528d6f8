// Fused NN primitives (autograd/ops/softmax.cpp, norm.cpp, dropout.cpp,
// attention.cpp): values and gradients against PyTorch
// (tests/fixtures/nn_ops.json, written by make_nn_ops.py) to 1e-10 relative
// in float64, stability at logits of +-1e4, the float32 fast paths against
// float64, dropout's mask, fully masked attention rows, and every error path.
// Their OpDef samples are gradchecked by the op-table walk (test_op_table.cpp).
#define BOOST_TEST_MODULE nn_ops
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/samples.h"
#include "tests/testing.h"

using namespace tg;
using json = nlohmann::json;
using namespace tg::testing;

namespace {

const json& fixture() { return testing::fixture("tests/fixtures/nn_ops.json"); }
Tensor leaf(const json& j) { return load(j).requires_grad_(); }

// Backward of sum(out * probe): the gradients the fixture stores.
void backward_with_probe(const Tensor& out, const json& c) { sum(mul(out, load(c["probe"]))).backward(); }

Reduction reduction_of(const std::string& s) {
  return s == "mean" ? Reduction::mean : s == "sum" ? Reduction::sum : Reduction::none;
}

bool all_finite(const Tensor& t) {
  for (double v : t.to(DType::f64).contiguous().to_vector<double>())
    if (!std::isfinite(v)) return false;
  return true;
}

constexpr double kTorchTol = 1e-10;

}  // namespace

// ============================ PyTorch parity ============================
BOOST_AUTO_TEST_CASE(softmax_and_log_softmax_match_torch) {
  BOOST_TEST_REQUIRE(fixture()["softmax"].size() == 10u);
  for (const json& c : fixture()["softmax"]) {
    Tensor x = leaf(c["x"]);
    const int64_t axis = c["axis"];
    Tensor out = c["op"] == "softmax" ? softmax(x, axis) : log_softmax(x, axis);
    BOOST_TEST(rel_error(out, load(c["out"])) < kTorchTol, c["op"] << " " << x.shape().str() << " axis " << axis);
    backward_with_probe(out, c);
    BOOST_TEST(rel_error(x.grad(), load(c["grad_x"])) < kTorchTol, c["op"] << " grad " << x.shape().str());
  }
}

BOOST_AUTO_TEST_CASE(cross_entropy_matches_torch) {
  BOOST_TEST_REQUIRE(fixture()["cross_entropy"].size() == 12u);
  for (const json& c : fixture()["cross_entropy"]) {
    Tensor x = leaf(c["logits"]);
    Tensor out = cross_entropy(x, load_ids(c["targets"]), c["ignore_index"], c["label_smoothing"],
                               reduction_of(c["reduction"]));
    const std::string what = fmt::format("{} ignore {} smoothing {} {}", x.shape(), c["ignore_index"].get<int64_t>(),
                                         c["label_smoothing"].get<double>(), c["reduction"].get<std::string>());
    BOOST_TEST(rel_error(out, load(c["out"])) < kTorchTol, what);
    backward_with_probe(out, c);
    BOOST_TEST(rel_error(x.grad(), load(c["grad_logits"])) < kTorchTol, what << " grad");
  }
}

BOOST_AUTO_TEST_CASE(layer_norm_matches_torch) {
  BOOST_TEST_REQUIRE(fixture()["layer_norm"].size() == 4u);
  for (const json& c : fixture()["layer_norm"]) {
    Tensor x = leaf(c["x"]);
    const bool affine = c.contains("weight");
    Tensor w = affine ? leaf(c["weight"]) : Tensor(), b = affine ? leaf(c["bias"]) : Tensor();
    Tensor out = layer_norm(x, w, b, c["eps"]);
    BOOST_TEST(rel_error(out, load(c["out"])) < kTorchTol, "layer_norm " << x.shape().str());
    backward_with_probe(out, c);
    BOOST_TEST(rel_error(x.grad(), load(c["grad_x"])) < kTorchTol);
    if (affine) {
      BOOST_TEST(rel_error(w.grad(), load(c["grad_weight"])) < kTorchTol);
      BOOST_TEST(rel_error(b.grad(), load(c["grad_bias"])) < kTorchTol);
    }
  }
}

BOOST_AUTO_TEST_CASE(attention_matches_torch) {
  BOOST_TEST_REQUIRE(fixture()["attention"].size() == 7u);
  for (const json& c : fixture()["attention"]) {
    Tensor q = leaf(c["q"]), k = leaf(c["k"]), v = leaf(c["v"]);
    Tensor mask = c.contains("key_padding_mask") ? load_ids(c["key_padding_mask"]) : Tensor();
    Tensor weights;
    Tensor out = scaled_dot_product_attention(q, k, v, c["causal"], mask, &weights);
    const std::string what = fmt::format("q {} k {} v {} causal {} mask {}", q.shape(), k.shape(), v.shape(),
                                         c["causal"].get<bool>(), mask.defined());
    BOOST_TEST(rel_error(out, load(c["out"])) < kTorchTol, what);
    BOOST_TEST(rel_error(weights, load(c["weights"])) < kTorchTol, what << " weights");
    backward_with_probe(out, c);
    BOOST_TEST(rel_error(q.grad(), load(c["grad_q"])) < kTorchTol, what << " grad q");
    BOOST_TEST(rel_error(k.grad(), load(c["grad_k"])) < kTorchTol, what << " grad k");
    BOOST_TEST(rel_error(v.grad(), load(c["grad_v"])) < kTorchTol, what << " grad v");
  }
}

// ============================ stability ============================
BOOST_AUTO_TEST_CASE(softmax_is_stable_at_huge_logits_in_both_dtypes) {
  for (DType dt : {DType::f32, DType::f64}) {
    Tensor x = tensor({1e4, -1e4, 0.0, 1e4}).to(dt);
    auto p = softmax(x).to(DType::f64).to_vector<double>();
    BOOST_TEST(p[0] == 0.5, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(p[1] == 0.0);
    BOOST_TEST(p[2] == 0.0);
    BOOST_TEST(p[3] == 0.5, boost::test_tools::tolerance(1e-6));
    // float32 holds 1e4 to about 1e-3: log_softmax there is exact to that spacing.
    const double tol = dt == DType::f32 ? 1e-3 : 1e-12;
    auto lp = log_softmax(x).to(DType::f64).to_vector<double>();
    BOOST_TEST(std::abs(lp[0] + std::log(2.0)) < tol);
    BOOST_TEST(std::abs(lp[1] - (-2e4 - std::log(2.0))) < tol);
    BOOST_TEST(std::abs(lp[2] - (-1e4 - std::log(2.0))) < tol);
    Tensor logits = from_vector(std::vector<double>{1e4, -1e4, 0.0, -1e4, 1e4, 1e4}, {2, 3}).to(dt);
    logits.requires_grad_();
    Tensor loss = cross_entropy(logits, ids({1, 2}));
    // Row 0: lse = 1e4, loss 2e4; row 1: lse = 1e4 + log 2, loss log 2.
    BOOST_TEST(loss.item() == (2e4 + std::log(2.0)) / 2, boost::test_tools::tolerance(1e-6));
    loss.backward();
    BOOST_TEST(all_finite(logits.grad()));
    BOOST_TEST(logits.grad().at({0, 0}) == 0.5, boost::test_tools::tolerance(1e-6));
    BOOST_TEST(logits.grad().at({0, 1}) == -0.5, boost::test_tools::tolerance(1e-6));
  }
}

// ============================ float32 fast paths ============================
// The float32 kernels (vectorised exp, threads over rows) against float64.
BOOST_AUTO_TEST_CASE(float32_kernels_agree_with_float64) {
  Generator gen(11);
  Tensor x64 = randn({300, 257}, DType::f64, &gen, 0.0, 4.0);
  Tensor x32 = x64.to(DType::f32);
  BOOST_TEST(rel_error(softmax(x32), softmax(x64)) < 1e-6);
  BOOST_TEST(rel_error(log_softmax(x32), log_softmax(x64)) < 1e-6);
  BOOST_TEST(rel_error(softmax(x32, 0), softmax(x64, 0)) < 1e-5);  // the column path: 300-term float sums
  Tensor targets = randint(0, 257, {300}, &gen);
  BOOST_TEST(rel_error(cross_entropy(x32, targets, -100, 0.1), cross_entropy(x64, targets, -100, 0.1)) < 1e-6);
  Tensor w = randn({257}, DType::f64, &gen), b = randn({257}, DType::f64, &gen);
  BOOST_TEST(rel_error(layer_norm(x32, w.to(DType::f32), b.to(DType::f32)), layer_norm(x64, w, b)) < 1e-5);
  Tensor q = randn({2, 3, 20, 8}, DType::f64, &gen), k = randn({2, 3, 30, 8}, DType::f64, &gen);
  Tensor v = randn({2, 3, 30, 5}, DType::f64, &gen);
  BOOST_TEST(rel_error(scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), true),
                       scaled_dot_product_attention(q, k, v, true)) < 1e-5);
}

// Row widths around the vector lengths exercise the kernels' tails (16 floats
// per vector for exp, 32 for max).
BOOST_AUTO_TEST_CASE(float32_rows_of_every_tail_length) {
  Generator gen(13);
  for (int64_t C : {1, 5, 15, 16, 17, 31, 32, 33, 47, 85}) {
    Tensor x64 = randn({7, C}, DType::f64, &gen, 0.0, 3.0), x32 = x64.to(DType::f32);
    BOOST_TEST(rel_error(softmax(x32), softmax(x64)) < 1e-6, "softmax width " << C);
    BOOST_TEST(rel_error(log_softmax(x32), log_softmax(x64)) < 1e-6, "log_softmax width " << C);
    Tensor t = randint(0, C, {7}, &gen);
    BOOST_TEST(rel_error(cross_entropy(x32, t, -100, 0.0, Reduction::none), cross_entropy(x64, t, -100, 0.0, Reduction::none)) < 1e-6,
               "cross_entropy width " << C);
    Tensor q = randn({1, 1, 3, 4}, DType::f64, &gen), k = randn({1, 1, C, 4}, DType::f64, &gen);
    Tensor v = randn({1, 1, C, 4}, DType::f64, &gen);
    BOOST_TEST(rel_error(scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32)),
                         scaled_dot_product_attention(q, k, v)) < 1e-5, "attention Tk " << C);
  }
}

// exp, tanh, sigmoid and gelu in float32 run on the vectorised polynomial
// exp: within a few float32 ulp of float64 over the whole range (gelu within
// |x| 2^-19), with exp's
// overflow to inf and underflow to 0 (denormals flushed), the saturations at +-1 and 0/1, and
// NaN passed through.
BOOST_AUTO_TEST_CASE(float32_transcendentals_agree_with_float64_everywhere) {
  std::vector<double> xs;
  for (double x = -120; x <= 120; x += 0.0625) xs.push_back(x);
  for (double x = -0.5; x <= 0.5; x += 1.0 / 1024) xs.push_back(x);  // tanh's series below 0.3
  const double big[] = {88.5, 88.72, 88.73, 89, 1e30, -87.5, -88, -104, -1e30};
  xs.insert(xs.end(), std::begin(big), std::end(big));
  Tensor x64 = from_vector(xs, {static_cast<int64_t>(xs.size())}), x32 = x64.to(DType::f32);
  struct Op {
    const char* name;
    Tensor (*f)(const Tensor&);
    double abs;        // an absolute error allowed: gelu' carries erf's (1.5e-7, halved)
    double abs_per_x;  // and one per |x|: gelu's 1 + erf(x) cancels for x < 0
  };
  for (Op op : {Op{"exp", exp, 0, 0}, Op{"tanh", tanh, 0, 0}, Op{"sigmoid", sigmoid, 0, 0},
                Op{"gelu", [](const Tensor& x) { return gelu(x); }, 0, 0x1p-19},
                Op{"gelu tanh", [](const Tensor& x) { return gelu(x, true); }, 0, 0x1p-19},
                Op{"gelu'", [](const Tensor& x) {  // the fused backward's slope, exp shared with erf
                     Tensor leaf = x.detach().requires_grad_();
                     sum(gelu(leaf)).backward();
                     return leaf.grad();
                   }, 0x1p-22, 0x1p-19}}) {
    // float64 of the rounded inputs, so only the float32 evaluation differs.
    const auto want = op.f(x32.to(DType::f64)).to_vector<double>(), got = op.f(x32).to(DType::f64).to_vector<double>();
    for (size_t i = 0; i < xs.size(); ++i) {
      const double w = static_cast<float>(want[i]), g = got[i];  // float32's correctly rounded result
      if (std::isinf(w)) {
        BOOST_TEST(g == w, op.name << "(" << xs[i] << ") = " << g << ", not " << w);
        continue;
      }
      // 4 ulp of the float32 result; one within 2^-125 of 0 may be flushed to 0.
      const double tol = std::max(w == 0 ? 0.0 : 4 * std::ldexp(1.0, std::ilogb(w) - 23), std::ldexp(1.0, -125)) +
                         op.abs + op.abs_per_x * std::abs(xs[i]);
      BOOST_TEST(std::abs(g - w) <= tol, op.name << "(" << xs[i] << ") = " << g << ", not " << w);
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (Tensor (*f)(const Tensor&) : {exp, tanh, sigmoid}) BOOST_TEST(std::isnan(f(full({1}, nan)).item()));
}

BOOST_AUTO_TEST_CASE(results_do_not_depend_on_the_thread_count) {
  Generator gen(12);
  Tensor x = randn({512, 200}, DType::f32, &gen).requires_grad_();
  Tensor w = randn({200}, DType::f32, &gen).requires_grad_();
  auto run = [&](int threads) {
    set_num_threads(threads);
    w.zero_grad();
    Tensor y = layer_norm(x, w, Tensor());
    sum(mul(y, y)).backward();
    return std::pair{y.detach(), w.grad()};
  };
  const int before = num_threads();
  auto [y1, g1] = run(1);
  auto [y2, g2] = run(2);
  set_num_threads(before);
  BOOST_TEST(rel_error(y1, y2) == 0.0);
  BOOST_TEST(rel_error(g1, g2) == 0.0);
}

// ============================ cross_entropy details ============================
BOOST_AUTO_TEST_CASE(cross_entropy_mean_counts_only_non_ignored_targets) {
  Tensor x = from_vector(std::vector<double>{0, 0, 0, 0, 5, 1}, {3, 2}).requires_grad_();
  Tensor t = ids({0, -100, 1});
  // Rows 0 and 2: log 2 and log(1 + e^4) over 2 counted rows.
  Tensor loss = cross_entropy(x, t);
  BOOST_TEST(loss.item() == (std::log(2.0) + std::log1p(std::exp(4.0))) / 2, boost::test_tools::tolerance(1e-12));
  loss.backward();
  BOOST_TEST(x.grad().at({1, 0}) == 0.0);
  BOOST_TEST(x.grad().at({1, 1}) == 0.0);
  BOOST_TEST(x.grad().at({0, 0}) == -0.25, boost::test_tools::tolerance(1e-12));
  // Every target ignored: 0/0, as torch.
  BOOST_TEST(std::isnan(cross_entropy(x.detach(), ids({-100, -100, -100})).item()));
}

// ============================ dropout ============================
BOOST_AUTO_TEST_CASE(dropout_is_the_identity_in_eval_and_at_p_zero) {
  Tensor x = samples::uniform({3, 4}, 1);
  BOOST_TEST(dropout(x, 0.5, false).impl() == x.impl());
  BOOST_TEST(dropout(x, 0.0, true).impl() == x.impl());
}

BOOST_AUTO_TEST_CASE(dropout_drops_p_and_scales_the_rest) {
  const double p = 0.3;
  Tensor x = full({200, 500}, 2.0).requires_grad_();
  Generator gen(99);
  Tensor y = dropout(x, p, true, &gen);
  auto v = y.to_vector<float>();
  int64_t zeros_seen = 0;
  for (float e : v) {
    if (e == 0.0f) {
      ++zeros_seen;
    } else {
      BOOST_REQUIRE_CLOSE(e, 2.0 / (1 - p), 1e-4);
    }
  }
  BOOST_TEST(static_cast<double>(zeros_seen) / v.size() == p, boost::test_tools::tolerance(0.02));
  // Backward: the same mask and scale.
  y.backward(ones(y.shape()));
  auto g = x.grad().to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) BOOST_REQUIRE_EQUAL(g[i], v[i] / 2.0f);
  // Same generator state, same mask; the generator advanced by numel.
  BOOST_TEST(gen.offset() == 100000u);
  Generator again(99);
  BOOST_TEST(rel_error(dropout(x.detach(), p, true, &again), y.detach()) == 0.0);
  BOOST_TEST(rel_error(dropout(x.detach(), p, true, &again), y.detach()) > 0.0);  // advanced: a new mask
}

// ============================ attention details ============================
BOOST_AUTO_TEST_CASE(fully_masked_attention_rows_are_zero_not_nan) {
  Generator gen(5);
  Tensor q = randn({2, 2, 3, 4}, DType::f64, &gen).requires_grad_();
  Tensor k = randn({2, 2, 3, 4}, DType::f64, &gen).requires_grad_();
  Tensor v = randn({2, 2, 3, 4}, DType::f64, &gen).requires_grad_();
  Tensor mask = from_vector(std::vector<int64_t>{0, 1, 0, 1, 1, 1}, {2, 3});  // batch 1 sees nothing
  Tensor w;
  Tensor out = scaled_dot_product_attention(q, k, v, false, mask, &w);
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t d = 0; d < 4; ++d) BOOST_TEST(out.at({1, h, t, d}) == 0.0);
      BOOST_TEST(w.at({0, h, t, 1}) == 0.0);  // a padded key gets exactly 0
      BOOST_TEST(w.at({0, h, t, 0}) + w.at({0, h, t, 2}) == 1.0, boost::test_tools::tolerance(1e-12));
    }
  sum(mul(out, out)).backward();
  BOOST_TEST(all_finite(q.grad()));
  BOOST_TEST(all_finite(k.grad()));
  BOOST_TEST(q.grad().at({1, 0, 0, 0}) == 0.0);
  BOOST_TEST(v.grad().at({0, 1, 1, 2}) == 0.0);  // padded key 1 of batch 0 receives nothing
}

// 520 queries over 520 keys run in blocks of query rows (with padded keys:
// 504 and 16; causal: nine, 64 rows but the last): output and gradients
// equal the one-block forward (the kept weights) and the recorded backward
// made of tensor ops.
BOOST_AUTO_TEST_CASE(attention_over_blocks_of_query_rows_equals_the_whole) {
  Generator gen(7);
  std::vector<int64_t> padded(520, 0);
  for (int64_t j = 100; j < 140; ++j) padded[j] = 1;
  const Tensor mask = from_vector(padded, {1, 520});
  for (bool causal : {true, false}) {
    Tensor q = randn({1, 2, 520, 4}, DType::f64, &gen).requires_grad_();
    Tensor k = randn({1, 2, 520, 4}, DType::f64, &gen).requires_grad_();
    Tensor v = randn({1, 2, 520, 4}, DType::f64, &gen).requires_grad_();
    const Tensor g = randn({1, 2, 520, 4}, DType::f64, &gen);
    const Tensor m = causal ? Tensor() : mask;
    Tensor w;
    const Tensor whole = scaled_dot_product_attention(q, k, v, causal, m, &w);
    const Tensor out = scaled_dot_product_attention(q, k, v, causal, m);
    BOOST_TEST(max_abs_diff(out, whole) <= 1e-12);
    BOOST_TEST(max_abs_diff(out, matmul(w, v)) <= 1e-12);
    const std::vector<Tensor> fused = grad({out}, {q, k, v}, {g}, {.retain_graph = true});
    const std::vector<Tensor> recorded = grad({out}, {q, k, v}, {g}, {.create_graph = true});
    for (size_t i = 0; i < 3; ++i) BOOST_TEST(max_abs_diff(fused[i], recorded[i]) <= 1e-12);
  }
}

BOOST_AUTO_TEST_CASE(attention_reads_transposed_views_in_place) {
  // q as produced by a (B,T,H,D) projection transposed to (B,H,T,D).
  Generator gen(6);
  Tensor base = randn({2, 5, 3, 4}, DType::f64, &gen);
  Tensor qv = base.transpose(1, 2);
  BOOST_TEST(!qv.is_contiguous());
  Tensor k = randn({2, 3, 5, 4}, DType::f64, &gen), v = randn({2, 3, 5, 4}, DType::f64, &gen);
  BOOST_TEST(rel_error(scaled_dot_product_attention(qv, k, v, true),
                       scaled_dot_product_attention(qv.contiguous(), k, v, true)) < 1e-14);
  // k broadcast over heads (stride 0).
  Tensor k1 = randn({2, 1, 5, 4}, DType::f64, &gen);
  BOOST_TEST(rel_error(scaled_dot_product_attention(qv, k1.expand({2, 3, 5, 4}), v),
                       scaled_dot_product_attention(qv, k1.expand({2, 3, 5, 4}).contiguous(), v)) < 1e-14);
}

BOOST_AUTO_TEST_CASE(attention_weights_are_returned_without_gradient) {
  Tensor q = samples::uniform({1, 1, 2, 3}, 1), k = samples::uniform({1, 1, 4, 3}, 2), v = samples::uniform({1, 1, 4, 3}, 3);
  Tensor w;
  scaled_dot_product_attention(q, k, v, true, Tensor(), &w);
  BOOST_TEST(w.shape() == Shape({1, 1, 2, 4}));
  BOOST_TEST(!w.requires_grad());
  // causal with Tq=2, Tk=4: query 0 sees keys 0..2, query 1 all four.
  BOOST_TEST(w.at({0, 0, 0, 3}) == 0.0);
  BOOST_TEST(w.at({0, 0, 0, 0}) + w.at({0, 0, 0, 1}) + w.at({0, 0, 0, 2}) == 1.0, boost::test_tools::tolerance(1e-12));
  BOOST_TEST(w.at({0, 0, 1, 3}) > 0.0);
}

// ============================ errors ============================
BOOST_AUTO_TEST_CASE(softmax_errors) {
  BOOST_CHECK_EXCEPTION(softmax(arange(4)), DTypeError, says<DTypeError>({"softmax", "int64"}));
  BOOST_CHECK_EXCEPTION(log_softmax(zeros({2, 3}), 2), IndexError, says<IndexError>({"log_softmax"}));
  BOOST_CHECK_THROW(softmax(Tensor()), ValueError);
}

BOOST_AUTO_TEST_CASE(cross_entropy_errors) {
  Tensor x = zeros({3, 4});
  Tensor t = ids({0, 1, 2});
  BOOST_CHECK_EXCEPTION(cross_entropy(x, t.to(DType::f32)), DTypeError, says<DTypeError>({"cross_entropy", "int64"}));
  BOOST_CHECK_EXCEPTION(cross_entropy(arange(4), ids({0})), DTypeError, says<DTypeError>({"logits"}));
  BOOST_CHECK_EXCEPTION(cross_entropy(x, ids({0, 1})), ShapeError,
                        says<ShapeError>({"cross_entropy", "(3,4)", "(3)", "(2)"}));
  BOOST_CHECK_EXCEPTION(cross_entropy(x, ids({0, 4, 1})), IndexError,
                        says<IndexError>({"cross_entropy", "target 4", "position 1", "4 classes"}));
  BOOST_CHECK_EXCEPTION(cross_entropy(x, ids({0, -3, 1})), IndexError, says<IndexError>({"target -3"}));
  BOOST_CHECK_EXCEPTION(cross_entropy(x, t, -100, 1.5), ValueError, says<ValueError>({"label_smoothing", "1.5"}));
  BOOST_CHECK_EXCEPTION(cross_entropy(x, t, -100, -0.1), ValueError, says<ValueError>({"label_smoothing"}));
  BOOST_CHECK_THROW(cross_entropy(scalar(1.0), scalar(0.0).to(DType::i64)), ShapeError);
  BOOST_CHECK_THROW(cross_entropy(zeros({3, 0}), t), ShapeError);
  BOOST_CHECK_THROW(cross_entropy(x, Tensor()), ValueError);
}

BOOST_AUTO_TEST_CASE(layer_norm_errors) {
  Tensor x = zeros({2, 5});
  BOOST_CHECK_EXCEPTION(layer_norm(x, ones({4}), Tensor()), ShapeError,
                        says<ShapeError>({"layer_norm", "weight", "(4)", "(2,5)"}));
  BOOST_CHECK_EXCEPTION(layer_norm(x, Tensor(), zeros({5, 1})), ShapeError, says<ShapeError>({"bias", "(5,1)"}));
  BOOST_CHECK_EXCEPTION(layer_norm(x, ones({5}, DType::f64), Tensor()), DTypeError,
                        says<DTypeError>({"layer_norm", "float64", "float32"}));
  BOOST_CHECK_THROW(layer_norm(scalar(1.0), Tensor(), Tensor()), ShapeError);
  BOOST_CHECK_THROW(layer_norm(x, Tensor(), Tensor(), 0.0), ValueError);
  BOOST_CHECK_THROW(layer_norm(arange(4), Tensor(), Tensor()), DTypeError);
}

BOOST_AUTO_TEST_CASE(dropout_errors) {
  BOOST_CHECK_EXCEPTION(dropout(zeros({3}), 1.0, true), ValueError, says<ValueError>({"dropout", "[0, 1)", "1"}));
  BOOST_CHECK_THROW(dropout(zeros({3}), -0.1, true), ValueError);
  BOOST_CHECK_THROW(dropout(zeros({3}), 1.0, false), ValueError);  // checked in eval too
  BOOST_CHECK_THROW(dropout(arange(3), 0.5, true), DTypeError);
}

BOOST_AUTO_TEST_CASE(attention_errors) {
  Tensor q = zeros({1, 2, 3, 4}), k = zeros({1, 2, 5, 4}), v = zeros({1, 2, 5, 4});
  BOOST_CHECK_EXCEPTION(scaled_dot_product_attention(zeros({2, 3, 4}), k, v), ShapeError,
                        says<ShapeError>({"scaled_dot_product_attention", "(2,3,4)", "(1,2,5,4)"}));
  BOOST_CHECK_THROW(scaled_dot_product_attention(q, zeros({1, 2, 5, 3}), v), ShapeError);  // D differs
  BOOST_CHECK_THROW(scaled_dot_product_attention(q, k, zeros({1, 2, 4, 4})), ShapeError);  // Tk differs
  BOOST_CHECK_THROW(scaled_dot_product_attention(q, zeros({1, 1, 5, 4}), v), ShapeError);  // H differs
  BOOST_CHECK_EXCEPTION(scaled_dot_product_attention(q, k, v.to(DType::f64)), DTypeError,
                        says<DTypeError>({"float64", "float32"}));
  BOOST_CHECK_EXCEPTION(scaled_dot_product_attention(q, k, v, false, zeros({1, 4})), ShapeError,
                        says<ShapeError>({"key_padding_mask", "(1,4)", "(1,5)"}));
  BOOST_CHECK_THROW(scaled_dot_product_attention(arange(4).reshape({1, 1, 1, 4}), k, v), DTypeError);
}

// A NaN goes through fused attention as through softmax(q k^T / sqrt(D)) v:
// a NaN query row, and a causal row whose only visible key is NaN, give NaN
// output rows (not zeros), in float32 and float64, in the same places.
BOOST_AUTO_TEST_CASE(attention_propagates_nan_like_its_composite) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DType dt : {DType::f64, DType::f32}) {
    Generator gen(21);
    Tensor q = randn({1, 2, 5, 4}, DType::f64, &gen), k = randn({1, 2, 5, 4}, DType::f64, &gen);
    Tensor v = randn({1, 2, 5, 3}, DType::f64, &gen);
    {
      NoGradGuard ng;
      q.select(1, 0).select(1, 2).fill_(nan);  // head 0, query 2: every score NaN
      k.select(1, 1).select(1, 0).fill_(nan);  // head 1, key 0: causal query 0 sees it alone
    }
    auto composite = [&](const Tensor& qq, const Tensor& kk, const Tensor& vv) {
      Tensor s = mul(matmul(qq, transpose(kk, -2, -1)), 0.5);
      Tensor hidden = triu(ones({5, 5}, DType::i64), 1);
      return matmul(softmax(masked_fill(s, hidden, -std::numeric_limits<double>::infinity()), -1), vv);
    };
    const Tensor fused = scaled_dot_product_attention(q.to(dt), k.to(dt), v.to(dt), true).to(DType::f64);
    const Tensor ref = composite(q, k, v);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 5; ++i)
        for (int64_t j = 0; j < 3; ++j) {
          const double a = fused.at({0, h, i, j}), b = ref.at({0, h, i, j});
          BOOST_TEST(std::isnan(a) == std::isnan(b), dtype_name(dt) << " head " << h << " row " << i << ": fused " << a
                                                                   << ", composite " << b);
          if (!std::isnan(b)) BOOST_TEST(std::abs(a - b) < 1e-5);
        }
    BOOST_TEST(std::isnan(fused.at({0, 0, 2, 0})));
    BOOST_TEST(std::isnan(fused.at({0, 1, 0, 0})));
  }
}
