// nn layers: PyTorch parity (tests/fixtures/nn_layers.json, made by
// make_nn_layers.py) of Linear, LayerNorm, Embedding, MultiHeadAttention and
// the transformer layers; float64 gradchecks of every layer w.r.t. its inputs
// and each named parameter; the KV cache against the full forward; Module
// features; the initialisers against their formulas; error messages.
#define BOOST_TEST_MODULE nn_layers
#include <boost/test/unit_test.hpp>

#include <cmath>

#include "autograd/autograd.h"
#include "autograd/ops/samples.h"
#include "nn/attention.h"
#include "nn/embedding.h"
#include "nn/gradcheck_module.h"
#include "nn/init.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"
#include "nn/positional.h"
#include "nn/transformer.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
using json = nlohmann::json;
namespace init = nn::init;

namespace {

// The fixture's loss weights: P[i] = cos(0.37 i + 0.5), row-major.
Tensor probe(const Shape& shape, DType dtype) {
  std::vector<double> v(static_cast<size_t>(shape.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::cos(0.37 * static_cast<double>(i) + 0.5);
  return from_vector(v, shape).to(dtype);
}

nn::AttentionMask padding(const json& c, const char* key, bool causal) {
  nn::AttentionMask m{.causal = causal};
  if (c["inputs"].contains(key)) m.key_padding_mask = load_ids(c["inputs"][key]);
  return m;
}

nn::TransformerLayerOptions layer_options(nn::NormPosition norm) {
  return {.dim = 4, .heads = 2, .hidden_mult = 2, .activation = nn::Activation::gelu, .norm = norm};
}

// Runs one fixture case in dtype: forward, loss sum(out * P), backward, and
// compares outputs and gradients (inputs and parameters) with torch's.
double parity_case(const std::string& name, DType dtype, double tol) {
  const json& cases = fixture("tests/fixtures/nn_layers.json")["cases"];
  BOOST_TEST_REQUIRE(cases.contains(name), "nn_layers.json lacks case " << name);
  const json& c = cases[name];
  const json& in = c["inputs"];
  std::shared_ptr<nn::Module> m;
  std::map<std::string, Tensor> x;
  for (auto& [k, v] : in.items())
    if (k == "x" || k == "memory") x[k] = load(v, dtype).requires_grad_();
  BOOST_TEST_REQUIRE((x.count("x") == 1 || name == "embedding"), name << ": the fixture case has no input x");
  std::vector<Tensor> outs;
  if (name == "linear") {
    auto l = std::make_shared<nn::Linear>(nn::LinearOptions{.in = 4, .out = 3});
    load_params(*l, c["params"], dtype);
    outs = {l->forward(x["x"])};
    m = l;
  } else if (name == "layer_norm") {
    auto l = std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.dim = 5});
    load_params(*l, c["params"], dtype);
    outs = {l->forward(x["x"])};
    m = l;
  } else if (name == "embedding") {
    auto l = std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = 7, .dim = 4, .padding_idx = 2});
    load_params(*l, c["params"], dtype);
    outs = {l->forward(load_ids(in["ids"]))};
    m = l;
  } else if (name.starts_with("mha_")) {
    const bool cross = name == "mha_cross";
    auto l = std::make_shared<nn::MultiHeadAttention>(nn::MultiHeadAttentionOptions{.dim = 4, .heads = 2, .cross = cross});
    load_params(*l, c["params"], dtype);
    Tensor w;
    outs = {cross ? l->forward(x["x"], x["memory"], padding(c, "key_padding_mask", false), &w)
                  : l->forward(x["x"], padding(c, "key_padding_mask", name != "mha_self"), &w)};
    outs.push_back(w);
    m = l;
  } else if (name.starts_with("encoder_")) {
    const bool pre = name == "encoder_pre";
    auto l = std::make_shared<nn::TransformerEncoderLayer>(layer_options(pre ? nn::NormPosition::pre : nn::NormPosition::post));
    load_params(*l, c["params"], dtype);
    outs = {l->forward(x["x"], padding(c, "key_padding_mask", !pre))};
    m = l;
  } else {
    auto l = std::make_shared<nn::TransformerDecoderLayer>(
        layer_options(name == "decoder_pre" ? nn::NormPosition::pre : nn::NormPosition::post));
    load_params(*l, c["params"], dtype);
    outs = {l->forward(x["x"], x["memory"], {.causal = true}, padding(c, "memory_key_padding_mask", false))};
    m = l;
  }
  sum(mul(outs[0], probe(outs[0].shape(), dtype))).backward();

  const std::string tag = fmt::format("{} {}", name, dtype_name(dtype));
  Parity p{tol};
  BOOST_REQUIRE_EQUAL(outs.size(), c["outputs"].size());
  for (size_t k = 0; k < outs.size(); ++k) p.check(tag + (k ? " attention weights" : " output"), outs[k], load(c["outputs"][k]));
  for (auto& [k, t] : x) p.check(tag + " grad " + k, t.grad(), load(c["grads"][k]));
  for (auto& [pname, param] : m->named_parameters()) p.check(tag + " grad " + pname, param.grad(), load(c["grads"][pname]));
  BOOST_TEST_MESSAGE(tag << ": worst relative error vs torch " << p.worst);
  return p.worst;
}

