// The feature matrix: every feature of the engine composes with every model.
//
// Rows (features): plain; create_graph (double backward); jvp; hvp (forward
// over reverse); bf16 autocast; anomaly detection; each activation
// checkpointing option of each model (and tg::checkpoint around a whole
// loss, which every model takes); 2 kernel threads; and two triples,
// checkpoint + hvp + 2 threads and autocast + checkpoint + anomaly.
// Columns (models): GPT, the encoder-decoder transformer, the RNN LM with an
// RNN, an LSTM and a GRU, the LSTM seq2seq with attention, and skip-gram.
//
// Each (feature, model) pair runs the model's loss with the feature on and
// compares with the plain run of the same model, built from the same seed and
// fed the same batch and dropout masks: in float64, the loss equal and the
// gradients within 1e-10 of the plain ones (relative to the largest plain
// gradient); a jvp's tangent equal to <grad, v>; tg::hvp's H v equal to
// reverse over reverse; with anomaly detection on, bit-identical results.
// Autocast changes only float32 GEMMs, so it runs in float32 against the
// float32 plain run, within bfloat16's tolerance (tests/test_autocast.cpp's
// 2^-6 of the scale), and a model without a GEMM (skip-gram) gives float32's
// results bit for bit.
//
// No pair is forbidden: doc/autograd.md documents none (every op has a
// tangent rule and a backward differentiable again, a checkpoint reruns
// under the forward's precision and random state, and hvp/jvp reach a
// module's parameters), so every pair must run and agree; none expects an
// error.
//
// The models are tiny (1.9k to 15k parameters, T = 7, batch 2). The pairs
// with 2 threads run a batch of kThreadBatch rows instead, which is what it
// takes for the pool to split these models' work at all (the recurrences'
// hidden units and backward batch rows, attention's heads, the output head's
// GEMM): at batch 2 every kernel stays below its grain and runs on one
// thread, so comparing 1 and 2 threads would compare a run with itself.
//
// Adding a model or a feature is one entry in model_table() or feature_table().
#define BOOST_TEST_MODULE feature_matrix
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/activation_checkpoint.h"
#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/forward_ad.h"
#include "autograd/parallel.h"
#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "models/seq2seq.h"
#include "models/skip_gram.h"
#include "models/transformer.h"
#include "nn/loss.h"
#include "tests/testing.h"

using namespace tg;

