// GEMM through the library (matmul, linear) against raw cblas_sgemm at
// transformer-shaped sizes, with 1 and 2 threads; the bfloat16 GEMM three
// ways in the same run: matmul of float32 tensors under autocast (operands
// rounded each call), tg::gemm on bfloat16 operands, and a raw oneDNN
// primitive made once (the library's ceiling); weight gradients x^T g
// (A read transposed) in both dtypes; plus elementwise and
// last-axis reduction throughput. Every benchmark validates its result
// against an independent computation before timing; a mismatch skips it
// with an error. Compare the GFLOP/s counters of lib_* and cblas_* rows:
//   build/bench/bench_gemm --benchmark_filter=gemm --benchmark_repetitions=5
//       (add --benchmark_report_aggregates_only=true for medians alone)
// The context line "gemm_backend" says what ran: for float32, the backend
// each shape class measured faster (lib_* rows run on it, cblas_* rows on
// OpenBLAS always); for bfloat16, oneDNN's ISA and kernel.
// BM_core_peak_* measure the arithmetic ceiling of one core (bench/peak.h:
// independent FMAs, or bf16 dot products, straight from registers), which no GEMM of
// that dtype can pass: the GEMM rows' GFLOP/s read as a fraction of it.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <dnnl.hpp>

#include <array>
#include <cmath>
#include <optional>
#include <vector>

#include <omp.h>

#include "autograd/autograd.h"
#include "autograd/blas.h"
#include "bench/peak.h"

using namespace tg;

namespace {

Tensor random(const Shape& shape, uint64_t seed) {
  Generator g(seed);
  return randn(shape, DType::f32, &g);
}

// Largest |a - b| relative to max(1, |b|) over two equally long float arrays.
double max_rel_diff(const float* a, const float* b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i)
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i]))));
  return worst;
}

// C (M,N) = A (M,K) @ B (K,N) with raw OpenBLAS, row-major, no transposes.
void cblas_product(const Tensor& a, const Tensor& b, Tensor& c) {
  const int M = a.size(0), K = a.size(1), N = b.size(1);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a.data<float>(), K, b.data<float>(), N, 0.0f,
              c.data<float>(), N);
}

void gemm_counters(benchmark::State& state, int64_t M, int64_t N, int64_t K) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * N * K * 1e-9 * state.iterations(), benchmark::Counter::kIsRate);
}

// Arguments: M, N, K, threads.
void BM_gemm_lib(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  Tensor a = random({M, K}, 1), b = random({K, N}, 2), ref = empty({M, N});
  cblas_product(a, b, ref);
  Tensor c = matmul(a, b);
  if (max_rel_diff(c.data<float>(), ref.data<float>(), M * N) > 1e-4) {
    state.SkipWithError("matmul disagrees with cblas_sgemm");
    return;
  }
  for (auto _ : state) {
    Tensor out = matmul(a, b);
    benchmark::DoNotOptimize(out.data<float>());
  }
  gemm_counters(state, M, N, K);
}

// Raw cblas_sgemm with OpenBLAS's own threads (the library keeps OpenBLAS at
// one thread and splits GEMMs over its pool).
void BM_gemm_cblas(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  struct OpenBlasThreads {
    explicit OpenBlasThreads(int n) { openblas_set_num_threads(n); }
    ~OpenBlasThreads() { openblas_set_num_threads(1); }
  } openblas(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  Tensor a = random({M, K}, 1), b = random({K, N}, 2), c = empty({M, N});
  cblas_product(a, b, c);
  Tensor ref = matmul(a, b);
  if (max_rel_diff(c.data<float>(), ref.data<float>(), M * N) > 1e-4) {
    state.SkipWithError("cblas_sgemm disagrees with matmul");
    return;
  }
  for (auto _ : state) {
    cblas_product(a, b, c);
    benchmark::DoNotOptimize(c.data<float>());
  }
  gemm_counters(state, M, N, K);
}

// The Linear-layer hot path: x (M,K) @ weight(N,K)^T + bias, against raw
// cblas_sgemm with the transpose flag into a bias-prefilled output.
void BM_linear_lib(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  Tensor x = random({M, K}, 3), w = random({N, K}, 4), bias = random({N}, 5);
  Tensor ref = add(matmul(x, w.t()), bias);
  Tensor y = linear(x, w, bias);
  if (max_rel_diff(y.data<float>(), ref.data<float>(), M * N) > 1e-4) {
    state.SkipWithError("linear disagrees with matmul + bias");
    return;
  }
  for (auto _ : state) {
    Tensor out = linear(x, w, bias);
    benchmark::DoNotOptimize(out.data<float>());
  }
  gemm_counters(state, M, N, K);
}

void BM_linear_cblas(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  Tensor x = random({M, K}, 3), w = random({N, K}, 4), bias = random({N}, 5), c = empty({M, N});
  auto run = [&] {
    float* pc = c.data<float>();
    const float* pb = bias.data<float>();
    for (int64_t r = 0; r < M; ++r) std::copy(pb, pb + N, pc + r * N);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x.data<float>(), K, w.data<float>(), K, 1.0f,
                pc, N);
  };
  run();
  Tensor ref = linear(x, w, bias);
  if (max_rel_diff(c.data<float>(), ref.data<float>(), M * N) > 1e-4) {
    state.SkipWithError("cblas linear disagrees with tg::linear");
    return;
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data<float>());
  }
  gemm_counters(state, M, N, K);
}

