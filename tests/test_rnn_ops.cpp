// The fused recurrence ops (autograd/ops/rnn_ops) and the recurrent cells and
// modules built on them (nn/rnn): PyTorch parity (tests/fixtures/nn_rnn.json,
// made by make_nn_rnn.py), float64 gradchecks through time w.r.t. input,
// initial state and every named parameter, the fused recurrence ops' own
// samples, their tangent rules (fused against recorded where the recurrences
// split over threads; the recorded ones differentiated in reverse), dropout
// between layers, and error messages.
#define BOOST_TEST_MODULE rnn_ops
#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/rnn_ops.h"
#include "autograd/ops/samples.h"
#include "nn/gradcheck_module.h"
#include "nn/rnn.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;

namespace {

const std::string kFixture = "tests/fixtures/nn_rnn.json";

Tensor weighted_sum(const std::vector<Tensor>& outs, const json& probes, DType dtype) {
  Tensor loss;
  for (size_t k = 0; k < outs.size(); ++k) {
    Tensor term = sum(mul(outs[k], load(probes[k], dtype)));
    loss = loss.defined() ? add(loss, term) : term;
  }
  return loss;
}

std::shared_ptr<nn::Module> make_module(const std::string& kind, const nn::RNNOptions& o) {
  if (kind == "lstm") return std::make_shared<nn::LSTM>(o);
  if (kind == "gru") return std::make_shared<nn::GRU>(o);
  return std::make_shared<nn::RNN>(o);
}

// Runs any of the three modules; states may be undefined.
std::vector<Tensor> run_module(nn::Module& m, const Tensor& x, const Tensor& h0, const Tensor& c0) {
  if (auto* lstm = dynamic_cast<nn::LSTM*>(&m)) {
    nn::RNNOutput o = lstm->forward(x, h0, c0);
    return {o.output, o.h, o.c};
  }
  nn::RNNOutput o = dynamic_cast<nn::GRU*>(&m) ? dynamic_cast<nn::GRU*>(&m)->forward(x, h0)
                                               : dynamic_cast<nn::RNN*>(&m)->forward(x, h0);
  return {o.output, o.h};
}

// Forward + backward of one fixture module case; returns the worst relative error.
double module_parity(const json& c, DType dtype, double tol) {
  const std::string kind = c["kind"];
  const std::string name = fmt::format("{} layers={} batch_first={} {}", kind, c["layers"].get<int>(),
                                       c["batch_first"].get<bool>(), dtype_name(dtype));
  auto m = make_module(
      kind, {.input = c["input"], .hidden = c["hidden"], .layers = c["layers"], .batch_first = c["batch_first"]});
  load_params(*m, c["params"], dtype);
  Tensor x = load(c["x"], dtype).requires_grad_();
  const size_t state_count = kind == "lstm" ? 2 : 1;  // (h0, c0) or h0
  std::vector<Tensor> state;
  if (c.contains("state")) {
    BOOST_TEST_REQUIRE(c["state"].size() == state_count, name);
    BOOST_TEST_REQUIRE(c["grad_state"].size() == state_count, name);
    for (auto& s : c["state"]) state.push_back(load(s, dtype).requires_grad_());
  }
  state.resize(2);
  std::vector<Tensor> outs = run_module(*m, x, state[0], state[1]);
  BOOST_REQUIRE_EQUAL(outs.size(), c["outputs"].size());
  weighted_sum(outs, c["probes"], dtype).backward();

  Parity p{tol};
  for (size_t k = 0; k < outs.size(); ++k)
    p.check(name + " output " + std::to_string(k), outs[k], load(c["outputs"][k]));
  p.check(name + " grad x", x.grad(), load(c["grad_x"]));
  if (c.contains("grad_state"))
    for (size_t k = 0; k < c["grad_state"].size(); ++k)
      p.check(name + " grad state " + std::to_string(k), state[k].grad(), load(c["grad_state"][k]));
  for (auto& [pname, param] : m->named_parameters())
    p.check(name + " grad " + pname, param.grad(), load(c["grad_params"][pname]));
  BOOST_TEST_MESSAGE(name << ": worst relative error vs torch " << p.worst);
  return p.worst;
}

// Concatenation of everything a module returns, for a full-Jacobian gradcheck.
Tensor flat(const std::vector<Tensor>& outs) {
  std::vector<Tensor> parts;
  for (const Tensor& o : outs)
    if (o.defined()) parts.push_back(o.reshape({-1}));
  return concat(parts, 0);
}

}  // namespace

