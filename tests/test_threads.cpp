// Work on several threads at once against the same work on one: attention
// split over the pool, and two models trained in two threads of one process,
// bit for bit. scripts/test.sh --tsan runs these under ThreadSanitizer.
#define BOOST_TEST_MODULE threads
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "autograd/autograd.h"
#include "models/gpt.h"
#include "models/rnn_lm.h"
#include "nn/nn.h"

using namespace tg;
using namespace tg::models;

namespace {

struct Threads {
  int saved = num_threads();
  ~Threads() { set_num_threads(saved); }
};

// Every parameter's values, in registration order.
std::vector<std::vector<float>> values(const nn::Module& m) {
  std::vector<std::vector<float>> out;
  for (const Tensor& p : m.parameters()) out.push_back(p.to_vector<float>());
  return out;
}

// Builds a model from seed (the generator is the calling thread's) and takes
// `steps` AdamW steps on a repeating sequence, inputs and targets (B,T) = (8,16).
std::vector<std::vector<float>> train(const std::function<std::unique_ptr<LanguageModel>()>& make, uint64_t seed,
                                      int steps) {
  std::vector<int64_t> seq;
  for (int i = 0; i < 8 * 16 + 1; ++i) seq.push_back(i * 7 % 11);
  Tensor x = from_vector(std::vector<int64_t>(seq.begin(), seq.end() - 1), {8, 16});
  Tensor y = from_vector(std::vector<int64_t>(seq.begin() + 1, seq.end()), {8, 16});
  manual_seed(seed);
  std::unique_ptr<LanguageModel> m = make();
  nn::AdamW opt(m->parameters(), {.lr = 1e-2});
  for (int s = 0; s < steps; ++s) {
    m->loss(x, y).backward();
    opt.step();
    opt.zero_grad();
  }
  return values(*m);
}

}  // namespace