void require_passed(const GradcheckReport& r, const std::string& what) {
  BOOST_TEST(r.passed, what << ":\n" << r.str());
  int checked = 0;
  for (auto& i : r.inputs) checked += i.checked;
  BOOST_TEST(checked > 0, what << ": nothing was checked");
}

Tensor padding_mask(const Shape& shape, const std::vector<int64_t>& v) { return from_vector(v, shape); }

}  // namespace

// ============================ PyTorch parity ============================
BOOST_AUTO_TEST_CASE(layers_match_torch_float64) {
  double worst = 0;
  for (const char* name : {"linear", "layer_norm", "embedding", "mha_self", "mha_causal", "mha_padding", "mha_cross",
                           "encoder_pre", "encoder_post", "decoder_pre", "decoder_post"})
    worst = std::max(worst, parity_case(name, DType::f64, 1e-10));
  BOOST_TEST_MESSAGE("nn layers, float64: worst relative error vs torch " << worst);
}

BOOST_AUTO_TEST_CASE(layers_match_torch_float32) {
  double worst = 0;
  for (const char* name : {"linear", "mha_padding", "encoder_pre", "decoder_post"})
    worst = std::max(worst, parity_case(name, DType::f32, 1e-5));
  BOOST_TEST_MESSAGE("nn layers, float32: worst relative error vs torch (float64) " << worst);
}

// ============================ gradchecks ============================
BOOST_AUTO_TEST_CASE(gradcheck_linear_layer_norm_embedding) {
  nn::Linear fc({.in = 3, .out = 2});
  require_passed(nn::gradcheck_module(fc, [&](auto& in) { return fc(in[0]); }, {samples::uniform({2, 4, 3}, 1)}), "Linear");
  nn::Linear nobias({.in = 3, .out = 2, .bias = false});
  require_passed(nn::gradcheck_module(nobias, [&](auto& in) { return nobias(in[0]); }, {samples::uniform({4, 3}, 2)}),
                 "Linear without bias");
  nn::LayerNorm ln({.dim = 5});
  init::normal_(ln.weight);
  init::normal_(ln.bias);
  require_passed(nn::gradcheck_module(ln, [&](auto& in) { return ln(in[0]); }, {samples::uniform({3, 5}, 3)}), "LayerNorm");
  nn::LayerNorm plain({.dim = 5, .elementwise_affine = false});
  BOOST_TEST(plain.named_parameters().empty());
  require_passed(nn::gradcheck_module(plain, [&](auto& in) { return plain(in[0]); }, {samples::uniform({2, 2, 5}, 3)}),
                 "LayerNorm without affine");
  // Repeated ids accumulate. (The padding row gets no gradient by design, as
  // torch: the parity test checks it; finite differences would not agree.)
  nn::Embedding emb({.num_embeddings = 6, .dim = 3, .padding_idx = 1});
  Tensor ids = from_vector(std::vector<int64_t>{0, 3, 5, 5, 2, 0}, {2, 3});
  require_passed(nn::gradcheck_module(emb, [&](auto& in) { return emb(in[0]); }, {ids}), "Embedding");
}

BOOST_AUTO_TEST_CASE(gradcheck_dropout_feedforward_positional) {
  Generator g(11);
  nn::Dropout drop({.p = 0.4, .generator = &g});
  // The same mask on every evaluation: reseed before each forward.
  require_passed(nn::gradcheck_module(drop, [&](auto& in) { g.manual_seed(11); return drop(in[0]); },
                                      {samples::uniform({4, 5}, 4)}),
                 "Dropout (training)");
  for (auto act : {nn::Activation::gelu, nn::Activation::gelu_tanh, nn::Activation::relu}) {
    nn::FeedForward ff({.dim = 3, .hidden_mult = 2, .activation = act});
    require_passed(nn::gradcheck_module(ff, [&](auto& in) { return ff(in[0]); }, {samples::away_from_zero({2, 3}, 5)}),
                   "FeedForward");
  }
  nn::LearnedPositionalEmbedding pos({.max_len = 6, .dim = 3});
  require_passed(nn::gradcheck_module(pos, [&](auto& in) { return add(in[0], pos.forward(3, 2)); },
                                      {samples::uniform({2, 3, 3}, 6)}),
                 "LearnedPositionalEmbedding");
}

