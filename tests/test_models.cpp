// Whole models: float64 gradchecks at tiny sizes (every parameter, through
// time for the recurrent ones), incremental decoding equal to the full
// forward pass, and a few training steps that must lower the loss.
#define BOOST_TEST_MODULE models
#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "autograd/ops/samples.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "models/registry.h"
#include "models/rnn_lm.h"
#include "models/seq2seq.h"
#include "models/training_state.h"
#include "models/transformer.h"
#include "nn/nn.h"
#include "testing.h"

using namespace tg;
using namespace tg::models;
using namespace tg::testing;

namespace {

// Gradchecks a scalar function of the model over every parameter; returns the report.
GradcheckReport check_model(nn::Module& m, const std::function<Tensor()>& loss) {
  GradcheckOptions o;
  o.fast = true;  // v^T J u along random directions: a model has too many parameters for the full Jacobian
  o.directions = 3;
  return nn::gradcheck_module(m, [&](const std::vector<Tensor>&) { return loss(); }, {}, o);
}

// The same for second derivatives: the backward along a random output
// gradient, differentiated again with respect to every parameter.
GradcheckReport check_model_twice(nn::Module& m, const std::function<Tensor()>& loss) {
  GradcheckOptions o;
  o.fast = true;
  o.directions = 2;
  return nn::gradgradcheck_module(m, [&](const std::vector<Tensor>&) { return loss(); }, {}, o);
}

GPTOptions tiny_gpt() { return {.vocab = 7, .block = 6, .layers = 2, .heads = 2, .dim = 8}; }

}  // namespace

BOOST_AUTO_TEST_CASE(gpt_gradcheck_all_parameters) {
  for (bool tied : {true, false}) {
    for (auto norm : {nn::NormPosition::pre, nn::NormPosition::post}) {
      manual_seed(1);
      GPTOptions o = tiny_gpt();
      o.tied = tied;
      o.norm = norm;
      o.positions = tied ? PositionKind::learned : PositionKind::sinusoidal;
      GPT m(o);
      Tensor x = ids({1, 2, 3, 4, 5, 0, 6, 1, 2, 3}, {2, 5}), y = ids({2, 3, 4, 5, 0, 6, 1, 2, 3, 4}, {2, 5});
      auto r = check_model(m, [&] { return m.loss(x, y); });
      BOOST_TEST(r.passed, "GPT tied=" << tied << " pre=" << (norm == nn::NormPosition::pre) << "\n" << r.str());
    }
  }
}

BOOST_AUTO_TEST_CASE(tiny_models_gradgradcheck_all_parameters) {
  manual_seed(1);
  GPT gpt(tiny_gpt());
  Tensor x = ids({1, 2, 3, 4, 5, 0}, {2, 3}), y = ids({2, 3, 4, 5, 0, 6}, {2, 3});
  auto r = check_model_twice(gpt, [&] { return gpt.loss(x, y); });
  BOOST_TEST(r.passed, "GPT\n" << r.str());
  for (CellKind cell : {CellKind::rnn, CellKind::lstm, CellKind::gru}) {
    manual_seed(2);
    RNNLM m({.vocab = 7, .embed = 3, .hidden = 4, .layers = 1, .cell = cell});
    auto rr = check_model_twice(m, [&] { return m.loss(x, y); });
    BOOST_TEST(rr.passed, cell_name(cell) << "\n" << rr.str());
  }
}

// A forward nobody backpropagates (no NoGradGuard) is freed with its loss:
// the allocator's bytes in use and the live nodes come back to where they were.
BOOST_AUTO_TEST_CASE(discarded_forwards_keep_memory_flat) {
  manual_seed(3);
  GPT m(tiny_gpt());
  Tensor x = ids({1, 2, 3, 4, 5, 0}, {2, 3}), y = ids({2, 3, 4, 5, 0, 6}, {2, 3});
  m.loss(x, y);  // warm up
  const size_t bytes = memory_stats().bytes_in_use;
  const int64_t nodes = live_nodes();
  for (int k = 0; k < 300; ++k) m.loss(x, y);
  BOOST_TEST(memory_stats().bytes_in_use == bytes);
  BOOST_TEST(live_nodes() == nodes);
}

