// Google Benchmark of the fused NN primitives at transformer shapes (float32):
// softmax, layer_norm, cross_entropy (a character vocabulary V=85 and a
// GPT-2-sized V=50257 at a small batch) and scaled dot-product attention
// (B=32, H=4, T=64, D=32), forward alone and forward + backward.
// Each benchmark validates its result against a plain double-precision loop
// before timing (SkipWithError on a mismatch).
//
//   build/bench/bench_nn_ops                         # threads: TAPEGRAD_NUM_THREADS or all cores
//   TAPEGRAD_NUM_THREADS=1 build/bench/bench_nn_ops --benchmark_filter=attention
#include <benchmark/benchmark.h>

#include <cmath>

#include "autograd/autograd.h"

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

}  // namespace

BENCHMARK_MAIN();