namespace {

constexpr int64_t kT = 7;             // sequence length
constexpr int64_t kBatch = 2;         // the batch of every pair but those with 2 threads
constexpr int64_t kThreadBatch = 256;  // the batch with 2 threads (see above)
constexpr uint64_t kDropoutSeed = 77;  // reseeded before every loss: the same dropout masks

// ---------------------------------------------------------------- the models

// A model built for one run: the module and its loss, a closure over the
// module's parameters and a fixed batch.
struct Built {
  std::shared_ptr<nn::Module> module;
  std::function<Tensor()> loss;
};

// An activation checkpointing option of a model: `value` is given to the
// model's factory (0: off), or, with `whole`, the loss runs under one
// tg::checkpoint.
struct CheckpointOption {
  std::string name;
  int64_t value = 0;
  bool whole = false;
};

struct Model {
  std::string name;
  // (dtype, checkpoint option value, batch) -> the model and its loss; the
  // weights depend on nothing but the model, the batch on nothing but B.
  std::function<Built(DType, int64_t, int64_t)> make;
  std::vector<CheckpointOption> checkpoints;  // the model's own options
  bool gemms = true;                          // whether autocast changes its results
};

// Token ids in [0, vocab), the same for a given (shape, seed).
Tensor tokens(int64_t vocab, const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randint(0, vocab, shape, &g);
}

// A source padding mask (B,S): the last position of every odd row is padding.
Tensor padding(int64_t B, int64_t S) {
  std::vector<int64_t> p(B * S, 0);
  for (int64_t b = 1; b < B; b += 2) p[b * S + S - 1] = 1;
  return from_vector(p, Shape{B, S});
}

Tensor sequence_loss(const Tensor& logits, const Tensor& targets) {
  return nn::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

Built gpt(DType dtype, int64_t checkpoint, int64_t B) {
  manual_seed(101);
  auto m = std::make_shared<models::GPT>(models::GPTOptions{.vocab = 7, .block = kT, .layers = 2, .heads = 2, .dim = 8,
                                                            .dropout = 0.1, .checkpoint_blocks = checkpoint});
  m->to(dtype);
  const Tensor x = tokens(7, {B, kT}, 1), y = tokens(7, {B, kT}, 2);
  return {m, [m, x, y] { return m->loss(x, y); }};
}

Built encoder_decoder(DType dtype, int64_t checkpoint, int64_t B) {
  manual_seed(102);
  auto m = std::make_shared<models::EncoderDecoderTransformer>(models::TransformerOptions{
      .vocab = 7, .max_len = 8, .layers = 2, .heads = 2, .dim = 8, .dropout = 0.1, .checkpoint_layers = checkpoint});
  m->to(dtype);
  const Tensor src = tokens(7, {B, kT}, 3), tgt_in = tokens(7, {B, kT}, 4), tgt_out = tokens(7, {B, kT}, 5),
               pad = padding(B, kT);
  return {m, [m, src, tgt_in, tgt_out, pad] { return sequence_loss(m->forward(src, tgt_in, pad), tgt_out); }};
}

std::function<Built(DType, int64_t, int64_t)> rnn_lm(models::CellKind cell) {
  return [cell](DType dtype, int64_t checkpoint, int64_t B) {
    manual_seed(103);
    // hidden 32: the smallest the recurrences split over 2 threads (16 units a part)
    auto m = std::make_shared<models::RNNLM>(models::RNNLMOptions{.vocab = 7, .embed = 6, .hidden = 32, .layers = 2,
                                                                  .cell = cell, .dropout = 0.1,
                                                                  .checkpoint_time = checkpoint != 0});
    m->to(dtype);
    const Tensor x = tokens(7, {B, kT}, 6), y = tokens(7, {B, kT}, 7);
    return Built{m, [m, x, y] { return m->loss(x, y); }};
  };
}

Built seq2seq(DType dtype, int64_t, int64_t B) {
  manual_seed(104);
  auto m = std::make_shared<models::Seq2SeqRNN>(
      models::Seq2SeqRNNOptions{.vocab = 7, .embed = 4, .hidden = 32, .attention = true, .attention_dim = 8});
  m->to(dtype);
  const Tensor src = tokens(7, {B, kT}, 8), tgt_in = tokens(7, {B, kT}, 9), tgt_out = tokens(7, {B, kT}, 10),
               pad = padding(B, kT);
  return {m, [m, src, tgt_in, tgt_out, pad] { return sequence_loss(m->forward(src, tgt_in, pad), tgt_out); }};
}

Built skip_gram(DType dtype, int64_t, int64_t B) {
  Generator g(105);
  auto m = std::make_shared<models::SkipGram>(11, 6, &g);
  m->to(dtype);
  {
    // word2vec starts the context vectors at zero, where the center vectors'
    // gradient is zero too: start them random, so every gradient is not.
    NoGradGuard no_grad;
    m->context.copy_(randn(m->context.shape(), dtype, &g, 0.0, 0.3));
  }
  // Few words and a batch of pairs: rows repeat, so the lookups' gradients accumulate.
  const Tensor in = tokens(11, {B}, 11), out = tokens(11, {B}, 12), negatives = tokens(11, {B, 3}, 13);
  return {m, [m, in, out, negatives] { return m->loss(in, out, negatives); }};
}

const std::vector<Model>& model_table() {
  static const std::vector<Model> table{
      {"gpt", gpt, {{"checkpoint_blocks=1", 1}, {"checkpoint_blocks=2", 2}}},
      {"encoder_decoder", encoder_decoder, {{"checkpoint_layers=1", 1}, {"checkpoint_layers=2", 2}}},
      {"rnn_lm_rnn", rnn_lm(models::CellKind::rnn), {{"checkpoint_time", 1}}},
      {"rnn_lm_lstm", rnn_lm(models::CellKind::lstm), {{"checkpoint_time (recompute_gates)", 1}}},
      {"rnn_lm_gru", rnn_lm(models::CellKind::gru), {{"checkpoint_time", 1}}},
      {"seq2seq_attention", seq2seq, {}},
      {"skip_gram", skip_gram, {}, /*gemms=*/false},
  };
  return table;
}

// Every model's options, then tg::checkpoint around its whole loss.
std::vector<CheckpointOption> checkpoint_options(const Model& m) {
  std::vector<CheckpointOption> all = m.checkpoints;
  all.push_back({"checkpoint(loss)", 0, true});
  return all;
}

// ---------------------------------------------------------------- one run

// What a run turns on.
struct Setup {
  DType dtype = DType::f64;
  std::optional<CheckpointOption> checkpoint{};
  int threads = 1;
  bool anomaly = false;
  bool autocast = false;
  int64_t batch = kBatch;
};

// What a run computes.
enum class Mode {
  grads,         // loss and gradients
  create_graph,  // the same with create_graph, then H v by reverse over reverse
  hvp,           // tg::hvp: loss, gradients and H v forward over reverse
  jvp,           // tg::jvp: loss and its tangent along v
};

struct Result {
  double loss = 0;
  std::vector<Tensor> grads;  // per parameter (detached)
  std::vector<Tensor> hv;     // H v per parameter (create_graph, hvp)
  double tangent = 0;         // jvp
  bool grads_differentiable = false;  // create_graph: the gradients require grad
};

struct ThreadsGuard {
  int prev;
  explicit ThreadsGuard(int n) : prev(num_threads()) { set_num_threads(n); }
  ~ThreadsGuard() { set_num_threads(prev); }
};

// The direction v: one random tensor per parameter, the same for a given model.
std::vector<Tensor> direction(const std::vector<Tensor>& params) {
  Generator g(4242);
  std::vector<Tensor> v;
  for (const Tensor& p : params) v.push_back(randn(p.shape(), p.dtype(), &g));
  return v;
}

Tensor dot(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  Tensor s = zeros({}, a.at(0).dtype());
  for (size_t k = 0; k < a.size(); ++k) s = add(s, sum(mul(a[k], b[k])));
  return s;
}

Result run(const Model& model, const Setup& s, Mode mode) {
  const Built b = model.make(s.dtype, s.checkpoint ? s.checkpoint->value : 0, s.batch);
  // The features are on for the loss's forward and backward (not while the model is built).
  ThreadsGuard threads(s.threads);
  std::optional<AutocastGuard> autocast;
  if (s.autocast) autocast.emplace(DType::bf16);
  std::optional<DetectAnomalyGuard> anomaly;
  if (s.anomaly) anomaly.emplace();
  const bool whole = s.checkpoint && s.checkpoint->whole;
  const std::function<Tensor()> loss = [&] {
    manual_seed(kDropoutSeed);
    if (!whole) return b.loss();
    return checkpoint([&](const std::vector<Tensor>&) { return b.loss(); }, {});
  };
  const std::vector<Tensor> params = b.module->parameters();
  const std::vector<Tensor> v = direction(params);
  const TensorListFn fn = [&](const std::vector<Tensor>&) { return std::vector<Tensor>{loss()}; };
  Result r;
  switch (mode) {
    case Mode::grads: {
      const Tensor l = loss();
      r.loss = l.item();
      r.grads = grad({l}, params);
      break;
    }
    case Mode::create_graph: {
      const Tensor l = loss();
      r.loss = l.item();
      const std::vector<Tensor> g = grad({l}, params, {}, {.create_graph = true});
      r.grads_differentiable = true;
      for (const Tensor& gk : g) {
        r.grads_differentiable = r.grads_differentiable && gk.requires_grad();
        r.grads.push_back(gk.detach());
      }
      r.hv = grad({dot(g, v)}, params);
      break;
    }
    case Mode::hvp: {
      const HvpResult h = hvp(fn, params, v);
      r.loss = h.value.item();
      r.grads = h.grads;
      r.hv = h.hvp;
      break;
    }
    case Mode::jvp: {
      const JvpResult j = jvp(fn, params, v);
      r.loss = j.outputs.at(0).item();
      r.tangent = j.tangents.at(0).item();
      break;
    }
  }
  return r;
}

// The plain run of a model in a dtype, batch and mode, computed once.
const Result& plain(const Model& model, DType dtype, int64_t batch, Mode mode) {
  static std::map<std::tuple<std::string, DType, int64_t, Mode>, Result> cache;
  const auto key = std::tuple{model.name, dtype, batch, mode};
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, run(model, Setup{.dtype = dtype, .batch = batch}, mode)).first;
  return it->second;
}

// ---------------------------------------------------------------- comparisons

// max |got - want| over every tensor, over the largest |want|: the error
// relative to the scale of the whole gradient (a parameter whose gradient is
// zero but for rounding, like attention's key bias, makes a per-tensor
// relative error meaningless).
struct Diff {
  double abs = 0, scale = 0;
  size_t worst = 0;  // the tensor of the largest difference
  double rel() const { return abs / std::max(scale, 1e-300); }
};
Diff diff(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  Diff d;
  for (size_t k = 0; k < want.size(); ++k) {
    BOOST_REQUIRE_MESSAGE(got[k].defined(), "tensor " << k << " missing");
    const double e = testing::max_abs_diff(got[k], want[k]);
    if (!(e <= d.abs) && !std::isnan(d.abs)) d.abs = e, d.worst = k;  // a NaN sticks
    d.scale = std::max(d.scale, testing::max_abs_diff(want[k], zeros_like(want[k])));
  }
  return d;
}

// Checks got within tol of want relative to want's scale; tol 0: bit for bit.
void check_close(const std::string& what, const std::vector<Tensor>& got, const std::vector<Tensor>& want, double tol) {
  const Diff d = diff(got, want);
  BOOST_TEST(d.scale > 0, what << ": the reference is all zero");
  if (tol == 0)
    BOOST_TEST(d.abs == 0.0, what << ": not bit-identical, off by " << d.abs << " (tensor " << d.worst << ")");
  else
    BOOST_TEST(d.rel() <= tol, what << ": relative error " << d.rel() << " above " << tol << " (tensor " << d.worst
                                    << ", scale " << d.scale << ")");
}

void check_loss(const std::string& what, double got, double want, double tol) {
  const double e = std::abs(got - want) / std::max(std::abs(want), 1e-300);
  if (tol == 0)
    BOOST_TEST(got == want, what << ": " << got << " vs " << want);
  else
    BOOST_TEST(e <= tol, what << ": " << got << " vs " << want << ", relative error " << e);
}

constexpr double kTol = 1e-10;
// bfloat16's tolerance (tests/test_autocast.cpp): 2^-6 of the result's scale.
const double kBf16Tol = std::ldexp(1.0, -6);

// ---------------------------------------------------------------- the features

struct Pair {
  const Model& model;
  const CheckpointOption* option;  // the checkpoint option, for features that take one
};

struct Feature {
  std::string name;
  bool per_checkpoint_option;  // one pair per checkpoint option of the model, else one per model
  std::function<void(const Pair&)> check;
};

void plain_run(const Pair& p) {
  // The reference itself: finite, not zero, deterministic, and its graph freed.
  const int64_t nodes = live_nodes();
  const Result a = run(p.model, {}, Mode::grads);
  BOOST_TEST(live_nodes() == nodes, "graph not freed: " << live_nodes() - nodes << " live nodes more");
  BOOST_TEST(std::isfinite(a.loss));
  BOOST_TEST(a.loss > 0);
  for (const Tensor& g : a.grads) BOOST_TEST(count_non_finite(g).any() == false);
  const Result& b = plain(p.model, DType::f64, kBatch, Mode::grads);
  check_loss("loss, run twice", a.loss, b.loss, 0);
  check_close("gradients, run twice", a.grads, b.grads, 0);
}

void create_graph_run(const Pair& p) {
  const Result r = run(p.model, {}, Mode::create_graph);
  const Result& ref = plain(p.model, DType::f64, kBatch, Mode::grads);
  check_loss("loss", r.loss, ref.loss, 0);
  check_close("gradients with create_graph", r.grads, ref.grads, kTol);
  BOOST_TEST(r.grads_differentiable, "a gradient taken with create_graph does not require grad");
  check_close("H v, reverse over reverse vs tg::hvp", r.hv, plain(p.model, DType::f64, kBatch, Mode::hvp).hv, kTol);
}

void jvp_run(const Pair& p) {
  const Result r = run(p.model, {}, Mode::jvp);
  const Result& ref = plain(p.model, DType::f64, kBatch, Mode::grads);
  check_loss("jvp's loss", r.loss, ref.loss, 0);
  const std::vector<Tensor> v = direction(p.model.make(DType::f64, 0, kBatch).module->parameters());
  const double gv = dot(ref.grads, v).item();
  check_loss("jvp's tangent vs <grad, v>", r.tangent, gv, kTol);
}

void hvp_run(const Pair& p) {
  const Result r = run(p.model, {}, Mode::hvp);
  const Result& ref = plain(p.model, DType::f64, kBatch, Mode::grads);
  check_loss("hvp's loss", r.loss, ref.loss, 0);
  check_close("hvp's gradients", r.grads, ref.grads, kTol);
  check_close("H v, tg::hvp vs reverse over reverse", r.hv, plain(p.model, DType::f64, kBatch, Mode::create_graph).hv,
              kTol);
}

void autocast_run(const Pair& p) {
  const Result r = run(p.model, {.dtype = DType::f32, .autocast = true}, Mode::grads);
  const Result& ref = plain(p.model, DType::f32, kBatch, Mode::grads);
  if (!p.model.gemms) {
    // Nothing but GEMMs changes precision: float32's results bit for bit.
    check_loss("loss without GEMMs", r.loss, ref.loss, 0);
    check_close("gradients without GEMMs", r.grads, ref.grads, 0);
    return;
  }
  check_loss("bf16 loss vs float32", r.loss, ref.loss, kBf16Tol);
  check_close("bf16 gradients vs float32", r.grads, ref.grads, kBf16Tol);
  BOOST_TEST(diff(r.grads, ref.grads).abs > 0.0, "autocast changed nothing: no bfloat16 GEMM ran");
  BOOST_TEST_MESSAGE(p.model.name << " bf16 autocast vs float32: loss " << std::abs(r.loss - ref.loss) / ref.loss
                                  << ", gradients " << diff(r.grads, ref.grads).rel() << " (relative)");
}

void anomaly_run(const Pair& p) {
  const Result r = run(p.model, {.anomaly = true}, Mode::grads);
  const Result& ref = plain(p.model, DType::f64, kBatch, Mode::grads);
  check_loss("loss under anomaly detection", r.loss, ref.loss, 0);
  check_close("gradients under anomaly detection", r.grads, ref.grads, 0);
}

void checkpoint_run(const Pair& p) {
  const Result r = run(p.model, {.checkpoint = *p.option}, Mode::grads);
  const Result& ref = plain(p.model, DType::f64, kBatch, Mode::grads);
  check_loss("checkpointed loss", r.loss, ref.loss, 0);
  check_close("checkpointed gradients", r.grads, ref.grads, kTol);
}

void threads_run(const Pair& p) {
  const Result r = run(p.model, {.threads = 2, .batch = kThreadBatch}, Mode::grads);
  const Result& ref = plain(p.model, DType::f64, kThreadBatch, Mode::grads);
  check_loss("loss at 2 threads", r.loss, ref.loss, kTol);
  check_close("gradients at 2 threads", r.grads, ref.grads, kTol);
  BOOST_TEST_MESSAGE(p.model.name << " at 2 threads vs 1: loss " << std::abs(r.loss - ref.loss) << ", gradients "
                                  << diff(r.grads, ref.grads).rel() << " (relative)");
}

void checkpoint_hvp_threads_run(const Pair& p) {
  const Result r = run(p.model, {.checkpoint = *p.option, .threads = 2, .batch = kThreadBatch}, Mode::hvp);
  check_loss("loss", r.loss, plain(p.model, DType::f64, kThreadBatch, Mode::grads).loss, kTol);
  check_close("gradients", r.grads, plain(p.model, DType::f64, kThreadBatch, Mode::grads).grads, kTol);
  check_close("H v vs plain reverse over reverse at 1 thread", r.hv,
              plain(p.model, DType::f64, kThreadBatch, Mode::create_graph).hv, kTol);
}

void autocast_checkpoint_anomaly_run(const Pair& p) {
  const Result r = run(p.model, {.dtype = DType::f32, .checkpoint = *p.option, .anomaly = true, .autocast = true},
                       Mode::grads);
  // Against autocast alone: a checkpoint reruns in the forward's precision
  // and anomaly detection changes nothing, so a rerun of the whole loss is
  // bit-identical; a model's own option may compute differently (GPT's MLP
  // rows in chunks, lstm_recompute's gates rebuilt by other GEMMs), which in
  // bfloat16 moves the results by bfloat16's tolerance. And against float32
  // within bfloat16's tolerance.
  const Result ac = run(p.model, {.dtype = DType::f32, .autocast = true}, Mode::grads);
  const Result& f32 = plain(p.model, DType::f32, kBatch, Mode::grads);
  const double tol = p.option->whole ? 0 : kBf16Tol;  // a whole loss rerun: the same ops, bit for bit
  check_loss("loss vs autocast alone", r.loss, ac.loss, tol);
  check_close("gradients vs autocast alone", r.grads, ac.grads, tol);
  check_loss("loss vs float32", r.loss, f32.loss, kBf16Tol);
  check_close("gradients vs float32", r.grads, f32.grads, kBf16Tol);
}

const std::vector<Feature>& feature_table() {
  static const std::vector<Feature> table{
      {"plain", false, plain_run},
      {"create_graph", false, create_graph_run},
      {"jvp", false, jvp_run},
      {"hvp", false, hvp_run},
      {"autocast_bf16", false, autocast_run},
      {"anomaly", false, anomaly_run},
      {"checkpoint", true, checkpoint_run},
      {"threads_2", false, threads_run},
      {"checkpoint+hvp+threads_2", true, checkpoint_hvp_threads_run},
      {"autocast_bf16+checkpoint+anomaly", true, autocast_checkpoint_anomaly_run},
  };
  return table;
}

// ---------------------------------------------------------------- pairs left out

// The pairs of a feature: one per model, or one per checkpoint option of each.
std::vector<Pair> pairs_of(const Feature& f) {
  static std::map<std::string, std::vector<CheckpointOption>> options;  // stable addresses
  std::vector<Pair> pairs;
  for (const Model& m : model_table()) {
    if (!f.per_checkpoint_option) {
      pairs.push_back({m, nullptr});
      continue;
    }
    auto it = options.try_emplace(m.name, checkpoint_options(m)).first;
    for (const CheckpointOption& o : it->second) pairs.push_back({m, &o});
  }
  return pairs;
}

int pairs_run = 0;

void run_feature(const std::string& name) {
  const Feature* feature = nullptr;
  for (const Feature& f : feature_table())
    if (f.name == name) feature = &f;
  BOOST_REQUIRE_MESSAGE(feature, "no feature " << name);
  for (const Pair& p : pairs_of(*feature)) {
    const std::string label =
        "feature " + feature->name + (p.option ? " [" + p.option->name + "]" : "") + ", model " + p.model.name;
    BOOST_TEST_CONTEXT(label) {
      try {
        feature->check(p);
      } catch (const std::exception& e) {
        BOOST_ERROR("threw: " << e.what());
      }
    }
    ++pairs_run;
  }
}

struct OneThread {
  // The plain runs are at 1 thread whatever the machine's default.
  OneThread() { set_num_threads(1); }
};
BOOST_TEST_GLOBAL_FIXTURE(OneThread);

}  // namespace