// ---- bfloat16: x (M,K) @ w (K,N) with float32 accumulation.

// The largest |c - ref| relative to max(1, max |ref|), ref from float64 loops
// over the bfloat16-rounded operands (sampled rows).
bool bf16_product_ok(const Tensor& a, const Tensor& b, const float* c) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  const float *pa = a.data<float>(), *pb = b.data<float>();
  for (int64_t i = 0; i < M; i += 37)
    for (int64_t j = 0; j < N; j += 11) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = double(float(tg::bfloat16(pa[i * K + k]))) * double(float(tg::bfloat16(pb[k * N + j])));
        acc += t, mag += std::abs(t);
      }
      if (std::abs(c[i * N + j] - acc) > 1e-5 * (1 + mag)) return false;
    }
  return true;
}

// matmul of float32 tensors under autocast: what a model's GEMM costs,
// rounding both operands included (neither is a parameter here).
void BM_gemm_bf16_autocast(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  AutocastGuard bf16(DType::bf16);
  Tensor a = random({M, K}, 1), b = random({K, N}, 2);
  if (!bf16_product_ok(a, b, matmul(a, b).data<float>())) {
    state.SkipWithError("autocast matmul disagrees with the float64 product of rounded operands");
    return;
  }
  for (auto _ : state) {
    Tensor out = matmul(a, b);
    benchmark::DoNotOptimize(out.data<float>());
  }
  gemm_counters(state, M, N, K);
}

// tg::gemm on bfloat16 operands: the library's GEMM (cached primitive, split over the pool).
void BM_gemm_bf16_lib(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  Tensor a = random({M, K}, 1), b = random({K, N}, 2), c = empty({M, N});
  Tensor ab = a.to(DType::bf16), bb = b.to(DType::bf16);
  auto run = [&] { gemm(false, false, M, N, K, 1.0f, ab.data<tg::bfloat16>(), K, bb.data<tg::bfloat16>(), N, 0.0f, c.data<float>(), N); };
  run();
  if (!bf16_product_ok(a, b, c.data<float>())) {
    state.SkipWithError("bf16 gemm disagrees with the float64 product of rounded operands");
    return;
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(c.data<float>());
  }
  gemm_counters(state, M, N, K);
  state.SetLabel(gemm_backend_info().substr(gemm_backend_info().find("bfloat16:")));
}

// A raw oneDNN bfloat16 matmul made once, run on oneDNN's own threads: the ceiling.
void BM_gemm_bf16_onednn(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  Tensor a = random({M, K}, 1), b = random({K, N}, 2), c = empty({M, N});
  Tensor ab = a.to(DType::bf16), bb = b.to(DType::bf16);
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  omp_set_num_threads(static_cast<int>(state.range(3)));  // before the primitive: it sizes its work by the team
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(eng);
  dnnl::memory::desc da({M, K}, dt::bf16, tag::ab), db({K, N}, dt::bf16, tag::ab), dc({M, N}, dt::f32, tag::ab);
  std::optional<dnnl::matmul> mm;
  try {
    mm.emplace(dnnl::matmul::primitive_desc(dnnl::matmul::desc(da, db, dc), eng));
  } catch (const dnnl::error&) {
    omp_set_num_threads(1);
    state.SkipWithError("oneDNN has no bfloat16 matmul on this CPU");
    return;
  }
  dnnl::memory ma(da, eng, ab.data<tg::bfloat16>()), mb(db, eng, bb.data<tg::bfloat16>()), mc(dc, eng, c.data<float>());
  auto run = [&] {
    mm->execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
  };
  run();
  if (!bf16_product_ok(a, b, c.data<float>())) {
    omp_set_num_threads(1);
    state.SkipWithError("raw oneDNN disagrees with the float64 product of rounded operands");
    return;
  }
  for (auto _ : state) run();
  omp_set_num_threads(1);
  gemm_counters(state, M, N, K);
}

