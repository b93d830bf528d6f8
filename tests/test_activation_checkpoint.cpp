// Activation checkpointing: a checkpointed region gives the gradients of the
// plain one (float64, to 1e-12), also through create_graph, grad(), hooks,
// autocast and dropout, while holding less memory; and the models' options.
#define BOOST_TEST_MODULE activation_checkpoint
#include <optional>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "models/transformer.h"
#include "nn/linear.h"
#include "tests/testing.h"

using namespace tg;
using tg::testing::check_throws;
using tg::testing::max_abs_diff;

namespace {

// A residual MLP block with dropout: x (B,C) -> x + drop(W2 tanh(W1 x)).
struct Block {
  std::shared_ptr<nn::Linear> fc1, fc2;
  double p;
  Block(int64_t C, double p, DType dtype)
      : fc1(std::make_shared<nn::Linear>(nn::LinearOptions{.in = C, .out = 2 * C})),
        fc2(std::make_shared<nn::Linear>(nn::LinearOptions{.in = 2 * C, .out = C})), p(p) {
    fc1->to(dtype);
    fc2->to(dtype);
  }
  Tensor operator()(const Tensor& x) const { return add(x, dropout(fc2->forward(tanh(fc1->forward(x))), p, true)); }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> ps = fc1->parameters();
    for (const Tensor& q : fc2->parameters()) ps.push_back(q);
    return ps;
  }
};

// Four blocks, plain or each checkpointed; the loss is a weighted sum.
struct Stack {
  std::vector<Block> blocks;
  Stack(int64_t C, double p, DType dtype) {
    for (int i = 0; i < 4; ++i) blocks.emplace_back(C, p, dtype);
  }
  Tensor loss(const Tensor& x, bool checkpointed) const {
    Tensor h = x;
    for (const Block& b : blocks)
      h = checkpointed ? checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0]); }, {h}) : b(h);
    return sum(mul(h, h));
  }
  std::vector<Tensor> parameters() const {
    std::vector<Tensor> ps;
    for (const Block& b : blocks)
      for (const Tensor& q : b.parameters()) ps.push_back(q);
    return ps;
  }
};

double max_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  BOOST_REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, max_abs_diff(a[i], b[i]));
  return d;
}

// The loss and its gradients with respect to inputs, from the same random state.
std::pair<double, std::vector<Tensor>> loss_and_grads(const std::function<Tensor()>& loss,
                                                      const std::vector<Tensor>& inputs) {
  manual_seed(99);
  Tensor l = loss();
  return {l.item(), grad({l}, inputs)};
}

std::vector<Tensor> grads_of(nn::Module& m) {
  std::vector<Tensor> g;
  for (const Tensor& p : m.parameters()) g.push_back(p.grad());
  return g;
}

}  // namespace

BOOST_AUTO_TEST_CASE(grads_equal_the_plain_ones_with_dropout) {
  manual_seed(1);
  Stack s(6, 0.3, DType::f64);
  Tensor x = randn({5, 6}, DType::f64).requires_grad_(true);
  std::vector<Tensor> wrt = s.parameters();
  wrt.push_back(x);
  const auto [plain_loss, plain] = loss_and_grads([&] { return s.loss(x, false); }, wrt);
  const int64_t nodes = live_nodes();
  const auto [ckpt_loss, ckpt] = loss_and_grads([&] { return s.loss(x, true); }, wrt);
  BOOST_TEST(ckpt_loss == plain_loss);  // the same masks: the same forward, bit for bit
  BOOST_TEST(max_diff(ckpt, plain) <= 1e-12);
  BOOST_TEST(live_nodes() == nodes);  // the rebuilt graphs went with their backward
  // A different random state gives other masks: the comparison can fail.
  manual_seed(100);
  BOOST_TEST(s.loss(x, false).item() != plain_loss);
}