BOOST_AUTO_TEST_CASE(modules_match_torch_float64) {
  double worst = 0;
  BOOST_TEST_REQUIRE(fixture(kFixture)["modules"].size() == 6u);
  for (const json& c : fixture(kFixture)["modules"]) worst = std::max(worst, module_parity(c, DType::f64, 1e-10));
  BOOST_TEST_MESSAGE("RNN/LSTM/GRU modules, float64: worst relative error vs torch " << worst);
}

BOOST_AUTO_TEST_CASE(lstm_matches_torch_float32) {
  BOOST_TEST_REQUIRE(fixture(kFixture)["float32"].size() == 1u);
  for (const json& c : fixture(kFixture)["float32"]) module_parity(c, DType::f32, 1e-5);
}

BOOST_AUTO_TEST_CASE(cells_match_torch_float64) {
  BOOST_TEST_REQUIRE(fixture(kFixture)["cells"].size() == 3u);
  for (const json& c : fixture(kFixture)["cells"]) {
    const std::string kind = c["kind"];
    nn::RNNCellOptions o{.input = c["input"], .hidden = c["hidden"]};
    Tensor x = load(c["x"]).requires_grad_();
    const size_t state_count = kind == "lstm" ? 2 : 1;  // (h, c) or h
    BOOST_TEST_REQUIRE(c["state"].size() == state_count, kind);
    BOOST_TEST_REQUIRE(c["grad_state"].size() == state_count, kind);
    std::vector<Tensor> state;
    for (auto& s : c["state"]) state.push_back(load(s).requires_grad_());
    std::shared_ptr<nn::Module> m;
    std::vector<Tensor> outs;
    if (kind == "lstm") {
      auto cell = std::make_shared<nn::LSTMCell>(o);
      load_params(*cell, c["params"], DType::f64);
      nn::LSTMState s = cell->forward(x, {state[0], state[1]});
      outs = {s.h, s.c};
      m = cell;
    } else if (kind == "gru") {
      auto cell = std::make_shared<nn::GRUCell>(o);
      load_params(*cell, c["params"], DType::f64);
      outs = {cell->forward(x, state[0])};
      m = cell;
    } else {
      auto cell = std::make_shared<nn::RNNCell>(o);
      load_params(*cell, c["params"], DType::f64);
      outs = {cell->forward(x, state[0])};
      m = cell;
    }
    weighted_sum(outs, c["probes"], DType::f64).backward();
    Parity p{1e-10};
    for (size_t k = 0; k < outs.size(); ++k) p.check(kind + "cell output", outs[k], load(c["outputs"][k]));
    p.check(kind + "cell grad x", x.grad(), load(c["grad_x"]));
    for (size_t k = 0; k < state.size(); ++k)
      p.check(kind + "cell grad state", state[k].grad(), load(c["grad_state"][k]));
    for (auto& [pname, param] : m->named_parameters())
      p.check(kind + "cell grad " + pname, param.grad(), load(c["grad_params"][pname]));
    BOOST_TEST_MESSAGE(kind << " cell, float64: worst relative error vs torch " << p.worst);
  }
}

BOOST_AUTO_TEST_CASE(cells_gradcheck_float64) {
  manual_seed(3);
  const int64_t B = 2, I = 3, H = 4;
  for (bool with_state : {true, false}) {
    Tensor x = samples::uniform({B, I}, 1), h = samples::uniform({B, H}, 2), c = samples::uniform({B, H}, 3);
    std::vector<Tensor> in = {x};
    if (with_state) in.push_back(h), in.push_back(c);
    auto state = [&](const std::vector<Tensor>& v, size_t k) { return with_state ? v[k] : Tensor(); };
    nn::LSTMCell lstm({.input = I, .hidden = H});
    auto r = nn::gradcheck_module(
        lstm,
        [&](auto& v) {
          nn::LSTMState s = lstm.forward(v[0], {state(v, 1), state(v, 2)});
          return flat({s.h, s.c});
        },
        in);
    BOOST_TEST(r.passed, "LSTMCell with_state=" << with_state << "\n" << r.str());
    if (with_state) in.pop_back();
    nn::GRUCell gru({.input = I, .hidden = H});
    r = nn::gradcheck_module(
        gru, [&](auto& v) { return gru.forward(v[0], state(v, 1)); }, in);
    BOOST_TEST(r.passed, "GRUCell with_state=" << with_state << "\n" << r.str());
    nn::RNNCell rnn({.input = I, .hidden = H, .bias = with_state});
    r = nn::gradcheck_module(
        rnn, [&](auto& v) { return rnn.forward(v[0], state(v, 1)); }, in);
    BOOST_TEST(r.passed, "RNNCell with_state=" << with_state << "\n" << r.str());
  }
}