BOOST_AUTO_TEST_CASE(rnn_lms_gradcheck_through_time) {
  for (CellKind cell : {CellKind::rnn, CellKind::lstm, CellKind::gru}) {
    manual_seed(2);
    RNNLM m({.vocab = 6, .embed = 4, .hidden = 5, .layers = 2, .cell = cell});
    Tensor x = ids({1, 2, 3, 4, 5, 0, 1, 2}, {2, 4}), y = ids({2, 3, 4, 5, 0, 1, 2, 3}, {2, 4});
    auto r = check_model(m, [&] { return m.loss(x, y); });
    BOOST_TEST(r.passed, cell_name(cell) << "\n" << r.str());
  }
}

BOOST_AUTO_TEST_CASE(seq2seq_models_gradcheck) {
  manual_seed(3);
  Tensor src = ids({3, 4, 5, 6, 4, 5}, {2, 3}), tgt_in = ids({1, 6, 5, 1, 5, 4}, {2, 3}),
         tgt_out = ids({6, 5, 4, 5, 4, 2}, {2, 3});
  for (bool attention : {false, true}) {
    Seq2SeqRNN m({.vocab = 7, .embed = 4, .hidden = 5, .attention = attention});
    auto r = check_model(m, [&] { return cross_entropy(m.forward(src, tgt_in).reshape({-1, 7}), tgt_out.reshape({-1})); });
    BOOST_TEST(r.passed, m.type_name() << "\n" << r.str());
  }
  EncoderDecoderTransformer t({.vocab = 7, .max_len = 8, .layers = 1, .heads = 2, .dim = 8});
  Tensor pad = ids({0, 0, 0, 0, 0, 1}, {2, 3});
  auto r = check_model(t, [&] { return cross_entropy(t.forward(src, tgt_in, pad).reshape({-1, 7}), tgt_out.reshape({-1})); });
  BOOST_TEST(r.passed, "EncoderDecoderTransformer\n" << r.str());
}

BOOST_AUTO_TEST_CASE(classifier_gradcheck_with_padding) {
  manual_seed(4);
  for (Pooling p : {Pooling::mean, Pooling::first}) {
    TransformerClassifier m({.vocab = 9, .max_len = 8, .layers = 1, .heads = 2, .dim = 8}, 3, p);
    Tensor x = ids({1, 2, 3, 4, 5, 6, 0, 0}, {2, 4}), pad = ids({0, 0, 0, 0, 0, 0, 1, 1}, {2, 4});
    Tensor y = ids({2, 0}, {2});
    auto r = check_model(m, [&] { return cross_entropy(m.forward(x, pad), y); });
    BOOST_TEST(r.passed, r.str());
  }
}

BOOST_AUTO_TEST_CASE(padding_does_not_change_the_classification) {
  // The same sentence with and without trailing padding gets the same logits.
  manual_seed(5);
  TransformerClassifier m({.vocab = 9, .max_len = 8, .layers = 2, .heads = 2, .dim = 8}, 3);
  m.eval();
  NoGradGuard ng;
  Tensor a = m.forward(ids({1, 2, 3}, {1, 3}));
  Tensor b = m.forward(ids({1, 2, 3, 0, 0}, {1, 5}), ids({0, 0, 0, 1, 1}, {1, 5}));
  BOOST_TEST(max_abs_diff(a, b) < 1e-5);
}

BOOST_AUTO_TEST_CASE(kv_cache_equals_full_forward) {
  manual_seed(6);
  GPT m(tiny_gpt());
  m.eval();
  NoGradGuard ng;
  Tensor x = ids({1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5}, {2, 6});
  Tensor full = m.forward(x);  // (2,6,V)
  // One token at a time, then in chunks of 2 and 4.
  for (int64_t chunk : {1, 2, 4}) {
    auto state = m.start(2);
    std::vector<Tensor> parts;
    for (int64_t t = 0; t < 6; t += chunk) parts.push_back(m.forward_step(x.slice(1, t, std::min<int64_t>(t + chunk, 6)), *state));
    BOOST_TEST(max_abs_diff(concat(parts, 1), full) < 1e-5, "chunk " << chunk);
  }
}