// A GPT (attention, layer norm, embeddings) and an LSTM language model, each
// trained in its own thread while the other trains, end with the weights of
// training them one after the other. Both threads call the kernels' pool:
// whichever finds it busy runs its chunks inline, which must not change a bit.
BOOST_AUTO_TEST_CASE(two_models_trained_in_two_threads_match_training_one_after_the_other) {
  Threads restore;
  set_num_threads(2);
  auto gpt = [] {
    return std::make_unique<GPT>(GPTOptions{.vocab = 11, .block = 16, .layers = 1, .heads = 4, .dim = 32});
  };
  auto lstm = [] {
    return std::make_unique<RNNLM>(RNNLMOptions{.vocab = 11, .embed = 16, .hidden = 64, .cell = CellKind::lstm});
  };
  const int steps = 8;
  const auto gpt_alone = train(gpt, 1, steps), lstm_alone = train(lstm, 2, steps);

  std::vector<std::vector<float>> gpt_beside, lstm_beside;
  std::exception_ptr errors[2];
  std::thread a([&] {
    try {
      gpt_beside = train(gpt, 1, steps);
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  std::thread b([&] {
    try {
      lstm_beside = train(lstm, 2, steps);
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  a.join();
  b.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  BOOST_TEST(gpt_beside.size() == gpt_alone.size());
  BOOST_TEST((gpt_beside == gpt_alone), "GPT trained beside the LSTM differs from GPT trained alone");
  BOOST_TEST((lstm_beside == lstm_alone), "LSTM trained beside GPT differs from the LSTM trained alone");
  // Training moved the weights: the comparison is not between two initialisations.
  manual_seed(1);
  BOOST_TEST((values(*gpt()) != gpt_alone));
}

// Attention's heads (B*H = 8 of (T,D) = (32,16), above the grain of 2) split
// over 1, 2 and 3 threads: the same output and gradients, bit for bit.
BOOST_AUTO_TEST_CASE(attention_split_over_the_pool_matches_one_thread) {
  Threads restore;
  Generator gen(5);
  Tensor q = randn({2, 4, 32, 16}, DType::f32, &gen).requires_grad_();
  Tensor k = randn({2, 4, 32, 16}, DType::f32, &gen).requires_grad_();
  Tensor v = randn({2, 4, 32, 16}, DType::f32, &gen).requires_grad_();
  Tensor w = randn({2, 4, 32, 16}, DType::f32, &gen);
  auto run = [&](int threads) {
    set_num_threads(threads);
    for (const Tensor* t : {&q, &k, &v}) t->zero_grad();
    Tensor out = scaled_dot_product_attention(q, k, v, /*causal=*/true);
    sum(mul(out, w)).backward();
    return std::vector<std::vector<float>>{out.to_vector<float>(), q.grad().to_vector<float>(),
                                           k.grad().to_vector<float>(), v.grad().to_vector<float>()};
  };
  const auto one = run(1);
  for (int threads : {2, 3}) BOOST_TEST((run(threads) == one), "attention at " << threads << " threads");
}

// The fused recurrences split over the pool (T = 8 steps, B = 8 rows, H = 256
// units). They split the hidden units, with a barrier between steps: 2 parts
// of 128 units at 2 threads; at 3, 3 parts (80, 80, 96) for the LSTM and the
// GRU, still 2 for the RNN (a part needs 2^18 multiply-adds a step). The
// outputs and the gradients of the inputs, the weights and the initial states
// are those of one thread, up to rounding. OpenBLAS picks its kernel by the
// GEMM's size, so a step's GEMM on a part may round differently from the same
// products in the whole GEMM (by a few ulp): float64, to 1e-12 of each
// tensor's largest value. A part given the wrong units or rows is off by O(1).
BOOST_AUTO_TEST_CASE(recurrences_split_over_the_pool_match_one_thread) {
  Threads restore;
  const int64_t T = 8, B = 8, H = 256;
  for (int gates : {1, 4, 3}) {
    Generator gen(11 + gates);
    Tensor xp = randn({T, B, gates * H}, DType::f64, &gen).requires_grad_();
    Tensor w = mul(randn({gates * H, H}, DType::f64, &gen), 0.1).detach().requires_grad_();
    Tensor b = randn({gates * H}, DType::f64, &gen).requires_grad_();
    Tensor h0 = randn({B, H}, DType::f64, &gen).requires_grad_();
    Tensor c0 = randn({B, H}, DType::f64, &gen).requires_grad_();
    Tensor weights = randn({gates == 4 ? 2 : 1, T, B, H}, DType::f64, &gen);
    const std::vector<Tensor*> inputs = gates == 1 ? std::vector<Tensor*>{&xp, &w, &h0}
                                        : gates == 4 ? std::vector<Tensor*>{&xp, &w, &h0, &c0}
                                                     : std::vector<Tensor*>{&xp, &w, &b, &h0};
    auto run = [&](int threads) {
      set_num_threads(threads);
      for (const Tensor* t : inputs) t->zero_grad();
      Tensor out = gates == 1 ? rnn_tanh_recurrence(xp, w, h0)
                   : gates == 4 ? lstm_recurrence(xp, w, h0, c0)
                                : gru_recurrence(xp, w, b, h0);
      sum(mul(out, reshape(weights, out.shape()))).backward();
      std::vector<std::vector<double>> got{out.to_vector<double>()};
      for (const Tensor* t : inputs) got.push_back(t->grad().to_vector<double>());
      return got;
    };
    const auto one = run(1);
    for (int threads : {2, 3}) {
      const auto got = run(threads);
      for (size_t i = 0; i < got.size(); ++i) {
        double worst = 0, scale = 0;
        for (size_t j = 0; j < got[i].size(); ++j)
          worst = std::max(worst, std::abs(got[i][j] - one[i][j])), scale = std::max(scale, std::abs(one[i][j]));
        BOOST_TEST(worst <= 1e-12 * scale, "gates " << gates << " at " << threads << " threads, tensor " << i
                                                     << ": off by " << worst << " of " << scale);
      }
    }
  }
}

// gemm() splits a GEMM of 2^18 multiply-adds or more over the pool: by rows
// of C (256 x 48 from K = 64), or by columns when C has fewer rows (20 x 300
// from K = 128), or by K where the sum is long (48 x 40 from K = 2048, 3
// parts of K at 3 threads, 2 at 2: a scratch C per part after the first)
// or where C is narrow and A stored transposed (256 x 32 from K = 512 by K,
// by rows when A is not), with either operand stored transposed; at 7
// threads too, where parts start at multiples of 16 rows (200 x 40) or 64
// of K (40 x 48 from K = 2000) and the last is ragged. Each part is one OpenBLAS call on
// its rows, columns or span of K: the products of one thread, to rounding
// (OpenBLAS picks its kernel by size; K's parts add in another order), in
// float64 to 1e-12. A part given the wrong rows or span is off by O(1).
BOOST_AUTO_TEST_CASE(gemm_split_over_the_pool_matches_one_thread) {
  Threads restore;
  struct Case {
    int64_t M, K, N;
  };
  for (const Case c : {Case{256, 64, 48}, Case{20, 128, 300}, Case{48, 2048, 40}, Case{256, 512, 32},
                       Case{200, 64, 40}, Case{40, 2000, 48}}) {
    for (const bool ta : {false, true}) {
      for (const bool tb : {false, true}) {
        Generator gen(7);
        Tensor a = randn(ta ? Shape{c.K, c.M} : Shape{c.M, c.K}, DType::f64, &gen);
        Tensor b = randn(tb ? Shape{c.N, c.K} : Shape{c.K, c.N}, DType::f64, &gen);
        auto product = [&](int threads) {
          set_num_threads(threads);
          return matmul(ta ? transpose(a, 0, 1) : a, tb ? transpose(b, 0, 1) : b).to_vector<double>();
        };
        const auto one = product(1);
        BOOST_REQUIRE(one.size() == static_cast<size_t>(c.M * c.N));
        for (int threads : {2, 3, 7}) {
          const auto got = product(threads);
          double worst = 0, scale = 0;
          for (size_t j = 0; j < got.size(); ++j)
            worst = std::max(worst, std::abs(got[j] - one[j])), scale = std::max(scale, std::abs(one[j]));
          BOOST_TEST(worst <= 1e-12 * scale, c.M << "x" << c.K << "x" << c.N << " ta " << ta << " tb " << tb << " at "
                                                 << threads << " threads: off by " << worst << " of " << scale);
        }
      }
    }
  }
}