// Two layers with dropout 0.3 between them (eval: the identity), through
// T = 3..5 steps, both layouts, w.r.t. x, h0, c0 and every parameter.
BOOST_AUTO_TEST_CASE(modules_gradcheck_through_time_float64) {
  manual_seed(4);
  const int64_t B = 2, I = 3, H = 3, L = 2;
  int64_t T = 3;
  for (const char* kind : {"rnn", "lstm", "gru"}) {
    for (bool batch_first : {true, false}) {
      auto m = make_module(kind, {.input = I, .hidden = H, .layers = L, .batch_first = batch_first, .dropout = 0.3});
      m->eval();
      Tensor x = samples::uniform(batch_first ? Shape{B, T, I} : Shape{T, B, I}, 10 + T);
      Tensor h0 = samples::uniform({L, B, H}, 20 + T), c0 = samples::uniform({L, B, H}, 30 + T);
      bool lstm = std::string(kind) == "lstm";
      std::vector<Tensor> in = {x, h0};
      if (lstm) in.push_back(c0);
      auto r = nn::gradcheck_module(
          *m, [&](auto& v) { return flat(run_module(*m, v[0], v[1], lstm ? v[2] : Tensor())); }, in);
      BOOST_TEST(r.passed, kind << " batch_first=" << batch_first << " T=" << T << "\n" << r.str());
      T = T == 5 ? 3 : T + 1;
    }
  }
}

BOOST_AUTO_TEST_CASE(modules_without_bias_gradcheck_float64) {
  manual_seed(8);
  for (const char* kind : {"rnn", "lstm", "gru"}) {
    auto m = make_module(kind, {.input = 2, .hidden = 3, .layers = 2, .bias = false});
    BOOST_TEST(m->named_parameters().size() == 4u);
    Tensor x = samples::uniform({2, 3, 2}, 40);
    auto r = nn::gradcheck_module(*m, [&](auto& v) { return flat(run_module(*m, v[0], Tensor(), Tensor())); }, {x});
    BOOST_TEST(r.passed, kind << " without bias\n" << r.str());
  }
}

BOOST_AUTO_TEST_CASE(module_equals_its_cell_stepped_over_time) {
  manual_seed(5);
  const int64_t B = 3, T = 6, I = 4, H = 5;
  nn::LSTM lstm({.input = I, .hidden = H, .batch_first = false});
  nn::GRU gru({.input = I, .hidden = H, .batch_first = false});
  lstm.to(DType::f64);
  gru.to(DType::f64);
  Tensor x = randn({T, B, I}, DType::f64);
  nn::RNNOutput lo = lstm.forward(x), go = gru.forward(x);
  nn::LSTMState s;
  Tensor h;
  for (int64_t t = 0; t < T; ++t) {
    s = (*lstm.layers)[0].forward(x.select(0, t), s);
    h = (*gru.layers)[0].forward(x.select(0, t), h);
    BOOST_TEST(rel_error(lo.output.select(0, t), s.h) < 1e-14);
    BOOST_TEST(rel_error(go.output.select(0, t), h) < 1e-14);
  }
  BOOST_TEST(rel_error(lo.c.select(0, 0), s.c) < 1e-14);
  BOOST_TEST(rel_error(go.h.select(0, 0), h) < 1e-14);
}