// A weight gradient through tg::gemm: dW (M,N) = x^T g over K tokens, both
// operands stored token-major (x (K,M), g (K,N)), so A is read transposed:
// the T N products of a training step (lm_train --profile lists them), on
// float32 (range 4 = 0) or bfloat16 operands (1). The values are bfloat16's
// in both, so that one check (bf16_product_ok) serves both dtypes.
void BM_gemm_weight_grad(benchmark::State& state) {
  const int64_t M = state.range(0), N = state.range(1), K = state.range(2);
  const bool bf16 = state.range(4) != 0;
  set_num_threads(static_cast<int>(state.range(3)));
  NoGradGuard ng;
  const Tensor xb = random({K, M}, 8).to(DType::bf16), gb = random({K, N}, 9).to(DType::bf16);
  const Tensor x = xb.to(DType::f32), g = gb.to(DType::f32);
  Tensor dw = empty({M, N});
  auto run = [&] {
    if (bf16)
      gemm(true, false, M, N, K, 1.0f, xb.data<tg::bfloat16>(), M, gb.data<tg::bfloat16>(), N, 0.0f, dw.data<float>(), N);
    else
      gemm(true, false, M, N, K, 1.0f, x.data<float>(), M, g.data<float>(), N, 0.0f, dw.data<float>(), N);
  };
  run();
  if (!bf16_product_ok(x.t().contiguous(), g, dw.data<float>())) {
    state.SkipWithError("weight gradient disagrees with the float64 product");
    return;
  }
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(dw.data<float>());
  }
  gemm_counters(state, M, N, K);
}
// GPT-M's weight gradients over 2048 tokens: the MLP's two and attention's qkv.
void weight_grad_args(benchmark::internal::Benchmark* b) {
  for (int64_t bf16 : {0, 1})
    for (int threads : {1, 2})
      for (auto [M, N, K] : {std::array<int64_t, 3>{1024, 256, 2048}, {256, 1024, 2048}, {768, 256, 2048}})
        b->Args({M, N, K, threads, bf16});
  b->ArgNames({"M", "N", "K", "threads", "bf16"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void gemm_args(benchmark::internal::Benchmark* b) {
  for (int threads : {1, 2}) {
    b->Args({256, 256, 256, threads});
    b->Args({512, 512, 512, threads});
    b->Args({2048, 768, 256, threads});
  }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();
}
// The float32 shapes plus those of the workloads: GPT-M's projections and
// MLP (2048x1024x256, 2048x256x1024), the recurrences' input projection and
// per-step product (2048x1024x64, 32x1024x256), one attention head of GPT-M (128x128x64).
void gemm_bf16_args(benchmark::internal::Benchmark* b) {
  gemm_args(b);
  for (int threads : {1, 2})
    for (auto [M, N, K] : {std::array<int64_t, 3>{2048, 1024, 256}, {2048, 256, 1024}, {2048, 1024, 64}, {32, 1024, 256},
                           {128, 128, 64}})
      b->Args({M, N, K, threads});
}
BENCHMARK(BM_gemm_lib)->Apply(gemm_bf16_args);
BENCHMARK(BM_gemm_cblas)->Apply(gemm_bf16_args);
BENCHMARK(BM_gemm_bf16_autocast)->Apply(gemm_bf16_args);
BENCHMARK(BM_gemm_bf16_lib)->Apply(gemm_bf16_args);
BENCHMARK(BM_gemm_bf16_onednn)->Apply(gemm_bf16_args);
BENCHMARK(BM_gemm_weight_grad)->Apply(weight_grad_args);
BENCHMARK(BM_linear_lib)->Apply(gemm_args);
BENCHMARK(BM_linear_cblas)->Apply(gemm_args);

// ---- elementwise and reductions: elements per second over 4M floats.
constexpr int64_t kRows = 4096, kCols = 1024;

template <class Op, class Ref>
void elementwise(benchmark::State& state, Op op, Ref ref) {
  set_num_threads(static_cast<int>(state.range(0)));
  NoGradGuard ng;
  Tensor a = random({kRows, kCols}, 6), b = random({kRows, kCols}, 7);
  Tensor out = op(a, b);
  const float *pa = a.data<float>(), *pb = b.data<float>(), *po = out.data<float>();
  for (int64_t i = 0; i < a.numel(); i += 997)
    if (std::abs(po[i] - ref(pa[i], pb[i])) > 1e-5f * std::max(1.0f, std::abs(po[i]))) {
      state.SkipWithError("elementwise result is wrong");
      return;
    }
  for (auto _ : state) {
    Tensor r = op(a, b);
    benchmark::DoNotOptimize(r.data<float>());
  }
  state.SetItemsProcessed(state.iterations() * a.numel());
}

void BM_add(benchmark::State& s) {
  elementwise(
      s, [](const Tensor& a, const Tensor& b) { return add(a, b); }, [](float x, float y) { return x + y; });
}
void BM_mul(benchmark::State& s) {
  elementwise(
      s, [](const Tensor& a, const Tensor& b) { return mul(a, b); }, [](float x, float y) { return x * y; });
}
void BM_gelu(benchmark::State& s) {
  elementwise(
      s, [](const Tensor& a, const Tensor&) { return gelu(a); },
      [](float x, float) { return static_cast<float>(0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)))); });
}
void BM_exp(benchmark::State& s) {
  elementwise(
      s, [](const Tensor& a, const Tensor&) { return exp(a); }, [](float x, float) { return std::exp(x); });
}
void BM_tanh(benchmark::State& s) {
  elementwise(
      s, [](const Tensor& a, const Tensor&) { return tanh(a); }, [](float x, float) { return std::tanh(x); });
}
void BM_sigmoid(benchmark::State& s) {
  elementwise(
      s, [](const Tensor& a, const Tensor&) { return sigmoid(a); },
      [](float x, float) { return 1.0f / (1.0f + std::exp(-x)); });
}