BOOST_AUTO_TEST_CASE(backward_fills_dot_grad_and_runs_hooks) {
  manual_seed(2);
  Stack s(5, 0.2, DType::f64);
  Tensor x = randn({3, 5}, DType::f64).requires_grad_(true);
  auto accumulate = [&](bool checkpointed) {
    std::vector<Tensor> out;
    for (Tensor p : s.parameters()) p.zero_grad();
    x.zero_grad();
    manual_seed(7);
    s.loss(x, checkpointed).backward();
    for (const Tensor& p : s.parameters()) out.push_back(p.grad());
    out.push_back(x.grad());
    return out;
  };
  const std::vector<Tensor> plain = accumulate(false);
  // A post-accumulate hook on a weight inside a checkpointed block fires once
  // per backward; a tensor hook on a checkpoint's output sees its gradient.
  int fired = 0;
  auto h = s.blocks[1].fc1->weight.register_post_accumulate_grad_hook([&](const Tensor&) { ++fired; });
  Tensor seen;
  manual_seed(7);
  Tensor h0 = checkpoint([&](const std::vector<Tensor>& in) { return s.blocks[0](in[0]); }, {x});
  h0.register_hook([&](const Tensor& g) {
    seen = g;
    return Tensor();
  });
  BOOST_TEST(fired == 0);
  const std::vector<Tensor> ckpt = accumulate(true);
  BOOST_TEST(fired == 1);
  BOOST_TEST(max_diff(ckpt, plain) <= 1e-12);
  BOOST_TEST(!seen.defined());  // h0's graph was not differentiated
  manual_seed(7);
  sum(mul(h0, h0)).backward();
  BOOST_TEST(seen.defined());
  BOOST_TEST(max_abs_diff(seen, mul(h0.detach(), full({}, 2.0, DType::f64))) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(hessian_vector_product_through_a_checkpoint) {
  manual_seed(3);
  Stack s(4, 0.25, DType::f64);
  Tensor x = randn({3, 4}, DType::f64).requires_grad_(true);
  std::vector<Tensor> wrt = s.parameters();
  wrt.push_back(x);
  std::vector<Tensor> v;
  for (const Tensor& w : wrt) v.push_back(randn(w.shape(), DType::f64));
  auto hvp = [&](bool checkpointed) {
    manual_seed(11);
    Tensor l = s.loss(x, checkpointed);
    std::vector<Tensor> g = grad({l}, wrt, {}, {.create_graph = true});
    Tensor gv = zeros({}, DType::f64);
    for (size_t i = 0; i < g.size(); ++i) gv = add(gv, sum(mul(g[i], v[i])));
    return grad({gv}, wrt);
  };
  const std::vector<Tensor> plain = hvp(false), ckpt = hvp(true);
  BOOST_TEST(max_diff(ckpt, plain) <= 1e-12);
  double norm = 0;
  for (const Tensor& t : plain) norm = std::max(norm, max_abs_diff(t, zeros_like(t)));
  BOOST_TEST(norm > 1e-3);  // a product that is not zero
}

BOOST_AUTO_TEST_CASE(gradcheck_through_a_checkpoint_with_a_captured_weight) {
  manual_seed(4);
  Tensor w = randn({4, 4}, DType::f64).requires_grad_(true);
  Tensor x = randn({2, 4}, DType::f64).requires_grad_(true);
  auto f = [&](const std::vector<Tensor>& in) {
    const Tensor wi = in[1];
    return checkpoint([wi](const std::vector<Tensor>& a) { return tanh(matmul(a[0], wi)); }, {in[0]});
  };
  BOOST_TEST(gradcheck(f, {x, w}).passed);
  BOOST_TEST(gradgradcheck(f, {x, w}).passed);
}

BOOST_AUTO_TEST_CASE(under_autocast_the_rerun_uses_the_forward_precision) {
  manual_seed(5);
  Stack s(16, 0.0, DType::f32);
  Tensor x = randn({8, 16}).requires_grad_(true);
  std::vector<Tensor> wrt = s.parameters();
  auto run = [&](bool checkpointed) {
    AutocastGuard bf16(DType::bf16);
    Tensor l = s.loss(x, checkpointed);
    return std::pair{l.item(), grad({l}, wrt)};
  };
  const auto [plain_loss, plain] = run(false);
  const auto [ckpt_loss, ckpt] = run(true);
  BOOST_TEST(ckpt_loss == plain_loss);
  BOOST_TEST(max_diff(ckpt, plain) == 0.0);
  // The rerun in float32 would differ: bfloat16 GEMMs did run.
  Tensor f32 = s.loss(x, false);
  BOOST_TEST(f32.item() != plain_loss);
}

BOOST_AUTO_TEST_CASE(holds_less_memory) {
  manual_seed(6);
  Stack s(256, 0.0, DType::f32);
  Tensor x = randn({64, 256}).requires_grad_(true);
  auto peak = [&](bool checkpointed) {
    empty_cache();
    const size_t base = memory_stats().bytes_in_use;
    reset_peak_memory_stats();
    s.loss(x, checkpointed).backward();
    return memory_stats().peak_bytes_in_use - base;
  };
  const size_t plain = peak(false), ckpt = peak(true);
  BOOST_TEST_MESSAGE("peak above the start: plain " << plain << " bytes, checkpointed " << ckpt);
  BOOST_TEST(ckpt < plain);
}

// h = checkpoint(f, x) with output_by_reference, read by a second checkpoint:
// h's memory goes with the forward, and the first backward to need it (the
// second checkpoint's) gets it from f's rerun, which f's own backward reuses:
// f runs twice in all, as without the option, with the same gradients.
BOOST_AUTO_TEST_CASE(an_output_by_reference_is_freed_and_rerun_once) {
  manual_seed(12);
  Tensor x = randn({256, 256}).requires_grad_(true), w = mul(randn({256, 256}), 1.0 / 16).requires_grad_(true);
  const size_t h_bytes = 256 * 256 * sizeof(float);
  for (bool by_reference : {false, true}) {
    int runs = 0;
    auto f = [&](const std::vector<Tensor>& in) {
      ++runs;
      return tanh(matmul(in[0], w));
    };
    empty_cache();
    const size_t base = memory_stats().bytes_in_use;
    Tensor y;
    {
      Tensor h = checkpoint(f, {x}, {.generators = {}, .output_by_reference = by_reference});
      y = checkpoint([](const std::vector<Tensor>& in) { return mul(in[0], in[0]); }, {h});
    }
    // What the graph holds besides y: h, unless it is held by reference.
    const size_t held = memory_stats().bytes_in_use - base - h_bytes;
    BOOST_TEST(held == (by_reference ? 0 : h_bytes));
    const std::vector<Tensor> g = grad({sum(y)}, {x, w});
    BOOST_TEST(runs == 2);
    // d/dx sum(tanh(x w)^2) = (2 h (1 - h^2)) w^T, and d/dw = x^T (2 h (1 - h^2))
    const Tensor h = tanh(matmul(x, w)), dh = mul(mul(h, 2.0), rsub(1.0, mul(h, h)));
    BOOST_TEST(max_abs_diff(g[0], matmul(dh, transpose(w, 0, 1))) <= 1e-4);
    BOOST_TEST(max_abs_diff(g[1], matmul(transpose(x, 0, 1), dh)) <= 1e-4);
  }
}

BOOST_AUTO_TEST_CASE(a_function_that_changes_is_an_error) {
  Tensor x = ones({3}).requires_grad_(true);
  int calls = 0;
  Tensor y = checkpoint(
      [&](const std::vector<Tensor>& in) { return ++calls == 1 ? mul(in[0], in[0]) : sum(in[0]); }, {x});
  check_throws<AutogradError>([&] { sum(y).backward(); },
                              {"'checkpoint'", "returned () float32 where the forward returned (3) float32"});
  // Under no_grad it is the function itself.
  NoGradGuard ng;
  Tensor z = checkpoint([](const std::vector<Tensor>& in) { return mul(in[0], in[0]); }, {x});
  BOOST_TEST(!z.requires_grad());
}

BOOST_AUTO_TEST_CASE(gpt_checkpoint_blocks_give_the_plain_gradients) {
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 0, 1}, Shape{2, 4});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 0, 1, 2}, Shape{2, 4});
  auto grads = [&](int64_t every) {
    manual_seed(8);
    models::GPT gpt({.vocab = 7, .block = 4, .layers = 3, .heads = 2, .dim = 8, .dropout = 0.1,
                     .checkpoint_blocks = every});
    gpt.to(DType::f64);
    manual_seed(9);
    Tensor l = gpt.loss(ids, targets);
    l.backward();
    return std::pair{l.item(), grads_of(gpt)};
  };
  const auto [plain_loss, plain] = grads(0);
  for (int64_t every : {1, 2}) {
    const auto [loss, g] = grads(every);
    BOOST_TEST(loss == plain_loss);
    BOOST_TEST(max_diff(g, plain) <= 1e-12);
  }
  check_throws<ValueError>([] { models::GPT({.vocab = 7, .checkpoint_blocks = -1}); }, {"checkpoint_blocks (-1)"});
}