BOOST_AUTO_TEST_CASE(gradcheck_attention) {
  Tensor pad = padding_mask({2, 4}, {0, 0, 0, 0, 0, 1, 0, 1});
  nn::MultiHeadAttention self({.dim = 4, .heads = 2});
  for (bool causal : {false, true})
    require_passed(nn::gradcheck_module(self, [&](auto& in) { return self.forward(in[0], {.causal = causal, .key_padding_mask = pad}); },
                                        {samples::uniform({2, 4, 4}, 7)}),
                   causal ? "MHA self, causal + padding" : "MHA self, padding");
  nn::MultiHeadAttention cross({.dim = 4, .heads = 2, .kdim = 3, .cross = true});
  require_passed(nn::gradcheck_module(cross, [&](auto& in) { return cross.forward(in[0], in[1], {.key_padding_mask = pad}); },
                                      {samples::uniform({2, 3, 4}, 8), samples::uniform({2, 4, 3}, 9)}),
                 "MHA cross, kdim 3, padding");
  nn::AdditiveAttention add_attn({.query_dim = 3, .key_dim = 2, .hidden = 4});
  require_passed(nn::gradcheck_module(add_attn,
                                      [&](auto& in) {
                                        auto o = add_attn.forward(in[0], in[1], pad);
                                        return concat({o.context.reshape({-1}), o.weights.reshape({-1})}, 0);
                                      },
                                      {samples::uniform({2, 3}, 10), samples::uniform({2, 4, 2}, 11)}),
                 "AdditiveAttention");
}

BOOST_AUTO_TEST_CASE(gradcheck_transformer_layers) {
  Tensor pad = padding_mask({2, 4}, {0, 0, 0, 1, 0, 0, 0, 0});
  for (auto norm : {nn::NormPosition::pre, nn::NormPosition::post}) {
    const char* tag = norm == nn::NormPosition::pre ? "pre-LN" : "post-LN";
    nn::TransformerEncoderLayer enc({.dim = 4, .heads = 2, .hidden_mult = 2, .norm = norm});
    require_passed(nn::gradcheck_module(enc, [&](auto& in) { return enc.forward(in[0], {.causal = true, .key_padding_mask = pad}); },
                                        {samples::uniform({2, 4, 4}, 12)}),
                   std::string("encoder ") + tag);
    nn::TransformerDecoderLayer dec({.dim = 4, .heads = 2, .hidden_mult = 2, .norm = norm});
    require_passed(nn::gradcheck_module(dec, [&](auto& in) { return dec.forward(in[0], in[1], {.causal = true}, {.key_padding_mask = pad}); },
                                        {samples::uniform({2, 3, 4}, 13), samples::uniform({2, 4, 4}, 14)}),
                   std::string("decoder ") + tag);
  }
}

// ============================ KV cache ============================
namespace {

// Runs step(x[:, a:b]) over chunks of the given sizes and concatenates along T.
template <class Step>
Tensor run_chunks(const Tensor& x, const std::vector<int64_t>& sizes, Step step) {
  std::vector<Tensor> outs;
  int64_t t = 0;
  for (int64_t n : sizes) {
    outs.push_back(step(x.narrow(1, t, n)));
    t += n;
  }
  BOOST_REQUIRE_EQUAL(t, x.size(1));
  return concat(outs, 1);
}

}  // namespace

BOOST_AUTO_TEST_CASE(kv_cache_matches_full_forward) {
  Generator g(21);
  Tensor x = randn({2, 6, 8}, DType::f64, &g), mem = randn({2, 5, 8}, DType::f64, &g);
  Tensor mem_pad = padding_mask({2, 5}, {0, 0, 0, 1, 1, 0, 0, 0, 0, 0});
  const std::vector<std::vector<int64_t>> schedules = {{1, 1, 1, 1, 1, 1}, {2, 3, 1}, {6}};
  for (auto norm : {nn::NormPosition::pre, nn::NormPosition::post}) {
    nn::TransformerEncoderLayer enc({.dim = 8, .heads = 2, .norm = norm});
    nn::TransformerDecoderLayer dec({.dim = 8, .heads = 2, .norm = norm});
    enc.to(DType::f64);
    dec.to(DType::f64);
    Tensor full_enc = enc.forward(x, {.causal = true});
    Tensor full_dec = dec.forward(x, mem, {.causal = true}, {.key_padding_mask = mem_pad});
    for (const auto& sizes : schedules) {
      nn::KVCache cache, self_cache, cross_cache;
      Tensor inc = run_chunks(x, sizes, [&](const Tensor& c) { return enc.forward_cached(c, cache); });
      BOOST_TEST(cache.length() == 6);
      BOOST_TEST(max_abs_diff(inc, full_enc) < 1e-12, "encoder, chunks of " << sizes.size());
      Tensor inc_dec = run_chunks(x, sizes, [&](const Tensor& c) {
        return dec.forward_cached(c, mem, self_cache, cross_cache, {.key_padding_mask = mem_pad});
      });
      BOOST_TEST(cross_cache.length() == 5);
      BOOST_TEST(max_abs_diff(inc_dec, full_dec) < 1e-12, "decoder, chunks of " << sizes.size());
    }
  }
  // Without the causal mask the full forward differs: the test can fail.
  nn::TransformerEncoderLayer enc({.dim = 8, .heads = 2});
  enc.to(DType::f64);
  nn::KVCache cache;
  Tensor inc = run_chunks(x, {3, 3}, [&](const Tensor& c) { return enc.forward_cached(c, cache); });
  BOOST_TEST(max_abs_diff(inc, enc.forward(x)) > 1e-3);
  cache.clear();
  BOOST_TEST(cache.length() == 0);
}

