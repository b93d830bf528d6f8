// Google Benchmark of the NN primitives at the shapes of the training workloads
// (bench/workloads.h; float32), forward alone and forward + backward: matmul
// ((2048,128) x (128,512) and batched (128,64,32) x (128,32,64), GFLOP/s),
// softmax, layer_norm, cross_entropy (a character vocabulary V=85 and a
// GPT-2-sized V=50257 at a small batch), scaled dot-product attention (B=32,
// H=4, T=64, D=32), embedding (2048 ids, C=128, V=85 and 50257), the LSTM cell
// (B=32, E=64, H=256, one step) and the fused LSTM recurrence over T=64 steps.
// Each benchmark validates its result, and with backward its gradients, against
// a plain double-precision loop before timing (the LSTM recurrence's gradients
// against a float64 run of the same op); SkipWithError on a mismatch.
//
//   build/bench/bench_nn_ops                         # threads: TAPEGRAD_NUM_THREADS or all cores
//   TAPEGRAD_NUM_THREADS=1 build/bench/bench_nn_ops --benchmark_filter=attention
#include <benchmark/benchmark.h>

#include <cmath>

#include "autograd/autograd.h"
#include "autograd/ops/rnn_ops.h"
#include "nn/rnn.h"

using namespace tg;

namespace {

// max |a - b| / max |b| over two tensors (any dtype).
double rel_error(const Tensor& a, const std::vector<double>& b) {
  auto x = a.to(DType::f64).contiguous().to_vector<double>();
  double diff = 0, scale = 1e-300;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

bool check(benchmark::State& state, double err, double tol, const char* what) {
  if (err < tol && std::isfinite(err)) return true;
  state.SkipWithError(what);
  return false;
}

std::vector<double> host(const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); }

// --- reference loops (double precision)
std::vector<double> ref_softmax(const std::vector<double>& x, int64_t R, int64_t C) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[r * C + c] - m);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = std::exp(x[r * C + c] - m) / s;
  }
  return y;
}

std::vector<double> ref_layer_norm(const std::vector<double>& x, const std::vector<double>& w,
                                   const std::vector<double>& b, int64_t R, int64_t C) {
  std::vector<double> y(x.size());
  for (int64_t r = 0; r < R; ++r) {
    double mu = 0, var = 0;
    for (int64_t c = 0; c < C; ++c) mu += x[r * C + c] / C;
    for (int64_t c = 0; c < C; ++c) var += (x[r * C + c] - mu) * (x[r * C + c] - mu) / C;
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = (x[r * C + c] - mu) / std::sqrt(var + 1e-5) * w[c] + b[c];
  }
  return y;
}

double ref_cross_entropy(const std::vector<double>& x, const std::vector<int64_t>& t, int64_t R, int64_t C) {
  double total = 0;
  for (int64_t r = 0; r < R; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, x[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(x[r * C + c] - m);
    total += m + std::log(s) - x[r * C + t[r]];
  }
  return total / R;
}

// C (M,N) = op(A) op(B) for each of `batch` matrices, op(A) (M,K) stored
// (K,M) when ta, op(B) (K,N) stored (N,K) when tb. Only rows r of the
// flattened (batch*M, N) result with r % stride == 0 are computed.
std::vector<double> ref_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t batch,
                               int64_t M, int64_t K, int64_t N, bool ta, bool tb, int64_t stride = 1) {
  std::vector<double> c(batch * M * N, 0.0);
  for (int64_t n = 0; n < batch; ++n) {
    const double* A = a.data() + n * M * K;
    const double* B = b.data() + n * K * N;
    for (int64_t i = 0; i < M; ++i) {
      if ((n * M + i) % stride != 0) continue;
      for (int64_t k = 0; k < K; ++k) {
        const double aik = ta ? A[k * M + i] : A[i * K + k];
        for (int64_t j = 0; j < N; ++j) c[(n * M + i) * N + j] += aik * (tb ? B[j * K + k] : B[k * N + j]);
      }
    }
  }
  return c;
}