// A checkpointed block reruns its MLP half over B*T/(2*hidden_mult) rows at a
// time: 2*7 = 14 rows in chunks of 3, 3, 3, 3 and 2 (hidden_mult 3), pre- and
// post-LN, with dropout drawn over the rows in the same order as forward().
BOOST_AUTO_TEST_CASE(gpt_blocks_checkpointed_over_uneven_row_chunks_give_the_plain_gradients) {
  const Tensor ids = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0}, Shape{2, 7});
  const Tensor targets = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1}, Shape{2, 7});
  for (nn::NormPosition norm : {nn::NormPosition::pre, nn::NormPosition::post}) {
    auto grads = [&](int64_t every) {
      manual_seed(15);
      models::GPT gpt({.vocab = 7, .block = 7, .layers = 2, .heads = 2, .dim = 8, .hidden_mult = 3, .norm = norm,
                       .dropout = 0.1, .checkpoint_blocks = every});
      gpt.to(DType::f64);
      manual_seed(16);
      Tensor l = gpt.loss(ids, targets);
      l.backward();
      return std::pair{l.item(), grads_of(gpt)};
    };
    const auto [plain_loss, plain] = grads(0);
    const auto [loss, g] = grads(1);
    BOOST_TEST(loss == plain_loss);
    BOOST_TEST(max_diff(g, plain) <= 1e-12);
  }
  auto layer = std::make_shared<nn::TransformerEncoderLayer>(nn::TransformerLayerOptions{.dim = 8, .heads = 2});
  check_throws<ShapeError>([&] { nn::checkpointed_forward(layer, zeros({2, 3, 5})); },
                           {"TransformerEncoderLayer", "(2,3,5)", "(B,T,8)"});
}