BOOST_AUTO_TEST_CASE(dropout_only_between_layers_in_training) {
  manual_seed(6);
  nn::LSTM m({.input = 3, .hidden = 8, .layers = 2, .dropout = 0.5});
  Tensor x = randn({2, 5, 3});
  m.eval();
  nn::RNNOutput eval_out = m.forward(x);
  m.train();
  nn::RNNOutput train_out = m.forward(x);
  // Layer 0 sees no dropout; layer 1's input is dropped, so its outputs change.
  BOOST_TEST(rel_error(train_out.h.select(0, 0), eval_out.h.select(0, 0)) == 0.0);
  BOOST_TEST(rel_error(train_out.c.select(0, 0), eval_out.c.select(0, 0)) == 0.0);
  BOOST_TEST(rel_error(train_out.output, eval_out.output) > 1e-3);
  // Eval equals the same weights without dropout.
  nn::LSTM plain({.input = 3, .hidden = 8, .layers = 2});
  {
    NoGradGuard ng;
    auto a = plain.named_parameters(), b = m.named_parameters();
    for (size_t k = 0; k < a.size(); ++k) a[k].second.copy_(b[k].second);
  }
  BOOST_TEST(rel_error(plain.forward(x).output, eval_out.output) == 0.0);
}

// An LSTM with recompute_gates (each layer one lstm_recompute node) gives the
// plain LSTM's outputs, final states and gradients, in float64 to 1e-12:
// through h0, c0, h_n and c_n, two layers with dropout between them, batch
// first and time-major, T = 10 (backward chunks of 4, 4 and 2 steps) and
// T = 1.
BOOST_AUTO_TEST_CASE(lstm_recomputing_its_gates_gives_the_plain_gradients) {
  for (const bool batch_first : {true, false})
    for (const int64_t T : {int64_t{10}, int64_t{1}}) {
      const int64_t B = 3, I = 4, H = 5, L = 2;
      auto run = [&](bool recompute) {
        manual_seed(31);
        nn::LSTM m({.input = I, .hidden = H, .layers = L, .batch_first = batch_first, .dropout = 0.3,
                    .recompute_gates = recompute});
        m.to(DType::f64);
        manual_seed(32);
        const Tensor x = randn(batch_first ? Shape{B, T, I} : Shape{T, B, I}, DType::f64).requires_grad_(true);
        const Tensor h0 = randn({L, B, H}, DType::f64).requires_grad_(true);
        const Tensor c0 = randn({L, B, H}, DType::f64).requires_grad_(true);
        const Tensor px = randn(batch_first ? Shape{B, T, H} : Shape{T, B, H}, DType::f64);
        const Tensor ph = randn({L, B, H}, DType::f64), pc = randn({L, B, H}, DType::f64);
        nn::RNNOutput o = m.forward(x, h0, c0);
        const Tensor loss = add(add(sum(mul(o.output, px)), sum(mul(o.h, ph))), sum(mul(o.c, pc)));
        std::vector<Tensor> wrt{x, h0, c0};
        for (const Tensor& p : m.parameters()) wrt.push_back(p);
        std::vector<Tensor> got{o.output, o.h, o.c};
        for (const Tensor& g : grad({loss}, wrt)) got.push_back(g);
        return got;
      };
      const std::vector<Tensor> plain = run(false), lean = run(true);
      BOOST_REQUIRE_EQUAL(plain.size(), lean.size());
      for (size_t k = 0; k < plain.size(); ++k)
        BOOST_TEST(max_abs_diff(lean[k], plain[k]) <= 1e-12, "batch_first " << batch_first << " T " << T << " #" << k);
    }
}

BOOST_AUTO_TEST_CASE(parameter_names_shapes_and_init) {
  manual_seed(7);
  nn::GRU m({.input = 3, .hidden = 16, .layers = 2});
  auto named = m.named_parameters();
  std::vector<std::string> want = {"layers.0.weight_ih", "layers.0.weight_hh", "layers.0.bias_ih", "layers.0.bias_hh",
                                   "layers.1.weight_ih", "layers.1.weight_hh", "layers.1.bias_ih", "layers.1.bias_hh"};
  BOOST_REQUIRE_EQUAL(named.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) BOOST_TEST(named[k].first == want[k]);
  BOOST_TEST((named[0].second.shape() == Shape{48, 3}));
  BOOST_TEST((named[4].second.shape() == Shape{48, 16}));
  BOOST_TEST((named[1].second.dtype() == DType::f32));
  // U(-1/sqrt(H), 1/sqrt(H)) = U(-0.25, 0.25): bounded, and spread over the range.
  auto w = named[1].second.to_vector<float>();
  auto [lo, hi] = std::minmax_element(w.begin(), w.end());
  BOOST_TEST(*lo >= -0.25f);
  BOOST_TEST(*hi <= 0.25f);
  BOOST_TEST(*hi - *lo > 0.45f);
  nn::LSTMCell nobias({.input = 2, .hidden = 2, .bias = false});
  BOOST_TEST(nobias.named_parameters().size() == 2u);
}