// rel_error over the rows r % stride == 0 of a (rows, N) result.
double rel_error_rows(const Tensor& a, const std::vector<double>& b, int64_t N, int64_t stride) {
  auto x = host(a);
  double diff = 0, scale = 1e-300;
  for (size_t i = 0; i < x.size(); ++i) {
    if ((static_cast<int64_t>(i) / N) % stride != 0) continue;
    diff = std::max(diff, std::abs(x[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// One LSTM cell step and its backward for the upstream gradient gh of h' alone.
struct LSTMCellRef {
  std::vector<double> h, dx, dh, dc, dw_hh, db;
};
LSTMCellRef ref_lstm_cell(const std::vector<double>& x, const std::vector<double>& h, const std::vector<double>& c,
                          const std::vector<double>& w_ih, const std::vector<double>& w_hh,
                          const std::vector<double>& b_ih, const std::vector<double>& b_hh,
                          const std::vector<double>& gh, int64_t B, int64_t E, int64_t H) {
  // Pre-activations a (B,4H), gates i, f, g, o.
  std::vector<double> a = ref_matmul(x, w_ih, 1, B, E, 4 * H, false, true);
  std::vector<double> ah = ref_matmul(h, w_hh, 1, B, H, 4 * H, false, true);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t k = 0; k < 4 * H; ++k) a[r * 4 * H + k] += ah[r * 4 * H + k] + b_ih[k] + b_hh[k];
  LSTMCellRef out;
  out.h.resize(B * H), out.dc.resize(B * H), out.db.assign(4 * H, 0.0);
  std::vector<double> da(B * 4 * H);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t j = 0; j < H; ++j) {
      const double* ar = &a[r * 4 * H];
      const double i = sigmoid(ar[j]), f = sigmoid(ar[H + j]), g = std::tanh(ar[2 * H + j]), o = sigmoid(ar[3 * H + j]);
      const double cn = f * c[r * H + j] + i * g, tc = std::tanh(cn), ghj = gh[r * H + j];
      out.h[r * H + j] = o * tc;
      const double dcn = ghj * o * (1 - tc * tc);
      out.dc[r * H + j] = dcn * f;
      double* dar = &da[r * 4 * H];
      dar[j] = dcn * g * i * (1 - i);
      dar[H + j] = dcn * c[r * H + j] * f * (1 - f);
      dar[2 * H + j] = dcn * i * (1 - g * g);
      dar[3 * H + j] = ghj * tc * o * (1 - o);
    }
  out.dx = ref_matmul(da, w_ih, 1, B, 4 * H, E, false, false);
  out.dh = ref_matmul(da, w_hh, 1, B, 4 * H, H, false, false);
  out.dw_hh = ref_matmul(da, h, 1, 4 * H, B, H, true, false);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t k = 0; k < 4 * H; ++k) out.db[k] += da[r * 4 * H + k];
  return out;
}

// Causal attention of head (0,0), (T,D) each.
std::vector<double> ref_attention_head(const std::vector<double>& q, const std::vector<double>& k,
                                       const std::vector<double>& v, int64_t T, int64_t D) {
  std::vector<double> out(T * D, 0.0), p(T);
  for (int64_t i = 0; i < T; ++i) {
    double m = -INFINITY, s = 0;
    for (int64_t j = 0; j <= i; ++j) {
      double dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += q[i * D + d] * k[j * D + d];
      p[j] = dot / std::sqrt(static_cast<double>(D));
      m = std::max(m, p[j]);
    }
    for (int64_t j = 0; j <= i; ++j) s += p[j] = std::exp(p[j] - m);
    for (int64_t j = 0; j <= i; ++j)
      for (int64_t d = 0; d < D; ++d) out[i * D + d] += p[j] / s * v[j * D + d];
  }
  return out;
}

// ============================ matmul ============================
// a (batch,M,K) @ b (batch,K,N); plain 2-D (M,K) @ (K,N) when batch = 1.
void BM_matmul(benchmark::State& state, bool backward) {
  const int64_t batch = state.range(0), M = state.range(1), K = state.range(2), N = state.range(3);
  const Shape sa = batch == 1 ? Shape{M, K} : Shape{batch, M, K}, sb = batch == 1 ? Shape{K, N} : Shape{batch, K, N};
  const Shape sc = batch == 1 ? Shape{M, N} : Shape{batch, M, N};
  Generator gen(6);
  Tensor a = randn(sa, DType::f32, &gen).requires_grad_(backward), b = randn(sb, DType::f32, &gen).requires_grad_(backward);
  Tensor g = randn(sc, DType::f32, &gen);
  {
    // The reference checks every 16th row of the large 2-D products, all rows of the batched ones.
    const int64_t stride = batch == 1 ? 16 : 1;
    auto av = host(a), bv = host(b), gv = host(g);
    Tensor c = matmul(a, b);
    if (!check(state, rel_error_rows(c, ref_matmul(av, bv, batch, M, K, N, false, false, stride), N, stride), 1e-5,
               "matmul differs from the reference"))
      return;
    if (backward) {
      c.backward(g);  // da = g b^T, db = a^T g
      if (!check(state, rel_error_rows(a.grad(), ref_matmul(gv, bv, batch, M, N, K, false, true, stride), K, stride),
                 1e-5, "matmul gradient of a differs from the reference") ||
          !check(state, rel_error_rows(b.grad(), ref_matmul(av, gv, batch, K, M, N, true, false, stride), N, stride),
                 1e-5, "matmul gradient of b differs from the reference"))
        return;
    }
  }
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    if (backward) {
      a.zero_grad(), b.zero_grad();
      c.backward(g);
    }
    benchmark::DoNotOptimize(c.impl());
  }
  const double flops = (backward ? 3.0 : 1.0) * 2.0 * batch * M * K * N;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_matmul, forward, false)->Args({1, 2048, 128, 512})->Args({128, 64, 32, 64})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_matmul, fwd_bwd, true)->Args({1, 2048, 128, 512})->Args({128, 64, 32, 64})
    ->Unit(benchmark::kMicrosecond);