BOOST_AUTO_TEST_CASE(encoder_decoder_checkpoint_layers_give_the_plain_gradients) {
  const Tensor src = from_vector(std::vector<int64_t>{1, 2, 3, 4, 5, 6}, Shape{2, 3});
  const Tensor tgt = from_vector(std::vector<int64_t>{2, 3, 4, 5, 6, 1, 0, 2}, Shape{2, 4});
  auto grads = [&](int64_t every) {
    manual_seed(10);
    models::EncoderDecoderTransformer m(
        {.vocab = 7, .max_len = 8, .layers = 2, .heads = 2, .dim = 8, .dropout = 0.1, .checkpoint_layers = every});
    m.to(DType::f64);
    manual_seed(12);
    sum(m.forward(src, tgt, Tensor())).backward();
    return grads_of(m);
  };
  BOOST_TEST(max_diff(grads(1), grads(0)) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(lstm_checkpointed_over_time_gives_the_plain_gradients) {
  // T = 10: chunks of ceil(sqrt(10)) = 4, 4 and 2 steps.
  std::vector<int64_t> v(30);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * 7 % 11);
  const Tensor ids = from_vector(v, Shape{3, 10});
  auto grads = [&](bool checkpointed, models::CellKind cell) {
    manual_seed(13);
    models::RNNLM lm({.vocab = 11, .embed = 5, .hidden = 6, .layers = 2, .cell = cell,
                      .checkpoint_time = checkpointed});
    lm.to(DType::f64);
    manual_seed(14);
    Tensor l = lm.loss(ids, ids);
    l.backward();
    return std::pair{l.item(), grads_of(lm)};
  };
  for (models::CellKind cell : {models::CellKind::lstm, models::CellKind::gru}) {
    const auto [plain_loss, plain] = grads(false, cell);
    const auto [loss, g] = grads(true, cell);
    BOOST_TEST(std::abs(loss - plain_loss) <= 1e-12);
    BOOST_TEST(max_diff(g, plain) <= 1e-12);
  }
}

// The LSTM LM's checkpoint_time keeps h_t and not the gates and cell states
// of every step (6H values a step): its step's peak above the start is less
// than half the plain one's at T = 256.
BOOST_AUTO_TEST_CASE(lstm_checkpointed_over_time_holds_less_memory) {
  std::vector<int64_t> v(4 * 256);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>(i * 7 % 11);
  const Tensor ids = from_vector(v, Shape{4, 256});
  auto peak = [&](bool checkpointed) {
    manual_seed(15);
    models::RNNLM lm({.vocab = 11, .embed = 8, .hidden = 64, .cell = models::CellKind::lstm,
                      .checkpoint_time = checkpointed});
    empty_cache();
    const size_t base = memory_stats().bytes_in_use;
    reset_peak_memory_stats();
    lm.loss(ids, ids).backward();
    return memory_stats().peak_bytes_in_use - base;
  };
  const size_t plain = peak(false), ckpt = peak(true);
  BOOST_TEST_MESSAGE("LSTM LM, peak above the start: plain " << plain << " bytes, checkpoint_time " << ckpt);
  BOOST_TEST(2 * ckpt < plain);
  // The option may change between steps (the study's cost part toggles it on a built model).
  manual_seed(15);
  models::RNNLM lm({.vocab = 11, .embed = 8, .hidden = 64, .cell = models::CellKind::lstm});
  lm.options.checkpoint_time = true;
  empty_cache();
  const size_t base = memory_stats().bytes_in_use;
  reset_peak_memory_stats();
  lm.loss(ids, ids).backward();
  BOOST_TEST(memory_stats().peak_bytes_in_use - base == ckpt);
}

// Two threads train checkpointed stacks with dropout at once (each draws from
// its own default generator), one of them under anomaly detection: each gets
// the gradients it gets alone.
BOOST_AUTO_TEST_CASE(two_threads_checkpoint_at_once) {
  auto run = [](uint64_t seed, bool anomaly) {
    manual_seed(seed);
    Stack s(8, 0.3, DType::f64);
    Tensor x = randn({4, 8}, DType::f64).requires_grad_(true);
    std::optional<DetectAnomalyGuard> on;
    if (anomaly) on.emplace();
    std::vector<Tensor> all;
    for (int step = 0; step < 3; ++step) {
      Tensor l = s.loss(x, true);
      for (const Tensor& g : grad({l}, s.parameters())) all.push_back(g);
    }
    return all;
  };
  const std::vector<Tensor> alone_a = run(21, false), alone_b = run(22, false);
  std::vector<Tensor> a, b;
  std::thread ta([&] { a = run(21, true); }), tb([&] { b = run(22, false); });
  ta.join();
  tb.join();
  BOOST_TEST(max_diff(a, alone_a) == 0.0);
  BOOST_TEST(max_diff(b, alone_b) == 0.0);
}
