// Anomaly detection: NaN and inf injected at a chosen op, in forward and in
// backward, of a GPT and an LSTM; the report must name that op, its shapes,
// which inputs were already non-finite, and the module path.
#define BOOST_TEST_MODULE anomaly
#include <cmath>
#include <limits>

#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "tests/testing.h"

using namespace tg;
using tg::testing::check_throws;

namespace {

// nan_grad(x) = x, whose backward returns NaN: a backward that goes wrong
// where the test puts it.
void nan_grad_backward(const Node&, const Tensor& g, std::span<Tensor> grad_in) {
  grad_in[0] = full(g.shape(), std::numeric_limits<double>::quiet_NaN(), g.dtype());
}
const OpDef nan_grad_op({.name = "nan_grad", .arity = 1, .signature = "nan_grad(x) -> x, its gradient NaN",
                         .saves = saves_of<NoSaved>(), .backward = nan_grad_backward});
Tensor nan_grad(const Tensor& x) {
  Tensor out = x.clone();
  record(nan_grad_op, out, x);
  return out;
}

models::GPT tiny_gpt() {
  manual_seed(5);
  return models::GPT({.vocab = 11, .block = 6, .layers = 2, .heads = 2, .dim = 8});
}
models::RNNLM tiny_lstm() {
  manual_seed(6);
  return models::RNNLM({.vocab = 11, .embed = 6, .hidden = 8, .layers = 2, .cell = models::CellKind::lstm});
}
const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1}, Shape{2, 6});
const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 7, 8, 9, 10, 0, 1, 2}, Shape{2, 6});

// The parameter of that name.
Tensor param(nn::Module& m, const std::string& name) {
  for (auto& [n, p] : m.named_parameters())
    if (n == name) return p;
  BOOST_FAIL("no parameter " << name);
  return {};
}

void poison(const Tensor& p, double value) {
  NoGradGuard ng;
  p.data<float>()[0] = static_cast<float>(value);
}

}  // namespace

BOOST_AUTO_TEST_CASE(off_by_default_and_guard_scoped) {
  BOOST_TEST(!anomaly_enabled());
  {
    DetectAnomalyGuard on;
    BOOST_TEST(anomaly_enabled());
  }
  BOOST_TEST(!anomaly_enabled());
  // Off, a NaN goes through unreported.
  Tensor y = log(full({2, 2}, -1.0));
  BOOST_TEST(std::isnan(y.at({0, 0})));
}

BOOST_AUTO_TEST_CASE(forward_names_the_first_op_and_its_inputs) {
  DetectAnomalyGuard on;
  Tensor x = full({2, 3}, -1.0).requires_grad_(true);
  Tensor ok = exp(x);
  // log of a negative: NaN from finite inputs.
  check_throws<AnomalyError>([&] { (void)log(mul(x, ok)); },
                             {"anomaly detected in forward: 'log' at the top level returned (2,3) float32 holding 6 "
                              "NaN value(s)",
                              "input 0: (2,3) float32, finite"});
  // The op after it sees an input that already was: it is not the first, but
  // called on its own it says so.
  Tensor bad = full({2, 3}, std::numeric_limits<double>::infinity());
  check_throws<AnomalyError>([&] { (void)add(x, bad); },
                             {"'add'", "6 infinite", "input 0: (2,3) float32, finite",
                              "input 1: (2,3) float32, already non-finite (6 infinite)"});
}

BOOST_AUTO_TEST_CASE(gpt_forward_nan_in_a_weight_is_named_where_it_is_read) {
  models::GPT gpt = tiny_gpt();
  poison(param(gpt, "blocks.1.attn.qkv.weight"), std::numeric_limits<double>::quiet_NaN());
  DetectAnomalyGuard on;
  check_throws<AnomalyError>([&] { (void)gpt.loss(ids, targets); },
                             {"anomaly detected in forward: 'linear' in blocks.1.attn.qkv returned (2,6,24) float32",
                              "input 0: (2,6,8) float32, finite",
                              "input 1: (24,8) float32, already non-finite (1 NaN)"});
}

BOOST_AUTO_TEST_CASE(gpt_forward_inf_from_finite_inputs_at_a_hooked_op) {
  models::GPT gpt = tiny_gpt();
  // A forward hook on blocks.1.mlp.fc divides its output by zero.
  auto h = (*gpt.blocks)[1].mlp->fc->register_forward_hook(
      [](nn::Module&, std::span<const Tensor>, const Tensor& out) { return div(out, zeros_like(out)); });
  DetectAnomalyGuard on;
  check_throws<AnomalyError>([&] { (void)gpt.loss(ids, targets); },
                             {"anomaly detected in forward: 'div' in blocks.1.mlp.fc returned (2,6,32) float32",
                              "input 0: (2,6,32) float32, finite", "input 1: (2,6,32) float32, finite"});
}

BOOST_AUTO_TEST_CASE(gpt_backward_names_the_node_whose_gradient_turns_nan) {
  models::GPT gpt = tiny_gpt();
  auto h = (*gpt.blocks)[0].mlp->fc->register_forward_hook(
      [](nn::Module&, std::span<const Tensor>, const Tensor& out) { return nan_grad(out); });
  DetectAnomalyGuard on;
  Tensor loss = gpt.loss(ids, targets);  // finite: the forward passes
  BOOST_TEST(std::isfinite(loss.item()));
  check_throws<AnomalyError>([&] { loss.backward(); },
                             {"anomaly detected in backward: the backward of 'nan_grad' (recorded in blocks.0.mlp.fc, "
                              "output (2,6,32) float32) returned a gradient for input 0 of shape (2,6,32) holding "
                              "384 NaN value(s); the gradient it received was finite"});
}