// One test case per feature (meson test feature_matrix --test-args
// --run_test=hvp_pairs runs one row).
BOOST_AUTO_TEST_CASE(plain_pairs) { run_feature("plain"); }
BOOST_AUTO_TEST_CASE(create_graph_pairs) { run_feature("create_graph"); }
BOOST_AUTO_TEST_CASE(jvp_pairs) { run_feature("jvp"); }
BOOST_AUTO_TEST_CASE(hvp_pairs) { run_feature("hvp"); }
BOOST_AUTO_TEST_CASE(autocast_bf16_pairs) { run_feature("autocast_bf16"); }
BOOST_AUTO_TEST_CASE(anomaly_pairs) { run_feature("anomaly"); }
BOOST_AUTO_TEST_CASE(checkpoint_pairs) { run_feature("checkpoint"); }
BOOST_AUTO_TEST_CASE(threads_2_pairs) { run_feature("threads_2"); }
BOOST_AUTO_TEST_CASE(checkpoint_hvp_threads_2_pairs) { run_feature("checkpoint+hvp+threads_2"); }
BOOST_AUTO_TEST_CASE(autocast_bf16_checkpoint_anomaly_pairs) { run_feature("autocast_bf16+checkpoint+anomaly"); }

// The matrix's size, as doc/testing.md gives it.
BOOST_AUTO_TEST_CASE(pair_count) {
  size_t total = 0;
  for (const Feature& f : feature_table()) {
    const size_t n = pairs_of(f).size();
    BOOST_TEST_MESSAGE("feature " << f.name << ": " << n << " pairs");
    total += n;
  }
  BOOST_TEST_MESSAGE("feature matrix: " << total << " (feature, model) pairs over " << feature_table().size()
                                        << " features and " << model_table().size() << " models; " << pairs_run
                                        << " ran in this process; none is forbidden");
  BOOST_TEST(total == 91u);
}