// ============================ softmax ============================
void BM_softmax(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  Generator gen(1);
  Tensor x = randn({R, C}, DType::f32, &gen, 0.0, 3.0);
  if (!check(state, rel_error(softmax(x), ref_softmax(host(x), R, C)), 1e-5, "softmax differs from the reference"))
    return;
  for (auto _ : state) benchmark::DoNotOptimize(softmax(x).impl());
  state.SetBytesProcessed(state.iterations() * R * C * 8);
}
BENCHMARK(BM_softmax)->Args({2048, 85})->Args({2048, 256})->Args({8, 50257})->Unit(benchmark::kMicrosecond);

void BM_softmax_fwd_bwd(benchmark::State& state) {
  const int64_t R = state.range(0), C = state.range(1);
  Generator gen(2);
  Tensor x = randn({R, C}, DType::f32, &gen, 0.0, 3.0).requires_grad_();
  Tensor g = randn({R, C}, DType::f32, &gen);
  {  // d/dx sum(softmax(x) * g) = y * (g - sum(g y))
    Tensor y = softmax(x);
    y.backward(g);
    auto yv = host(y), gv = host(g);
    std::vector<double> want(yv.size());
    for (int64_t r = 0; r < R; ++r) {
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += gv[r * C + c] * yv[r * C + c];
      for (int64_t c = 0; c < C; ++c) want[r * C + c] = yv[r * C + c] * (gv[r * C + c] - s);
    }
    if (!check(state, rel_error(x.grad(), want), 1e-4, "softmax gradient differs from the reference")) return;
  }
  for (auto _ : state) {
    x.zero_grad();
    softmax(x).backward(g);
    benchmark::DoNotOptimize(x.grad().impl());
  }
}
BENCHMARK(BM_softmax_fwd_bwd)->Args({2048, 85})->Args({8, 50257})->Unit(benchmark::kMicrosecond);