BOOST_AUTO_TEST_CASE(rnn_state_decoding_equals_full_forward) {
  manual_seed(7);
  for (CellKind cell : {CellKind::rnn, CellKind::lstm, CellKind::gru}) {
    RNNLM m({.vocab = 6, .embed = 4, .hidden = 5, .layers = 2, .cell = cell});
    m.eval();
    NoGradGuard ng;
    Tensor x = ids({1, 2, 3, 4, 5, 0, 1, 2}, {2, 4});
    Tensor full = m.forward(x);
    auto state = m.start(2);
    std::vector<Tensor> parts;
    for (int64_t t = 0; t < 4; ++t) parts.push_back(m.forward_step(x.slice(1, t, t + 1), *state));
    BOOST_TEST(max_abs_diff(concat(parts, 1), full) < 1e-5, cell_name(cell));
  }
}

BOOST_AUTO_TEST_CASE(encoder_decoder_greedy_uses_the_cache_consistently) {
  // Greedy decoding with KV caches must pick the argmax of the full forward
  // pass at every position, when fed its own output.
  manual_seed(8);
  EncoderDecoderTransformer m({.vocab = 7, .max_len = 8, .layers = 2, .heads = 2, .dim = 8});
  Tensor src = ids({3, 4, 5, 6}, {1, 4});
  auto out = m.greedy(src, Tensor(), 1, 2, 5);
  NoGradGuard ng;
  std::vector<int64_t> tgt_in = {1};
  for (int64_t t : out[0]) tgt_in.push_back(t);
  Tensor logits = m.forward(src, from_vector(tgt_in, {1, static_cast<int64_t>(tgt_in.size())}));
  auto best = argmax(logits, 2).to_vector<int64_t>();
  for (size_t i = 0; i < out[0].size(); ++i) BOOST_TEST(best[i] == out[0][i], "position " << i);
}