BOOST_AUTO_TEST_CASE(errors_name_the_layer_and_shapes) {
  nn::LSTM lstm({.input = 3, .hidden = 4, .layers = 2});
  BOOST_CHECK_EXCEPTION(lstm.forward(zeros({2, 5, 6})), ShapeError, says<ShapeError>({"LSTM", "(2,5,6)", "I = 3"}));
  BOOST_CHECK_EXCEPTION(lstm.forward(zeros({5, 3})), ShapeError, says<ShapeError>({"LSTM", "(5,3)", "(B,T,I)"}));
  BOOST_CHECK_EXCEPTION(lstm.forward(zeros({2, 5, 3}), zeros({1, 2, 4})), ShapeError,
                        says<ShapeError>({"LSTM", "h0", "(1,2,4)", "(2,2,4)"}));
  BOOST_CHECK_EXCEPTION(lstm.forward(zeros({2, 5, 3}), zeros({2, 2, 4}), zeros({2, 3, 4})), ShapeError,
                        says<ShapeError>({"LSTM", "c0", "(2,3,4)", "(2,2,4)"}));
  BOOST_CHECK_EXCEPTION(lstm.forward(zeros({2, 0, 3})), ShapeError, says<ShapeError>({"LSTM", "no time step"}));
  nn::GRU gru({.input = 3, .hidden = 4, .batch_first = false});
  BOOST_CHECK_EXCEPTION(gru.forward(zeros({5, 2, 3}), zeros({1, 5, 4})), ShapeError,
                        says<ShapeError>({"GRU", "(1,5,4)", "(1,2,4)"}));
  BOOST_CHECK_EXCEPTION(gru.forward(zeros({5, 2, 7})), ShapeError, says<ShapeError>({"GRU", "(T,B,I)", "(5,2,7)"}));
  nn::RNN rnn({.input = 3, .hidden = 4});
  BOOST_CHECK_EXCEPTION(rnn.forward(zeros({2, 5, 2})), ShapeError, says<ShapeError>({"RNN", "(2,5,2)"}));
  nn::LSTMCell cell({.input = 3, .hidden = 4});
  BOOST_CHECK_EXCEPTION(cell.forward(zeros({2, 5})), ShapeError, says<ShapeError>({"LSTMCell", "(2,5)", "(B,I)"}));
  BOOST_CHECK_EXCEPTION(cell.forward(zeros({2, 3}), {zeros({2, 4}), zeros({2, 5})}), ShapeError,
                        says<ShapeError>({"LSTMCell", "c", "(2,5)", "(2,4)"}));
  nn::GRUCell gcell({.input = 3, .hidden = 4});
  BOOST_CHECK_EXCEPTION(gcell.forward(zeros({2, 3}), zeros({3, 4})), ShapeError,
                        says<ShapeError>({"GRUCell", "(3,4)", "(2,4)"}));
  nn::RNNCell rcell({.input = 3, .hidden = 4});
  BOOST_CHECK_EXCEPTION(rcell.forward(zeros({2, 3}, DType::f64)), DTypeError, says<DTypeError>({"float64"}));
  // The LSTM's backward-recursion ops name themselves and the shapes.
  BOOST_CHECK_EXCEPTION(lstm_gate_slopes(zeros({3, 2, 12}), zeros({3, 2, 4}), zeros({3, 2, 3})), ShapeError,
                        says<ShapeError>({"lstm_gate_slopes", "(3,2,4)", "(3,2,3)", "(3,2,12)"}));
  BOOST_CHECK_EXCEPTION(lstm_recurrence_grad(zeros({2, 3, 2, 4}), zeros({3, 2, 16}), zeros({16, 4})), ShapeError,
                        says<ShapeError>({"lstm_recurrence_grad", "(3,2,16)", "(T,B,6H)"}));
  BOOST_CHECK_THROW(nn::LSTM({.input = 3, .hidden = 0}), ValueError);
  BOOST_CHECK_THROW(nn::GRU({.input = 3, .hidden = 4, .layers = 0}), ValueError);
  BOOST_CHECK_THROW(nn::RNN({.input = 3, .hidden = 4, .dropout = 1.0}), ValueError);
  BOOST_CHECK_THROW(nn::RNNCell({.input = 0, .hidden = 4}), ValueError);
  // The ops themselves.
  BOOST_CHECK_EXCEPTION(lstm_recurrence(zeros({3, 2, 8}), zeros({16, 4})), ShapeError,
                        says<ShapeError>({"lstm_recurrence", "(3,2,8)", "(16,4)"}));
  BOOST_CHECK_EXCEPTION(gru_recurrence(zeros({3, 2, 12}), zeros({12, 3})), ShapeError,
                        says<ShapeError>({"gru_recurrence", "(12,3)"}));
  BOOST_CHECK_EXCEPTION(rnn_tanh_recurrence(zeros({3, 2, 4}), zeros({4, 4}, DType::f64)), DTypeError,
                        says<DTypeError>({"rnn_tanh_recurrence", "float64", "float32"}));
  BOOST_CHECK_EXCEPTION(lstm_recurrence(zeros({3, 2, 16}), zeros({16, 4}), zeros({3, 4})), ShapeError,
                        says<ShapeError>({"lstm_recurrence", "h0", "(3,4)", "(2,4)"}));
  BOOST_CHECK_EXCEPTION(nn::GRU({.input = 3, .hidden = 4, .recompute_gates = true}), ValueError,
                        says<ValueError>({"GRU", "recompute_gates", "LSTM"}));
  const Tensor x = zeros({5, 2, 3}), w_ih = zeros({16, 3}), w_hh = zeros({16, 4});
  BOOST_CHECK_EXCEPTION(lstm_recompute(x, zeros({16, 2}), Tensor(), w_hh), ShapeError,
                        says<ShapeError>({"lstm_recompute", "w_ih", "(16,2)", "(5,2,3)", "(16,4)"}));
  BOOST_CHECK_EXCEPTION(lstm_recompute(x, w_ih, Tensor(), zeros({12, 4})), ShapeError,
                        says<ShapeError>({"lstm_recompute", "w_hh", "(12,4)", "(4H,H)"}));
  BOOST_CHECK_EXCEPTION(lstm_recompute(x, w_ih, zeros({12}), w_hh), ShapeError,
                        says<ShapeError>({"lstm_recompute", "bias", "(12)", "(16)"}));
  BOOST_CHECK_EXCEPTION(lstm_recompute(x, w_ih, Tensor(), w_hh, Tensor(), zeros({3, 4})), ShapeError,
                        says<ShapeError>({"lstm_recompute", "c0", "(3,4)", "(2,4)"}));
  BOOST_CHECK_EXCEPTION(lstm_recompute(zeros({0, 2, 3}), w_ih, Tensor(), w_hh), ShapeError,
                        says<ShapeError>({"lstm_recompute", "(0,2,3)", "T >= 1"}));
  BOOST_CHECK_EXCEPTION(lstm_recompute(x, w_ih, Tensor(), zeros({16, 4}, DType::f64)), DTypeError,
                        says<DTypeError>({"lstm_recompute", "w_hh", "float64", "float32"}));
}