// ============================ layer_norm ============================
void BM_layer_norm(benchmark::State& state, bool backward) {
  const int64_t R = state.range(0), C = state.range(1);
  Generator gen(3);
  Tensor x = randn({R, C}, DType::f32, &gen, 1.0, 2.0).requires_grad_(backward);
  Tensor w = randn({C}, DType::f32, &gen).requires_grad_(backward), b = randn({C}, DType::f32, &gen).requires_grad_(backward);
  if (!check(state, rel_error(layer_norm(x, w, b), ref_layer_norm(host(x), host(w), host(b), R, C)), 1e-5,
             "layer_norm differs from the reference"))
    return;
  Tensor g = randn({R, C}, DType::f32, &gen);
  for (auto _ : state) {
    Tensor y = layer_norm(x, w, b);
    if (backward) {
      x.zero_grad(), w.zero_grad(), b.zero_grad();
      y.backward(g);
    }
    benchmark::DoNotOptimize(y.impl());
  }
  state.SetBytesProcessed(state.iterations() * R * C * 8);
}
BENCHMARK_CAPTURE(BM_layer_norm, forward, false)->Args({2048, 128})->Args({2048, 768})->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_layer_norm, fwd_bwd, true)->Args({2048, 128})->Args({2048, 768})->Unit(benchmark::kMicrosecond);

// ============================ cross_entropy ============================
void BM_cross_entropy(benchmark::State& state, bool backward) {
  const int64_t R = state.range(0), V = state.range(1);
  Generator gen(4);
  Tensor x = randn({R, V}, DType::f32, &gen, 0.0, 2.0).requires_grad_(backward);
  Tensor t = randint(0, V, {R}, &gen);
  const double want = ref_cross_entropy(host(x), t.to_vector<int64_t>(), R, V);
  if (!check(state, std::abs(cross_entropy(x, t).item() - want) / want, 1e-5, "cross_entropy differs from the reference"))
    return;
  for (auto _ : state) {
    Tensor loss = cross_entropy(x, t);
    if (backward) {
      x.zero_grad();
      loss.backward();
    }
    benchmark::DoNotOptimize(loss.impl());
  }
  state.SetItemsProcessed(state.iterations() * R);
}
BENCHMARK_CAPTURE(BM_cross_entropy, forward, false)->Args({2048, 85})->Args({8, 50257})->Args({64, 50257})
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_cross_entropy, fwd_bwd, true)->Args({2048, 85})->Args({8, 50257})->Args({64, 50257})
    ->Unit(benchmark::kMicrosecond);