// ============================ module features ============================
namespace {

struct Tiny : nn::Module {
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::ModuleList<nn::TransformerEncoderLayer>> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  Tiny() : Module("Tiny") {
    wte = register_module("wte", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = 5, .dim = 4}));
    blocks = register_module("blocks", std::make_shared<nn::ModuleList<nn::TransformerEncoderLayer>>());
    for (int i = 0; i < 2; ++i)
      blocks->push_back(std::make_shared<nn::TransformerEncoderLayer>(
          nn::TransformerLayerOptions{.dim = 4, .heads = 2, .hidden_mult = 2, .dropout = 0.5}));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.dim = 4}));
  }
  Tensor forward(const Tensor& ids) {
    Tensor h = wte->forward(ids);
    for (auto& b : *blocks) h = b->forward(h, {.causal = true});
    return ln_f->forward(h);
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(module_names_counts_and_state) {
  Tiny m;
  auto named = m.named_parameters();
  // 12 per block (ln1, attn.qkv, attn.proj, ln2, mlp.fc, mlp.proj; weight and bias), in registration order.
  std::vector<std::string> names;
  for (auto& [n, p] : named) names.push_back(n);
  BOOST_REQUIRE_EQUAL(names.size(), 1u + 2 * 12 + 2);
  BOOST_TEST(names[0] == "wte.weight");
  BOOST_TEST(names[1] == "blocks.0.ln1.weight");
  BOOST_TEST(names[3] == "blocks.0.attn.qkv.weight");
  BOOST_TEST(names[6] == "blocks.0.attn.proj.bias");
  BOOST_TEST(names[12] == "blocks.0.mlp.proj.bias");
  BOOST_TEST(names[15] == "blocks.1.attn.qkv.weight");
  BOOST_TEST(names.back() == "ln_f.bias");
  // C = 4, hidden 8: ln 8 + qkv 60 + proj 20 + ln 8 + fc 40 + proj 36 = 172 per block.
  BOOST_TEST(m.num_parameters() == 5 * 4 + 2 * 172 + 8);
  BOOST_TEST(m.named_children().size() == 3u);
  BOOST_TEST(m.blocks->size() == 2u);

  // train/eval reach the innermost dropout.
  BOOST_TEST((*m.blocks)[1].attn->drop->is_training());
  m.eval();
  BOOST_TEST(!(*m.blocks)[1].attn->drop->is_training());
  BOOST_TEST(!(*m.blocks)[0].mlp->drop->is_training());
  Tensor ids = from_vector(std::vector<int64_t>{0, 3, 4, 1}, {1, 4});
  Tensor a = m.forward(ids), b = m.forward(ids);
  BOOST_TEST(max_abs_diff(a, b) == 0.0);  // eval: dropout is the identity
  m.train();
  BOOST_TEST((*m.blocks)[1].mlp->drop->is_training());

  // zero_grad drops every gradient.
  sum(m.forward(ids)).backward();
  BOOST_TEST(m.blocks->operator[](0).attn->qkv->weight.grad().defined());
  m.zero_grad();
  for (auto& [n, p] : m.named_parameters()) BOOST_TEST(!p.grad().defined(), n);

  // to(f64) converts in place: the handles the layers hold see float64.
  m.to(DType::f64);
  for (auto& [n, p] : m.named_parameters()) BOOST_TEST((p.dtype() == DType::f64), n);
  BOOST_TEST(((*m.blocks)[0].attn->qkv->weight.dtype() == DType::f64));
  BOOST_TEST((m.forward(ids).dtype() == DType::f64));
}

BOOST_AUTO_TEST_CASE(module_printout) {
  nn::Sequential seq({std::make_shared<nn::Linear>(nn::LinearOptions{.in = 3, .out = 2}),
                      std::make_shared<nn::LayerNorm>(nn::LayerNormOptions{.dim = 2}),
                      std::make_shared<nn::Dropout>(nn::DropoutOptions{.p = 0.25})});
  const std::string want =
      "Sequential(\n"
      "  (0): Linear(in=3, out=2, bias=true; weight (2,3), bias (2))\n"
      "  (1): LayerNorm(dim=2, eps=1e-05, elementwise_affine=true; weight (2), bias (2))\n"
      "  (2): Dropout(p=0.25)\n"
      ")";
  BOOST_TEST(seq.str() == want);
  nn::MultiHeadAttention mha({.dim = 4, .heads = 2, .cross = true});
  BOOST_TEST(mha.str().find("MultiHeadAttention(dim=4, heads=2, kdim=4, cross=true") == 0, mha.str());
  BOOST_TEST(mha.str().find("  (kv): Linear(in=4, out=8, bias=true; weight (8,4), bias (8))") != std::string::npos, mha.str());
  nn::SinusoidalPositionalEncoding pe({.max_len = 3, .dim = 2});
  BOOST_TEST(pe.str() == "SinusoidalPositionalEncoding(max_len=3, dim=2; pe (3,2) (buffer))");
}

BOOST_AUTO_TEST_CASE(sequential_chains_layers) {
  auto fc1 = std::make_shared<nn::Linear>(nn::LinearOptions{.in = 3, .out = 4});
  auto fc2 = std::make_shared<nn::Linear>(nn::LinearOptions{.in = 4, .out = 2});
  nn::Sequential seq({fc1});
  seq.push_back(fc2);
  BOOST_TEST(seq.size() == 2u);
  Tensor x = randn({5, 3});
  Tensor want = linear(linear(x, fc1->weight, fc1->bias), fc2->weight, fc2->bias);
  BOOST_TEST(max_abs_diff(seq(x), want) == 0.0);
  BOOST_TEST(&seq[1] == fc2.get());
  BOOST_TEST(seq.named_parameters()[2].first == "1.weight");
}

// ============================ layer behaviour ============================
BOOST_AUTO_TEST_CASE(embedding_padding_and_positional_values) {
  nn::Embedding emb({.num_embeddings = 6, .dim = 3, .padding_idx = 4});
  for (int c = 0; c < 3; ++c) BOOST_TEST(emb.weight.at({4, c}) == 0.0);
  BOOST_TEST(std::abs(emb.weight.at({0, 0})) > 0.0);

  nn::SinusoidalPositionalEncoding pe({.max_len = 10, .dim = 6});
  BOOST_TEST(pe.named_parameters().empty());
  BOOST_REQUIRE_EQUAL(pe.named_buffers().size(), 1u);
  Tensor rows = pe.forward(3, 5);  // positions 5, 6, 7
  BOOST_TEST((rows.shape() == Shape{3, 6}));
  for (int64_t p = 0; p < 3; ++p)
    for (int64_t i = 0; i < 3; ++i) {
      const double angle = static_cast<double>(p + 5) / std::pow(10000.0, 2.0 * static_cast<double>(i) / 6.0);
      BOOST_TEST(std::abs(rows.at({p, 2 * i}) - std::sin(angle)) < 1e-6);
      BOOST_TEST(std::abs(rows.at({p, 2 * i + 1}) - std::cos(angle)) < 1e-6);
    }
  nn::LearnedPositionalEmbedding lpe({.max_len = 8, .dim = 2});
  BOOST_TEST(lpe.forward(2, 3).at({1, 1}) == lpe.weight.at({4, 1}));
}

BOOST_AUTO_TEST_CASE(dropout_train_and_eval) {
  Generator g(5);
  nn::Dropout drop({.p = 0.5, .generator = &g});
  Tensor x = ones({2000});
  auto v = drop(x).to_vector<float>();
  int zeros = 0;
  for (float f : v) {
    BOOST_TEST((f == 0.f || f == 2.f));
    zeros += f == 0.f;
  }
  BOOST_TEST(std::abs(zeros / 2000.0 - 0.5) < 0.05);
  drop.eval();
  BOOST_TEST(max_abs_diff(drop(x), x) == 0.0);
}

BOOST_AUTO_TEST_CASE(mha_weights_and_additive_attention) {
  nn::MultiHeadAttention mha({.dim = 4, .heads = 2});
  Tensor x = randn({2, 3, 4});
  Tensor pad = padding_mask({2, 3}, {0, 0, 1, 0, 0, 0});
  Tensor w;
  mha.forward(x, {.causal = true, .key_padding_mask = pad}, &w);
  BOOST_REQUIRE(w.shape() == (Shape{2, 2, 3, 3}));
  for (int64_t h = 0; h < 2; ++h) {
    BOOST_TEST(w.at({0, h, 0, 1}) == 0.0);  // causal
    BOOST_TEST(w.at({0, h, 2, 2}) == 0.0);  // padding
    BOOST_TEST(std::abs(w.at({1, h, 2, 0}) + w.at({1, h, 2, 1}) + w.at({1, h, 2, 2}) - 1.0) < 1e-6);
  }

  nn::AdditiveAttention att({.query_dim = 3, .key_dim = 2, .hidden = 5});
  att.to(DType::f64);
  Tensor q = randn({2, 3}, DType::f64), k = randn({2, 4, 2}, DType::f64);
  Tensor kpad = padding_mask({2, 4}, {0, 0, 0, 1, 0, 0, 0, 0});
  auto o = att.forward(q, k, kpad);
  auto o2 = att.forward_projected(q, k, att.project_keys(k), kpad);
  BOOST_TEST(max_abs_diff(o.context, o2.context) == 0.0);
  BOOST_TEST(o.weights.at({0, 3}) == 0.0);
  // score_t = v^T tanh(W1 q + b + W2 k_t), recomputed by hand for batch 1.
  std::vector<double> e(4);
  double z = 0;
  for (int64_t t = 0; t < 4; ++t) {
    double s = 0;
    for (int64_t a = 0; a < 5; ++a) {
      double u = att.w_query->bias.at({a});
      for (int64_t i = 0; i < 3; ++i) u += att.w_query->weight.at({a, i}) * q.at({1, i});
      for (int64_t i = 0; i < 2; ++i) u += att.w_key->weight.at({a, i}) * k.at({1, t, i});
      s += att.v->weight.at({0, a}) * std::tanh(u);
    }
    e[t] = std::exp(s);
    z += e[t];
  }
  for (int64_t c = 0; c < 2; ++c) {
    double want = 0;
    for (int64_t t = 0; t < 4; ++t) want += e[t] / z * k.at({1, t, c});
    BOOST_TEST(std::abs(o.context.at({1, c}) - want) < 1e-12);
  }
}

// ============================ initialisers ============================
namespace {

struct Stats {
  double mean = 0, std = 0, min = 1e300, max = -1e300;
};

Stats stats(const Tensor& t) {
  auto v = t.to(DType::f64).contiguous().to_vector<double>();
  Stats s;
  for (double x : v) s.mean += x, s.min = std::min(s.min, x), s.max = std::max(s.max, x);
  s.mean /= static_cast<double>(v.size());
  for (double x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / static_cast<double>(v.size()));
  return s;
}

// A uniform U(-a, a) sample: inside the bounds, reaching near them, std a/sqrt(3).
void check_uniform(const Tensor& t, double a, const std::string& what) {
  Stats s = stats(t);
  BOOST_TEST(s.min >= -a, what);
  BOOST_TEST(s.max <= a, what);
  BOOST_TEST(s.max > 0.99 * a, what);
  BOOST_TEST(std::abs(s.mean) < 0.02 * a, what);
  BOOST_TEST(std::abs(s.std / (a / std::sqrt(3.0)) - 1) < 0.02, what << ": std " << s.std);
}

void check_normal(const Tensor& t, double mean, double sd, const std::string& what) {
  Stats s = stats(t);
  BOOST_TEST(std::abs(s.mean - mean) < 0.02 * sd, what << ": mean " << s.mean);
  BOOST_TEST(std::abs(s.std / sd - 1) < 0.02, what << ": std " << s.std);
}

// max |A - I| for A = M^T M (columns orthonormal) or M M^T.
double orthogonality_error(const Tensor& m, bool columns) {
  Tensor a = m.to(DType::f64);
  Tensor p = columns ? matmul(a.t(), a) : matmul(a, a.t());
  const int64_t n = p.size(0);
  double e = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) e = std::max(e, std::abs(p.at({i, j}) - (i == j ? 1.0 : 0.0)));
  return e;
}

}  // namespace