BOOST_AUTO_TEST_CASE(training_lowers_the_loss) {
  // A repeating sequence is learnable: 30 AdamW steps must cut the loss a lot.
  std::vector<int64_t> seq;
  for (int i = 0; i < 64; ++i) seq.push_back(i % 5);
  Tensor x = from_vector(std::vector<int64_t>(seq.begin(), seq.begin() + 48), {4, 12});
  Tensor y = from_vector(std::vector<int64_t>(seq.begin() + 1, seq.begin() + 49), {4, 12});
  auto run = [&](LanguageModel& m) {
    nn::AdamW opt(m.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
    double first = 0, last = 0;
    for (int s = 0; s < 30; ++s) {
      Tensor loss = m.loss(x, y);
      if (s == 0) first = loss.item();
      last = loss.item();
      loss.backward();
      opt.step();
      opt.zero_grad();
    }
    return std::pair{first, last};
  };
  manual_seed(9);
  GPT g({.vocab = 5, .block = 12, .layers = 1, .heads = 2, .dim = 16});
  auto [g0, g1] = run(g);
  BOOST_TEST(g1 < 0.3 * g0, "GPT " << g0 << " -> " << g1);
  RNNLM l({.vocab = 5, .embed = 8, .hidden = 16, .cell = CellKind::lstm});
  auto [l0, l1] = run(l);
  BOOST_TEST(l1 < 0.3 * l0, "LSTM " << l0 << " -> " << l1);
}

BOOST_AUTO_TEST_CASE(generation) {
  manual_seed(10);
  GPT m(tiny_gpt());
  Generator a(42), b(42);
  SamplingOptions o{.max_new_tokens = 20, .temperature = 0.9, .top_k = 3};
  auto s1 = generate(m, {1, 2}, o, a), s2 = generate(m, {1, 2}, o, b);
  BOOST_TEST(s1 == s2);  // same generator state, same text
  BOOST_TEST(s1.size() == 20u);  // runs past the block size of 6 by restarting the window
  // Greedy is the argmax of the full forward pass.
  auto g = generate(m, {3}, {.max_new_tokens = 1, .greedy = true}, a);
  NoGradGuard ng;
  BOOST_TEST(g[0] == argmax(m.forward(ids({3}, {1, 1})), 2).item<int64_t>());
  // top_k = 1 is greedy whatever the temperature.
  auto k1 = generate(m, {3}, {.max_new_tokens = 1, .temperature = 5.0, .top_k = 1}, a);
  BOOST_TEST(k1[0] == g[0]);
  BOOST_CHECK_THROW(generate(m, {}, o, a), ValueError);
  BOOST_CHECK_THROW(generate(m, {9}, o, a), IndexError);
  BOOST_CHECK_THROW(sample_token({1.0, 2.0}, {.temperature = 0.0}, a), ValueError);
}

BOOST_AUTO_TEST_CASE(model_errors_name_the_problem) {
  BOOST_CHECK_THROW(GPT({.vocab = 0}), ValueError);
  BOOST_CHECK_THROW(GPT({.vocab = 5, .heads = 3, .dim = 8}), ValueError);  // 8 % 3 != 0
  GPT m(tiny_gpt());
  BOOST_CHECK_THROW(m.forward(ids({1, 2, 3, 4, 5, 6, 0}, {1, 7})), ValueError);  // past the block
  BOOST_CHECK_THROW(m.forward(ids({1, 2}, {2})), ShapeError);
  BOOST_CHECK_THROW(m.forward(ids({1, 9}, {1, 2})), IndexError);  // id outside the vocabulary
  BOOST_CHECK_THROW(RNNLM({.vocab = 5, .hidden = 0}), ValueError);
}

// --- Models by name, and what a training run keeps to resume

BOOST_AUTO_TEST_CASE(rnn_lm_parameter_formula_counts_the_model) {
  for (CellKind cell : {CellKind::rnn, CellKind::lstm, CellKind::gru})
    for (int64_t layers : {1, 2}) {
      const RNNLMOptions o{.vocab = 11, .embed = 5, .hidden = 7, .layers = layers, .cell = cell};
      BOOST_CHECK_EQUAL(rnn_lm_parameters(o), RNNLM(o).num_parameters());
    }
  // An LSTM matched to charlm's GPT: no hidden size beside it comes nearer.
  RNNLMOptions o{.vocab = 85, .embed = 64, .layers = 1, .cell = CellKind::lstm};
  const int64_t budget = GPT({.vocab = 85, .block = 64, .layers = 2, .heads = 4, .dim = 128}).num_parameters();
  const int64_t H = hidden_for_parameters(o, budget);
  auto distance = [&](int64_t h) {
    o.hidden = h;
    return std::llabs(rnn_lm_parameters(o) - budget);
  };
  BOOST_CHECK_LT(distance(H), distance(H - 1));
  BOOST_CHECK_LE(distance(H), distance(H + 1));
  BOOST_CHECK_LT(distance(H), budget / 100);
}

BOOST_AUTO_TEST_CASE(language_models_by_kind) {
  for (const std::string kind : {"gpt", "rnn", "lstm", "gru"}) {
    const ModelSpec spec{.kind = kind, .vocab = 9, .layers = 2, .block = 6, .heads = 2, .dim = 8,
                         .embed = 4, .hidden = 5};
    auto m = make_language_model(spec);
    BOOST_CHECK_EQUAL(m->vocab_size(), 9);
    BOOST_CHECK_EQUAL(config_of(*m).at("model"), kind);
    BOOST_CHECK_EQUAL(make_language_model(config_of(*m))->num_parameters(), m->num_parameters());
    if (kind != "gpt") {
      BOOST_CHECK(cell_kind(kind) == dynamic_cast<RNNLM&>(*m).options.cell);
      BOOST_CHECK_EQUAL(kind_of(cell_kind(kind)), kind);
    }
    BOOST_CHECK_CLOSE(make_optimizer(kind, *m)->lr(), kind == "gpt" ? 1e-3 : 2e-3, 1e-9);
    BOOST_CHECK_CLOSE(make_optimizer(kind, *m, 0.5)->lr(), 0.5, 1e-9);
  }
  BOOST_CHECK_EXCEPTION(make_language_model(ModelSpec{.kind = "tcn", .vocab = 9}), ValueError,
                        says<ValueError>({"'tcn'"}));
  auto gpt = make_language_model(ModelSpec{.kind = "gpt", .vocab = 9, .layers = 1, .block = 4, .heads = 2, .dim = 8});
  BOOST_CHECK_EXCEPTION(make_optimizer("tcn", *gpt), ValueError, says<ValueError>({"'tcn'"}));
}

BOOST_AUTO_TEST_CASE(training_state_round_trips_through_metadata) {
  const TrainingState s{.model = "lstm", .step = 250, .seconds = 12.125, .batch_seed = 1337,
                        .batch_offset = 8000, .dropout_seed = 1338, .dropout_offset = 77,
                        .interval_loss = 1.0 / 3, .interval_steps = 50,
                        .curve = {{100, 2.5, 2.75}, {200, 1.0 / 7, 0.1 + 0.2}}};
  std::map<std::string, std::string> meta = to_metadata(s);
  BOOST_CHECK_EQUAL(meta.at("batch_seed"), "1337");
  BOOST_CHECK_EQUAL(meta.at("curve.000000"), "100 2.5 2.75");
  const TrainingState back = training_state_from_metadata(meta, "lstm.state.safetensors");
  BOOST_CHECK_EQUAL(back.model, s.model);
  BOOST_CHECK_EQUAL(back.step, s.step);
  BOOST_CHECK_EQUAL(back.seconds, s.seconds);
  BOOST_CHECK_EQUAL(back.batch_seed, s.batch_seed);
  BOOST_CHECK_EQUAL(back.batch_offset, s.batch_offset);
  BOOST_CHECK_EQUAL(back.dropout_seed, s.dropout_seed);
  BOOST_CHECK_EQUAL(back.dropout_offset, s.dropout_offset);
  BOOST_CHECK_EQUAL(back.interval_loss, s.interval_loss);  // exactly: 17 digits
  BOOST_CHECK_EQUAL(back.interval_steps, s.interval_steps);
  BOOST_REQUIRE_EQUAL(back.curve.size(), 2u);
  BOOST_CHECK_EQUAL(back.curve[1].step, 200);
  BOOST_CHECK_EQUAL(back.curve[1].train_loss, 1.0 / 7);
  BOOST_CHECK_EQUAL(back.curve[1].val_loss, 0.1 + 0.2);
  // Checkpoints from before the interval's loss was kept: taken at an evaluation, where it is 0.
  auto older = meta;
  older.erase("interval_loss"), older.erase("interval_steps");
  const TrainingState at_eval = training_state_from_metadata(older, "old");
  BOOST_CHECK_EQUAL(at_eval.interval_loss, 0.0);
  BOOST_CHECK_EQUAL(at_eval.interval_steps, 0);

  auto no_step = meta;
  no_step.erase("step");
  BOOST_CHECK_EXCEPTION(training_state_from_metadata(no_step, "f.safetensors"), ValueError,
                        says<ValueError>({"f.safetensors", "'step'", "missing"}));
  auto bad_offset = meta;
  bad_offset["batch_offset"] = "12abc";
  BOOST_CHECK_EXCEPTION(training_state_from_metadata(bad_offset, "f"), ValueError,
                        says<ValueError>({"'batch_offset'", "'12abc'"}));
  auto short_point = meta;
  short_point["curve.000001"] = "200 0.5";
  BOOST_CHECK_EXCEPTION(training_state_from_metadata(short_point, "f"), ValueError,
                        says<ValueError>({"'curve.000001'", "'200 0.5'"}));
}