// ============================ attention ============================
// Causal self-attention at B=32, H=4, T=64, D=32 (a small GPT's shapes).
void BM_attention(benchmark::State& state, bool backward) {
  const int64_t B = 32, H = 4, T = state.range(0), D = 32;
  Generator gen(5);
  Tensor q = randn({B, H, T, D}, DType::f32, &gen).requires_grad_(backward);
  Tensor k = randn({B, H, T, D}, DType::f32, &gen).requires_grad_(backward);
  Tensor v = randn({B, H, T, D}, DType::f32, &gen).requires_grad_(backward);
  {
    Tensor out = scaled_dot_product_attention(q, k, v, true);
    auto head = [](const Tensor& t) { return host(t.select(0, 0).select(0, 0)); };
    if (!check(state, rel_error(out.select(0, 0).select(0, 0), ref_attention_head(head(q), head(k), head(v), T, D)),
               1e-5, "attention differs from the reference"))
      return;
  }
  Tensor g = randn({B, H, T, D}, DType::f32, &gen);
  for (auto _ : state) {
    Tensor out = scaled_dot_product_attention(q, k, v, true);
    if (backward) {
      q.zero_grad(), k.zero_grad(), v.zero_grad();
      out.backward(g);
    }
    benchmark::DoNotOptimize(out.impl());
  }
  // Forward: two GEMMs of 2*T*T*D flops per head; backward: four more.
  const double flops = (backward ? 6.0 : 2.0) * 2.0 * B * H * T * T * D;
  state.counters["GFLOP/s"] = benchmark::Counter(flops * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK_CAPTURE(BM_attention, forward, false)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_attention, fwd_bwd, true)->Arg(64)->Arg(256)->Unit(benchmark::kMicrosecond);

// ============================ embedding ============================
// 2048 ids (B*T of a GPT-S batch) into a (V,128) table.
void BM_embedding(benchmark::State& state, bool backward) {
  const int64_t V = state.range(0), R = 2048, C = 128;
  Generator gen(7);
  Tensor w = randn({V, C}, DType::f32, &gen).requires_grad_(backward);
  Tensor ids = randint(0, V, {R}, &gen);
  Tensor g = randn({R, C}, DType::f32, &gen);
  {
    const auto wv = host(w), gv = host(g);
    const auto iv = ids.to_vector<int64_t>();
    std::vector<double> want(R * C), want_grad(V * C, 0.0);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) {
        want[r * C + c] = wv[iv[r] * C + c];
        want_grad[iv[r] * C + c] += gv[r * C + c];
      }
    Tensor out = embedding(w, ids);
    if (!check(state, rel_error(out, want), 1e-12, "embedding differs from the reference")) return;
    if (backward) {
      out.backward(g);
      if (!check(state, rel_error(w.grad(), want_grad), 1e-5, "embedding gradient differs from the reference")) return;
    }
  }
  for (auto _ : state) {
    Tensor out = embedding(w, ids);
    if (backward) {
      w.zero_grad();
      out.backward(g);
    }
    benchmark::DoNotOptimize(out.impl());
  }
  state.SetItemsProcessed(state.iterations() * R);
}
BENCHMARK_CAPTURE(BM_embedding, forward, false)->Arg(85)->Arg(50257)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_embedding, fwd_bwd, true)->Arg(85)->Arg(50257)->Unit(benchmark::kMicrosecond);

// ============================ LSTM ============================
// One step of nn::LSTMCell at B=32, E=64, H=256 (the LSTM LM's shapes);
// backward from the new hidden state (which also reaches the cell state).
void BM_lstm_cell(benchmark::State& state, bool backward) {
  const int64_t B = 32, E = 64, H = 256;
  manual_seed(8);
  nn::LSTMCell cell({.input = E, .hidden = H});
  for (const Tensor& p : cell.parameters()) p.requires_grad_(backward);  // forward alone records no tape
  Generator gen(8);
  Tensor x = randn({B, E}, DType::f32, &gen).requires_grad_(backward);
  Tensor h = randn({B, H}, DType::f32, &gen, 0.0, 0.5).requires_grad_(backward);
  Tensor c = randn({B, H}, DType::f32, &gen).requires_grad_(backward);
  Tensor gh = randn({B, H}, DType::f32, &gen);
  {
    const LSTMCellRef want = ref_lstm_cell(host(x), host(h), host(c), host(cell.weight_ih), host(cell.weight_hh),
                                           host(cell.bias_ih), host(cell.bias_hh), host(gh), B, E, H);
    Tensor out = cell.forward(x, {h, c}).h;
    if (!check(state, rel_error(out, want.h), 1e-5, "LSTM cell differs from the reference")) return;
    if (backward) {
      out.backward(gh);
      if (!check(state, rel_error(x.grad(), want.dx), 1e-4, "LSTM cell gradient of x differs from the reference") ||
          !check(state, rel_error(h.grad(), want.dh), 1e-4, "LSTM cell gradient of h differs from the reference") ||
          !check(state, rel_error(c.grad(), want.dc), 1e-4, "LSTM cell gradient of c differs from the reference") ||
          !check(state, rel_error(cell.weight_hh.grad(), want.dw_hh), 1e-4,
                 "LSTM cell gradient of weight_hh differs from the reference") ||
          !check(state, rel_error(cell.bias_ih.grad(), want.db), 1e-4,
                 "LSTM cell gradient of bias_ih differs from the reference"))
        return;
    }
  }
  for (auto _ : state) {
    Tensor out = cell.forward(x, {h, c}).h;
    if (backward) {
      cell.zero_grad();
      x.zero_grad(), h.zero_grad(), c.zero_grad();
      out.backward(gh);
    }
    benchmark::DoNotOptimize(out.impl());
  }
  state.SetItemsProcessed(state.iterations() * B);
}
BENCHMARK_CAPTURE(BM_lstm_cell, forward, false)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_lstm_cell, fwd_bwd, true)->Unit(benchmark::kMicrosecond);