// The fused tangent rules of the RNN, the LSTM and the GRU against their recorded
// form (jvp with create_graph takes the tangent from the backward), at sizes
// where the recurrences split their units over two threads (the op table's
// samples are too small to split), float64, every input with a tangent.
BOOST_AUTO_TEST_CASE(fused_tangents_match_recorded_split_over_units) {
  using samples::uniform;
  const int before = num_threads();
  set_num_threads(2);
  const int64_t T = 4, B = 32;
  struct Case {
    const char* name;
    int64_t G, H;
    TensorListFn fn;
    bool cell_state, bias;
  };
  const Case cases[] = {
      {"rnn_tanh_recurrence", 128, 128,
       [](const std::vector<Tensor>& x) { return std::vector<Tensor>{rnn_tanh_recurrence(x[0], x[1], x[2])}; }, false,
       false},
      {"lstm_recurrence", 256, 64,
       [](const std::vector<Tensor>& x) { return std::vector<Tensor>{lstm_recurrence(x[0], x[1], x[2], x[3])}; }, true,
       false},
      {"gru_recurrence", 384, 128,
       [](const std::vector<Tensor>& x) { return std::vector<Tensor>{gru_recurrence(x[0], x[1], x[2], x[3])}; }, false,
       true},
  };
  for (const Case& c : cases) {
    std::vector<Tensor> x = {uniform({T, B, c.G}, 601, -2, 2), uniform({c.G, c.H}, 602, -0.2, 0.2)};
    if (c.bias) x.push_back(uniform({c.G}, 603));
    x.push_back(uniform({B, c.H}, 604));
    if (c.cell_state) x.push_back(uniform({B, c.H}, 605));
    std::vector<Tensor> v;
    for (size_t k = 0; k < x.size(); ++k) v.push_back(uniform(x[k].shape(), 610 + k).detach());
    for (Tensor& t : x) t = t.detach();
    const Tensor fused = jvp(c.fn, x, v).tangents[0];
    const Tensor recorded = jvp(c.fn, x, v, /*create_graph=*/true).tangents[0].detach();
    const double diff = max(abs(sub(fused, recorded))).item<double>() / max(abs(recorded)).item<double>();
    BOOST_TEST(diff < 1e-12, c.name << ": fused and recorded tangents differ by " << diff << " (relative)");
  }
  set_num_threads(before);
}