// sum and logsumexp over the last axis of (4096, 1024): the softmax/layer_norm pattern.
template <class Op, class Ref>
void row_reduction(benchmark::State& state, Op op, Ref ref) {
  set_num_threads(static_cast<int>(state.range(0)));
  NoGradGuard ng;
  Tensor x = random({kRows, kCols}, 8);
  Tensor out = op(x);
  const float* px = x.data<float>();
  for (int64_t r = 0; r < kRows; r += 101) {
    const double expect = ref(px + r * kCols, kCols);
    if (std::abs(out.data<float>()[r] - expect) > 1e-3 * std::max(1.0, std::abs(expect))) {
      state.SkipWithError("row reduction result is wrong");
      return;
    }
  }
  for (auto _ : state) {
    Tensor r = op(x);
    benchmark::DoNotOptimize(r.data<float>());
  }
  state.SetItemsProcessed(state.iterations() * x.numel());
}
void BM_sum_last_axis(benchmark::State& s) {
  row_reduction(
      s, [](const Tensor& x) { return sum(x, {-1}); },
      [](const float* row, int64_t n) {
        double acc = 0;
        for (int64_t i = 0; i < n; ++i) acc += row[i];
        return acc;
      });
}
void BM_logsumexp_last_axis(benchmark::State& s) {
  row_reduction(
      s, [](const Tensor& x) { return logsumexp(x, {-1}); },
      [](const float* row, int64_t n) {
        double m = row[0], acc = 0;
        for (int64_t i = 0; i < n; ++i) m = std::max(m, double(row[i]));
        for (int64_t i = 0; i < n; ++i) acc += std::exp(row[i] - m);
        return m + std::log(acc);
      });
}

// The core's peak (bench/peak.h), 2^20 iterations of its loop an iteration of the benchmark.
void core_peak(benchmark::State& state, bench::PeakLoop loop, const char* missing) {
  if (!bench::peak_loop_available(loop)) {
    state.SkipWithError(missing);
    return;
  }
  double flops = 0;
  for (auto _ : state) flops += bench::run_peak_loop(loop, int64_t{1} << 20);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsRate);
}

void BM_core_peak_f32(benchmark::State& state) {
  core_peak(state, bench::PeakLoop::fma_f32, "built without FMA (-march=native on a CPU without it)");
}

void BM_core_peak_bf16(benchmark::State& state) {
  core_peak(state, bench::PeakLoop::dpbf16_f32,
            "this CPU (or build) has no AVX512_BF16: no bfloat16 dot instruction to measure");
}
// Rates over CPU time, not wall time: a core's peak, not the machine's load.
BENCHMARK(BM_core_peak_f32)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_core_peak_bf16)->Unit(benchmark::kMillisecond);

void thread_args(benchmark::internal::Benchmark* b) { b->Arg(1)->Arg(2)->Unit(benchmark::kMicrosecond)->UseRealTime(); }
BENCHMARK(BM_add)->Apply(thread_args);
BENCHMARK(BM_mul)->Apply(thread_args);
BENCHMARK(BM_gelu)->Apply(thread_args);
BENCHMARK(BM_exp)->Apply(thread_args);
BENCHMARK(BM_tanh)->Apply(thread_args);
BENCHMARK(BM_sigmoid)->Apply(thread_args);
BENCHMARK(BM_sum_last_axis)->Apply(thread_args);
BENCHMARK(BM_logsumexp_last_axis)->Apply(thread_args);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("gemm_backend", tg::gemm_backend_info());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
}