// The fused recurrence over T=64 steps (the LSTM LM's layer without its input
// projection): xp (T,B,4H), w_hh (4H,H) -> [h; c] (2,T,B,H).
void BM_lstm_recurrence(benchmark::State& state, bool backward) {
  const int64_t T = 64, B = 32, H = 256;
  Generator gen(9);
  Tensor xp = randn({T, B, 4 * H}, DType::f32, &gen).requires_grad_(backward);
  Tensor w = randn({4 * H, H}, DType::f32, &gen, 0.0, 1.0 / 16).requires_grad_(backward);
  Tensor g = randn({2, T, B, H}, DType::f32, &gen);
  {
    // Forward: batch row 0 by a plain loop from zero state.
    const auto xv = host(xp), wv = host(w);
    std::vector<double> hr(H, 0.0), cr(H, 0.0), want(T * H);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> a(xv.begin() + t * B * 4 * H, xv.begin() + (t * B + 1) * 4 * H);
      for (int64_t k = 0; k < 4 * H; ++k)
        for (int64_t j = 0; j < H; ++j) a[k] += hr[j] * wv[k * H + j];
      for (int64_t j = 0; j < H; ++j) {
        cr[j] = sigmoid(a[H + j]) * cr[j] + sigmoid(a[j]) * std::tanh(a[2 * H + j]);
        hr[j] = sigmoid(a[3 * H + j]) * std::tanh(cr[j]);
        want[t * H + j] = hr[j];
      }
    }
    Tensor out = lstm_recurrence(xp, w);
    if (!check(state, rel_error(out.select(0, 0).select(1, 0), want), 1e-5, "LSTM recurrence differs from the reference"))
      return;
    if (backward) {
      // Gradients: a float64 run of the same op (the BPTT loop is too long to restate).
      out.backward(g);
      Tensor xp64 = xp.detach().to(DType::f64).requires_grad_(), w64 = w.detach().to(DType::f64).requires_grad_();
      lstm_recurrence(xp64, w64).backward(g.to(DType::f64));
      if (!check(state, rel_error(xp.grad(), host(xp64.grad())), 1e-4, "LSTM recurrence gradient of xp differs from float64") ||
          !check(state, rel_error(w.grad(), host(w64.grad())), 1e-4, "LSTM recurrence gradient of w_hh differs from float64"))
        return;
    }
  }
  for (auto _ : state) {
    Tensor out = lstm_recurrence(xp, w);
    if (backward) {
      xp.zero_grad(), w.zero_grad();
      out.backward(g);
    }
    benchmark::DoNotOptimize(out.impl());
  }
  state.SetItemsProcessed(state.iterations() * T * B);
}
BENCHMARK_CAPTURE(BM_lstm_recurrence, forward, false)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_lstm_recurrence, fwd_bwd, true)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