// The recorded forms of the recurrence ops' tangent rules (grad mode on):
// reverse over forward, d/dx <w, J(x) v> from jvp with create_graph, equals
// forward over reverse, H v of <w, f(x)> (hvp), for every sample of the six ops.
BOOST_AUTO_TEST_CASE(recorded_tangents_differentiate_to_the_hvp) {
  for (const char* name : {"rnn_tanh_recurrence", "lstm_recurrence", "gru_recurrence", "gated_recurrence_grad",
                           "lstm_gate_slopes", "lstm_recurrence_grad"}) {
    const OpDef* op = find_op(name);
    BOOST_TEST_REQUIRE(op != nullptr);
    for (const OpSample& s : op->samples()) {
      std::vector<Tensor> x, v;
      for (size_t k = 0; k < s.inputs.size(); ++k) {
        x.push_back(s.inputs[k].detach());
        v.push_back(samples::uniform(x[k].shape(), 700 + k).detach());
      }
      const TensorListFn f = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{s.fn(in)}; };
      Tensor w;
      {
        NoGradGuard ng;
        w = samples::uniform(s.fn(x).shape(), 720).detach();
      }
      std::vector<Tensor> xs;
      for (const Tensor& t : x) xs.push_back(t.detach().requires_grad_());
      const JvpResult r = jvp(f, xs, v, /*create_graph=*/true);
      // A tangent that does not depend on the inputs (gated_recurrence_grad at
      // one step is the identity in g) has zero derivatives.
      const Tensor jw = sum(mul(r.tangents[0], w));
      const std::vector<Tensor> rof =
          jw.requires_grad() ? grad({jw}, xs, {}, {.allow_unused = true}) : std::vector<Tensor>(xs.size());
      const TensorListFn loss = [&](const std::vector<Tensor>& in) { return std::vector<Tensor>{sum(mul(s.fn(in), w))}; };
      const HvpResult h = hvp(loss, x, v);
      for (size_t k = 0; k < x.size(); ++k) {
        const Tensor want = h.hvp[k], got = rof[k].defined() ? rof[k] : zeros_like(want);
        const double diff = max(abs(sub(got, want))).item<double>() / (1 + max(abs(want)).item<double>());
        BOOST_TEST(diff < 1e-12, name << " / " << s.desc << ", input " << k << ": reverse over forward differs from "
                                      << "forward over reverse by " << diff);
      }
    }
  }
}