BOOST_AUTO_TEST_CASE(init_gains_and_fans) {
  BOOST_TEST(init::calculate_gain(init::Nonlinearity::linear) == 1.0);
  BOOST_TEST(init::calculate_gain(init::Nonlinearity::sigmoid) == 1.0);
  BOOST_TEST(init::calculate_gain(init::Nonlinearity::tanh) == 5.0 / 3.0);
  BOOST_TEST(init::calculate_gain(init::Nonlinearity::relu) == std::sqrt(2.0));
  BOOST_TEST(init::calculate_gain(init::Nonlinearity::leaky_relu, 0.2) == std::sqrt(2.0 / 1.04));
  auto [in, out] = init::fans(empty({6, 4, 3, 2}));
  BOOST_TEST(in == 4 * 6);
  BOOST_TEST(out == 6 * 6);
  BOOST_CHECK_EXCEPTION(init::fans(empty({5})), ValueError, says<ValueError>({"(5)", "2 dims"}));
}

BOOST_AUTO_TEST_CASE(init_distributions_follow_their_formulas) {
  Generator g(3);
  Tensor t = empty({300, 200});  // fan_in 200, fan_out 300
  init::uniform_(t, -0.5, 1.5, &g);
  Stats s = stats(t);
  BOOST_TEST(s.min >= -0.5);
  BOOST_TEST(s.max < 1.5);
  BOOST_TEST(std::abs(s.mean - 0.5) < 0.01);
  BOOST_TEST(std::abs(s.std - 2.0 / std::sqrt(12.0)) < 0.01);
  init::normal_(t, 2.0, 0.3, &g);
  check_normal(t, 2.0, 0.3, "normal_");
  init::xavier_uniform_(t, 2.0, &g);
  check_uniform(t, 2.0 * std::sqrt(6.0 / 500.0), "xavier_uniform_");
  init::xavier_normal_(t, 1.0, &g);
  check_normal(t, 0.0, std::sqrt(2.0 / 500.0), "xavier_normal_");
  init::kaiming_uniform_(t, 0.0, init::FanMode::fan_in, init::Nonlinearity::relu, &g);
  check_uniform(t, std::sqrt(2.0) * std::sqrt(3.0 / 200.0), "kaiming_uniform_ fan_in relu");
  init::kaiming_normal_(t, 0.0, init::FanMode::fan_out, init::Nonlinearity::relu, &g);
  check_normal(t, 0.0, std::sqrt(2.0) / std::sqrt(300.0), "kaiming_normal_ fan_out relu");
  init::kaiming_uniform_(t, std::sqrt(5.0), init::FanMode::fan_in, init::Nonlinearity::leaky_relu, &g);
  check_uniform(t, 1.0 / std::sqrt(200.0), "kaiming_uniform_ a = sqrt(5) (torch's Linear)");
  init::constant_(t, 0.25);
  BOOST_TEST(stats(t).min == 0.25);
  BOOST_TEST(stats(t).max == 0.25);
  init::ones_(t);
  BOOST_TEST(stats(t).mean == 1.0);
  init::zeros_(t);
  BOOST_TEST(stats(t).max == 0.0);

  // Same seed, same values; the layers' default init follows torch's formulas.
  Tensor a = empty({4, 4}), b = empty({4, 4});
  Generator g1(9), g2(9);
  init::normal_(a, 0, 1, &g1);
  init::normal_(b, 0, 1, &g2);
  BOOST_TEST(max_abs_diff(a, b) == 0.0);
  nn::Linear fc({.in = 400, .out = 300});
  check_uniform(fc.weight, 1.0 / 20.0, "Linear weight");
  nn::Embedding emb({.num_embeddings = 300, .dim = 200});
  check_normal(emb.weight, 0.0, 1.0, "Embedding weight");
  nn::LearnedPositionalEmbedding lpe({.max_len = 300, .dim = 200});
  check_normal(lpe.weight, 0.0, 0.02, "LearnedPositionalEmbedding weight");
}