BOOST_AUTO_TEST_CASE(inside_a_checkpointed_block_the_rerun_keeps_the_path) {
  manual_seed(5);
  models::GPT gpt({.vocab = 11, .block = 6, .layers = 2, .heads = 2, .dim = 8, .checkpoint_blocks = 1});
  auto h = (*gpt.blocks)[1].mlp->fc->register_forward_hook(
      [](nn::Module&, std::span<const Tensor>, const Tensor& out) { return nan_grad(out); });
  DetectAnomalyGuard on;
  Tensor loss = gpt.loss(ids, targets);
  check_throws<AnomalyError>([&] { loss.backward(); },
                             // the checkpointed MLP runs over B*T/8 = 2 rows at a time (hidden_mult 4)
                             {"the backward of 'nan_grad' (recorded in blocks.1.mlp.fc, output (2,32) float32)"});
}

BOOST_AUTO_TEST_CASE(lstm_forward_and_backward) {
  {
    models::RNNLM lm = tiny_lstm();
    poison(param(lm, "rnn.layers.1.weight_hh"), std::numeric_limits<double>::quiet_NaN());
    DetectAnomalyGuard on;
    try {
      (void)lm.loss(ids, targets);
      BOOST_ERROR("no AnomalyError");
    } catch (const AnomalyError& e) {
      const std::string msg = e.what();
      BOOST_TEST_MESSAGE(msg);
      BOOST_TEST(msg.find("in rnn returned") != std::string::npos, msg);
      BOOST_TEST(msg.find("input 1: (32,8) float32, already non-finite (1 NaN)") != std::string::npos, msg);
    }
  }
  models::RNNLM lm = tiny_lstm();
  auto h = lm.head->register_forward_hook(
      [](nn::Module&, std::span<const Tensor>, const Tensor& out) { return nan_grad(out); });
  DetectAnomalyGuard on;
  Tensor loss = lm.loss(ids, targets);
  check_throws<AnomalyError>([&] { (void)grad({loss}, lm.parameters()); },
                             {"anomaly detected in grad: the backward of 'nan_grad' (recorded in head, output (2,6,11) "
                              "float32)"});
}

BOOST_AUTO_TEST_CASE(a_hook_that_returns_nan_is_named) {
  DetectAnomalyGuard on;
  Tensor x = full({3}, 2.0).requires_grad_(true);
  Tensor y = mul(x, x);
  y.register_hook([](const Tensor& g) { return div(g, zeros_like(g)); });
  // The hook's own division is an op: forward detection names it.
  check_throws<AnomalyError>([&] { sum(y).backward(); }, {"'div'", "returned (3) float32"});
}

// sqrt at 0: its backward writes g / (2 sqrt x) = inf into the buffer of the
// gradient it received (ones, which sum's backward made and nothing else
// holds). The report must say what that gradient was before the backward ran,
// not what the backward left in it.
BOOST_AUTO_TEST_CASE(backward_report_counts_the_gradient_as_received) {
  DetectAnomalyGuard on;
  Tensor x = zeros({2, 4}, DType::f64).requires_grad_(true);
  Tensor loss = sum(sqrt(x));
  check_throws<AnomalyError>([&] { loss.backward(); },
                             {"the backward of 'sqrt'", "8 infinite", "the gradient it received was finite"});
}

// With anomaly detection off, a NaN in a GPT's attention weights makes the
// loss NaN: fused attention must not turn NaN score rows into zeros.
BOOST_AUTO_TEST_CASE(gpt_nan_weight_without_detection_gives_a_nan_loss) {
  models::GPT gpt = tiny_gpt();
  poison(param(gpt, "blocks.1.attn.qkv.weight"), std::numeric_limits<double>::quiet_NaN());
  BOOST_TEST(std::isnan(gpt.loss(ids, targets).item()));
}

// concat and stack fill their output through views of it: anomaly detection
// checks the values ops compute, not a buffer not yet written (here one the
// caching allocator last handed out full of NaN).
BOOST_AUTO_TEST_CASE(joins_into_a_recycled_buffer_are_not_anomalies) {
  for (int k = 0; k < 4; ++k) {
    { Tensor junk = full({2, 2, 32}, std::numeric_limits<double>::quiet_NaN()); }
    DetectAnomalyGuard on;
    const Tensor a = ones({2, 32}).requires_grad_(true), b = ones({2, 32});
    BOOST_TEST(sum(stack({a, b}, 0)).item() == 128.0);
    { Tensor junk = full({2, 2, 32}, std::numeric_limits<double>::quiet_NaN()); }
    BOOST_TEST(sum(concat({a, b}, 0)).item() == 128.0);
  }
}

// An infinity a caller asks for (masked_fill(x, mask, -inf), how attention
// hides keys) is no anomaly; a NaN asked for, or an infinity an op makes, is.
BOOST_AUTO_TEST_CASE(an_infinite_fill_is_asked_for_a_nan_is_not) {
  DetectAnomalyGuard on;
  const Tensor x = ones({2, 3}).requires_grad_(true);
  const Tensor mask = from_vector(std::vector<int64_t>{0, 1, 0, 0, 0, 1}, {2, 3});
  const Tensor hidden = masked_fill(x, mask, -std::numeric_limits<double>::infinity());
  BOOST_TEST(std::isfinite(sum(softmax(hidden, -1)).item()));
  check_throws<AnomalyError>([&] { (void)masked_fill(x, mask, std::numeric_limits<double>::quiet_NaN()); },
                             {"'masked_fill'", "2 NaN"});
  check_throws<AnomalyError>([&] { (void)mul(hidden, -1.0); }, {"'mul_scalar'", "2 infinite", "already non-finite"});
}