BOOST_AUTO_TEST_CASE(init_orthogonal) {
  Generator g(4);
  Tensor tall = empty({50, 20}), wide = empty({20, 50}), square = empty({30, 30}, DType::f64), conv = empty({6, 2, 2, 2});
  init::orthogonal_(tall, 1.0, &g);
  BOOST_TEST(orthogonality_error(tall, true) < 1e-5);
  init::orthogonal_(wide, 1.0, &g);
  BOOST_TEST(orthogonality_error(wide, false) < 1e-5);
  init::orthogonal_(square, 1.0, &g);
  BOOST_TEST(orthogonality_error(square, true) < 1e-13);
  BOOST_TEST(orthogonality_error(square, false) < 1e-13);
  init::orthogonal_(conv, 1.0, &g);  // flattened to (6, 8)
  BOOST_TEST(orthogonality_error(conv.reshape({6, 8}), false) < 1e-5);
  init::orthogonal_(square, 2.5, &g);
  BOOST_TEST(orthogonality_error(mul(square, 1.0 / 2.5), true) < 1e-13);
  // Not the identity or a fixed matrix: two draws differ.
  Tensor again = empty({30, 30}, DType::f64);
  init::orthogonal_(again, 2.5, &g);
  BOOST_TEST(max_abs_diff(square, again) > 0.1);
  BOOST_CHECK_THROW(init::orthogonal_(empty({4}), 1.0, &g), ValueError);

  // Signs as torch (Q * sign(diag R)): with the Gaussian A drawn from the same
  // generator state, R = Q^T A is upper triangular with a positive diagonal.
  Generator g1(8), g2(8);
  Tensor q = empty({7, 4}, DType::f64);
  init::orthogonal_(q, 1.0, &g1);
  Tensor r = matmul(q.t(), randn({7, 4}, DType::f64, &g2));
  for (int64_t i = 0; i < 4; ++i) {
    BOOST_TEST(r.at({i, i}) > 0.0);
    for (int64_t j = 0; j < i; ++j) BOOST_TEST(std::abs(r.at({i, j})) < 1e-12);
  }
}

// ============================ errors ============================
BOOST_AUTO_TEST_CASE(error_messages_name_layer_and_shapes) {
  nn::Embedding emb({.num_embeddings = 7, .dim = 3});
  BOOST_CHECK_EXCEPTION(emb(from_vector(std::vector<int64_t>{1, 9, 2}, {3})), IndexError,
                        says<IndexError>({"Embedding", "id 9", "V = 7"}));
  BOOST_CHECK_EXCEPTION(emb(from_vector(std::vector<int64_t>{-1}, {1})), IndexError, says<IndexError>({"id -1", "7"}));
  BOOST_CHECK_THROW(emb(zeros({2})), DTypeError);
  BOOST_CHECK_THROW(nn::Embedding({.num_embeddings = 7, .dim = 3, .padding_idx = 7}), ValueError);

  BOOST_CHECK_EXCEPTION(nn::MultiHeadAttention({.dim = 10, .heads = 3}), ValueError,
                        says<ValueError>({"MultiHeadAttention", "10", "3"}));
  BOOST_CHECK_EXCEPTION(nn::TransformerEncoderLayer({.dim = 10, .heads = 4}), ValueError,
                        says<ValueError>({"TransformerEncoderLayer", "10", "4"}));

  nn::Linear fc({.in = 5, .out = 2});
  BOOST_CHECK_EXCEPTION(fc(zeros({4, 3})), ShapeError, says<ShapeError>({"Linear", "(4,3)", "3 features", "expected 5"}));
  nn::LayerNorm ln({.dim = 4});
  BOOST_CHECK_EXCEPTION(ln(zeros({2, 3})), ShapeError, says<ShapeError>({"LayerNorm", "(2,3)", "4"}));
  nn::FeedForward ff({.dim = 4});
  BOOST_CHECK_EXCEPTION(ff(zeros({2, 3})), ShapeError, says<ShapeError>({"FeedForward", "(2,3)"}));

  nn::MultiHeadAttention mha({.dim = 4, .heads = 2});
  BOOST_CHECK_EXCEPTION(mha.forward(zeros({2, 3, 5})), ShapeError, says<ShapeError>({"MultiHeadAttention", "(2,3,5)", "(B,T,4)"}));
  BOOST_CHECK_EXCEPTION(mha.forward(zeros({3, 4})), ShapeError, says<ShapeError>({"MultiHeadAttention", "(3,4)"}));
  BOOST_CHECK_EXCEPTION(mha.forward(zeros({2, 3, 4}), {.key_padding_mask = zeros({2, 4}, DType::i64)}), ShapeError,
                        says<ShapeError>({"key_padding_mask", "(2,4)", "(2,3)"}));
  BOOST_CHECK_THROW(mha.forward(zeros({2, 3, 4}), zeros({2, 3, 4})), ValueError);  // not built for cross
  nn::MultiHeadAttention cross({.dim = 4, .heads = 2, .kdim = 6, .cross = true});
  BOOST_CHECK_EXCEPTION(cross.forward(zeros({2, 3, 4}), zeros({2, 5, 4})), ShapeError,
                        says<ShapeError>({"memory", "(2,5,4)", "(B,T,6)"}));
  BOOST_CHECK_EXCEPTION(cross.forward(zeros({2, 3, 4}), zeros({1, 5, 6})), ShapeError,
                        says<ShapeError>({"(2,3,4)", "(1,5,6)", "batch"}));
  BOOST_CHECK_THROW(cross.forward(zeros({2, 3, 4})), ValueError);

  nn::AdditiveAttention att({.query_dim = 3, .key_dim = 2, .hidden = 4});
  BOOST_CHECK_EXCEPTION(att.forward(zeros({2, 4}), zeros({2, 5, 2})), ShapeError,
                        says<ShapeError>({"AdditiveAttention", "(2,4)", "(B,3)"}));
  BOOST_CHECK_EXCEPTION(att.forward(zeros({2, 3}), zeros({2, 5, 3})), ShapeError,
                        says<ShapeError>({"AdditiveAttention", "(2,5,3)"}));

  nn::SinusoidalPositionalEncoding pe({.max_len = 4, .dim = 2});
  BOOST_CHECK_EXCEPTION(pe.forward(3, 2), IndexError, says<IndexError>({"[2, 5)", "max_len = 4"}));
  nn::LearnedPositionalEmbedding lpe({.max_len = 4, .dim = 2});
  BOOST_CHECK_THROW(lpe.forward(5), IndexError);
  BOOST_CHECK_THROW(nn::Dropout({.p = 1.0}), ValueError);
  BOOST_CHECK_THROW(nn::Linear({.in = 0, .out = 2}), ValueError);
  nn::TransformerDecoderLayer dec({.dim = 4, .heads = 2});
  BOOST_CHECK_EXCEPTION(dec.forward(zeros({2, 3, 4}), zeros({2, 5, 3})), ShapeError,
                        says<ShapeError>({"TransformerDecoderLayer", "memory", "(2,5,3)"}));
}
