#define BOOST_TEST_MODULE autocast
#include <boost/test/unit_test.hpp>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <thread>

#include "autograd/autocast.h"
#include "autograd/autograd.h"
#include "autograd/bf16_kernel.h"
#include "autograd/blas.h"
#include "autograd/onednn.h"
#include "autograd/op.h"
#include "autograd/ops/rnn/common.h"
#include "autograd/ops/rnn_ops.h"
#include "autograd/ops/samples.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;

namespace {

float bits_float(uint32_t u) { return std::bit_cast<float>(u); }
double round_bf16(double x) { return static_cast<float>(bfloat16(static_cast<float>(x))); }

// The product of a (M,K) and b (K,N), float64 values, in float64, with both
// rounded to bfloat16 first when `rounded`: what a bfloat16 GEMM computes up
// to its float32 accumulation.
Tensor product(const Tensor& a, const Tensor& b, bool rounded) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  std::vector<double> va = a.to(DType::f64).contiguous().to_vector<double>(),
                      vb = b.to(DType::f64).contiguous().to_vector<double>(), out(M * N, 0.0);
  if (rounded) {
    for (double& v : va) v = round_bf16(v);
    for (double& v : vb) v = round_bf16(v);
  }
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t j = 0; j < N; ++j) out[i * N + j] += va[i * K + k] * vb[k * N + j];
  return from_vector(out, {M, N});
}

Tensor random(const Shape& s, uint64_t seed) {
  Generator g(seed);
  return randn(s, DType::f32, &g);
}

// A recorded backward under autocast: the Hessian-vector product of loss()
// in w along v, under autocast and in float32. The second derivative reaches
// w as in float32 within bfloat16's tolerance, and autocast did change it.
void check_hvp_under_autocast(const Tensor& w, const Tensor& v, const std::function<Tensor()>& loss) {
  auto hvp = [&](bool bf16) {
    AutocastGuard precision(bf16 ? DType::bf16 : DType::f32);
    Tensor g = grad({loss()}, {w}, {}, {.create_graph = true})[0];
    return grad({sum(mul(g, v))}, {w})[0];
  };
  const Tensor h16 = hvp(true), h32 = hvp(false);
  const double scale = max(abs(h32)).item();
  BOOST_TEST(scale > 0.0);
  BOOST_TEST(max_abs_diff(h16, h32) < 3e-2 * scale);
  BOOST_TEST(max_abs_diff(h16, h32) > 0.0);
}

}  // namespace

// ---------------------------------------------------------------- the dtype

BOOST_AUTO_TEST_CASE(bfloat16_rounds_to_nearest_even) {
  // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even one (1).
  BOOST_TEST(bfloat16(bits_float(0x3f808000u)).bits == 0x3f80u);
  BOOST_TEST(bfloat16(bits_float(0x3f818000u)).bits == 0x3f82u);  // tie, odd below: up
  BOOST_TEST(bfloat16(bits_float(0x3f808001u)).bits == 0x3f81u);  // past the tie: up
  BOOST_TEST(bfloat16(bits_float(0x7f7fffffu)).bits == 0x7f80u);  // float's max rounds to infinity
  BOOST_TEST(bfloat16(bits_float(0x00010001u)).bits == 0x0001u);  // subnormals are kept, not flushed
  BOOST_TEST(bfloat16(-0.0f).bits == 0x8000u);
  BOOST_TEST(std::isnan(static_cast<float>(bfloat16(bits_float(0x7f800001u)))));  // a NaN stays NaN
  BOOST_TEST(std::isinf(static_cast<float>(bfloat16(INFINITY))));
}

// Random bit patterns: most blocks of 32 hold no subnormal (where the CPU has
// VCVTNE2PS2BF16, its path), about one in eight holds one (the loop's).
BOOST_AUTO_TEST_CASE(vectorised_conversion_equals_the_scalar_one) {
  std::vector<float> x;
  Generator g(3);
  for (uint32_t u = 0; u < 200000; ++u) x.push_back(bits_float(static_cast<uint32_t>(g.next_u64())));
  for (uint32_t u : {0x7fc00000u, 0xff800001u, 0x7f800000u, 0x00000001u, 0x80000000u}) x.push_back(bits_float(u));
  std::vector<bfloat16> v(x.size());
  float_to_bf16(x.data(), v.data(), static_cast<int64_t>(x.size()));
  std::vector<float> back(x.size());
  bf16_to_float(v.data(), back.data(), static_cast<int64_t>(x.size()));
  size_t bad = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    bad += v[k].bits != bfloat16(x[k]).bits;
    bad += std::bit_cast<uint32_t>(back[k]) != static_cast<uint32_t>(v[k].bits) << 16;
  }
  std::vector<bfloat16> shifted(x.size() - 5);  // blocks that start off 64-byte alignment, and a tail
  float_to_bf16(x.data() + 5, shifted.data(), static_cast<int64_t>(shifted.size()));
  for (size_t k = 0; k < shifted.size(); ++k) bad += shifted[k].bits != v[k + 5].bits;
  BOOST_TEST(bad == 0u);
}

BOOST_AUTO_TEST_CASE(bf16_tensors_convert_copy_and_print) {
  Tensor x = from_vector(std::vector<float>{1.0f, 1.00390625f, -2.5f, 3e-39f}, {2, 2});
  Tensor b = x.to(DType::bf16);
  BOOST_TEST((b.dtype() == DType::bf16));
  BOOST_TEST(itemsize(b.dtype()) == 2u);
  std::vector<float> back = b.to(DType::f32).to_vector<float>();
  for (int k = 0; k < 4; ++k) BOOST_TEST(back[k] == static_cast<float>(bfloat16(x.to_vector<float>()[k])));
  BOOST_TEST(b.at({1, 0}) == -2.5);
  BOOST_TEST(b.t().contiguous().at({0, 1}) == -2.5);  // views copy
  BOOST_TEST(b.str().find("dtype=bfloat16") != std::string::npos);
  Tensor c = from_vector(std::vector<bfloat16>{bfloat16(0.5f), bfloat16(2.0f)}, {2});
  BOOST_TEST(c.to(DType::f64).to_vector<double>() == std::vector<double>({0.5, 2.0}));
  // Compute on bfloat16 tensors is refused with a reason, and they cannot require grad.
  // Every kind of op: unary, binary, with a scalar, reductions, in place, and
  // the fused ones; each error names the op and points to autocast.
  const std::vector<std::pair<std::string, std::function<void()>>> computes{
      {"exp", [&] { (void)exp(b); }},
      {"add", [&] { (void)add(b, b); }},
      {"sub", [&] { (void)sub(b, b); }},
      {"mul", [&] { (void)mul(b, b); }},
      {"div", [&] { (void)div(b, b); }},
      {"add", [&] { (void)add(b, 1.0); }},
      {"mul", [&] { (void)mul(b, 2.0); }},
      {"rsub", [&] { (void)rsub(1.0, b); }},
      {"sum", [&] { (void)sum(b); }},
      {"add_", [&] { b.add_(b); }},
      {"mul_", [&] { b.mul_(2.0); }},
      {"matmul", [&] { (void)matmul(b, b); }},
      {"softmax", [&] { (void)softmax(b, -1); }},
  };
  for (const auto& [op, f] : computes) check_throws<DTypeError>(f, {op + ": bfloat16", "AutocastGuard"});
  BOOST_TEST(b.at({1, 0}) == -2.5);  // untouched by the refused in-place ops
  check_throws<DTypeError>([&] { b.requires_grad_(); }, {"bfloat16"});
  check_throws<DTypeError>([] { AutocastGuard g(DType::f64); }, {"AutocastGuard", "float64"});
}

// ---------------------------------------------------------------- the GEMM

// The bfloat16 GEMM against float64 loops over the rounded operands, for
// every transpose, ragged shapes, padded leading dimensions, alpha and beta,
// and split over the pool: the only differences left are float32's
// accumulation, ~K * 2^-24 of sum |a||b|.
BOOST_AUTO_TEST_CASE(bf16_gemm_against_float64) {
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 33, 65}, {130, 70, 300}, {300, 129, 64}, {64, 600, 40}};
  int checked = 0;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (auto [M, N, K] : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (float beta : {0.0f, 1.0f, 0.25f}) {
            const float alpha = beta == 0.25f ? 0.5f : 1.0f;
            const int64_t pad = 3;
            const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
            Tensor a = random({a_rows, a_cols + pad}, 10 + M), b = random({b_rows, b_cols + pad}, 20 + N);
            Tensor c0 = random({M, N + pad}, 30 + K);
            Tensor ab = a.to(DType::bf16), bb = b.to(DType::bf16), c = c0.clone();
            gemm(ta, tb, M, N, K, alpha, ab.data<bfloat16>(), a_cols + pad, bb.data<bfloat16>(), b_cols + pad, beta,
                 c.data<float>(), N + pad);
            Tensor op_a = a.narrow(1, 0, a_cols), op_b = b.narrow(1, 0, b_cols);
            if (ta) op_a = op_a.t();
            if (tb) op_b = op_b.t();
            Tensor expect = product(op_a, op_b, true) * double(alpha) + c0.narrow(1, 0, N).to(DType::f64) * double(beta);
            Tensor bound = product(abs(op_a), abs(op_b), true);
            const double err = max_abs_diff(c.narrow(1, 0, N), expect);
            BOOST_TEST(err <= 1e-5 * (1.0 + max(bound).item()), "M,N,K " << M << "," << N << "," << K << " ta " << ta
                                                                         << " tb " << tb << " beta " << beta);
            // The padding columns are never written.
            BOOST_TEST(max_abs_diff(c.narrow(1, N, pad), c0.narrow(1, N, pad)) == 0.0);
            ++checked;
          }
  }
  set_num_threads(2);
  BOOST_TEST(checked == 2 * 6 * 4 * 3);
  BOOST_TEST_MESSAGE("GEMMs: " << gemm_backend_info());
}

// More shapes than the primitive caches keep (generation meets a new one per
// token): they start over, and every product stays right.
BOOST_AUTO_TEST_CASE(bf16_gemm_past_the_cache_bound) {
  Tensor b = random({8, 5}, 40), bb = b.to(DType::bf16);
  double worst = 0;
  for (int64_t M = 1; M <= 1100; ++M) {
    Tensor a = random({M, 8}, 41 + M), c = empty({M, 5});
    Tensor ab = a.to(DType::bf16);
    gemm(false, false, M, 5, 8, 1.0f, ab.data<bfloat16>(), 8, bb.data<bfloat16>(), 5, 0.0f, c.data<float>(), 5);
    if (M % 100 == 0 || M > 1020) worst = std::max(worst, max_abs_diff(c, product(a, b, true)));
  }
  BOOST_TEST(worst < 1e-5);
}


// A float32 GEMM under autocast whose operands round to more than 1 MiB
// runs in slices, each rounding its part: of A's rows or B's columns (C's
// values as one GEMM's) or, both operands rounded and K the longest, of K
// (each slice added into C; at 2 threads each thread takes half of K, its
// partial sum added in after); operands stored plain or transposed, ragged
// slices, padded leading dimensions. C is what one GEMM of the rounded
// operands gives up to float32's accumulation, its padding is untouched, and
// the allocator never held more than 1 MiB of rounded blocks (and partial
// sums) at once.
BOOST_AUTO_TEST_CASE(large_operands_are_rounded_in_slices) {
  AutocastGuard bf16(DType::bf16);
  const int threads_before = num_threads();
  const int64_t pad = 3;
  const int64_t shapes[][3] = {{1201, 24, 700}, {24, 1201, 700}, {300, 200, 1500}};  // A, B, both large
  int checked = 0;
  for (int threads : {1, 2})
    for (auto [M, N, K] : shapes)
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
          Tensor a = random({a_rows, a_cols + pad}, 50 + ta), b = random({b_rows, b_cols + pad}, 60 + tb);
          Tensor c0 = random({M, N + pad}, 70), c = c0.clone();
          empty_cache();  // else a block cached by an earlier case may serve a smaller request whole
          reset_peak_memory_stats();
          const size_t before = memory_stats().bytes_in_use;
          set_num_threads(threads);
          gemm(ta, tb, M, N, K, 1.0f, a.data<float>(), a_cols + pad, b.data<float>(), b_cols + pad, 0.5f,
               c.data<float>(), N + pad);
          set_num_threads(threads_before);
          const size_t held = memory_stats().peak_bytes_in_use - before;
          Tensor op_a = a.narrow(1, 0, a_cols), op_b = b.narrow(1, 0, b_cols);
          if (ta) op_a = op_a.t();
          if (tb) op_b = op_b.t();
          Tensor expect = product(op_a, op_b, true) + c0.narrow(1, 0, N).to(DType::f64) * 0.5;
          const std::string what = fmt::format("{}x{}x{} ta {} tb {}, {} threads", M, N, K, ta, tb, threads);
          const double bound = max(product(abs(op_a), abs(op_b), true)).item();
          BOOST_TEST(max_abs_diff(c.narrow(1, 0, N), expect) <= 1e-5 * (1.0 + bound), what);
          BOOST_TEST(max_abs_diff(c.narrow(1, N, pad), c0.narrow(1, N, pad)) == 0.0, what);
          BOOST_TEST(held <= size_t{1} << 20, what << ": held " << held);  // the rounded blocks' bound
          ++checked;
        }
  BOOST_TEST(checked == 24);
}
// tapegrad's own kernel for small products (bf16_kernel.h), called
// directly whatever the policy: each transpose, remainder rows, K = 2,
// leading dimensions wider than the operands, alpha and beta; C's spare
// columns untouched. Where the build has no AVX512_BF16 it takes nothing.
BOOST_AUTO_TEST_CASE(small_bf16_kernel_against_float64) {
  const int64_t shapes[][3] = {{64, 64, 64}, {128, 64, 64}, {64, 64, 128}, {32, 96, 32},
                               {128, 128, 128}, {96, 16, 32}, {5, 64, 2}, {33, 32, 64}};
  int checked = 0;
  for (auto [M, N, K] : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (float beta : {0.0f, 0.25f}) {
          const float alpha = beta == 0.0f ? 1.0f : -1.5f;
          const int64_t pad = 2;
          const int64_t a_rows = ta ? K : M, a_cols = ta ? M : K, b_rows = tb ? N : K, b_cols = tb ? K : N;
          if (!detail::small_bf16_gemm_fits(ta, tb, M, N, K, a_cols + pad, b_cols + pad)) continue;
          Tensor a = random({a_rows, a_cols + pad}, 50 + M), b = random({b_rows, b_cols + pad}, 60 + N);
          Tensor c0 = random({M, N + pad}, 70 + K);
          Tensor ab = a.to(DType::bf16), bb = b.to(DType::bf16), c = c0.clone();
          detail::small_bf16_gemm(ta, tb, M, N, K, alpha, ab.data<bfloat16>(), a_cols + pad, bb.data<bfloat16>(),
                                  b_cols + pad, beta, c.data<float>(), N + pad);
          Tensor op_a = a.narrow(1, 0, a_cols), op_b = b.narrow(1, 0, b_cols);
          if (ta) op_a = op_a.t();
          if (tb) op_b = op_b.t();
          Tensor expect = product(op_a, op_b, true) * double(alpha) + c0.narrow(1, 0, N).to(DType::f64) * double(beta);
          Tensor bound = product(abs(op_a), abs(op_b), true);
          BOOST_TEST(max_abs_diff(c.narrow(1, 0, N), expect) <= 1e-5 * (1.0 + max(bound).item()),
                     "M,N,K " << M << "," << N << "," << K << " ta " << ta << " tb " << tb << " beta " << beta);
          BOOST_TEST(max_abs_diff(c.narrow(1, N, pad), c0.narrow(1, N, pad)) == 0.0);
          ++checked;
        }
#if defined(__AVX512BF16__)
  // 25 of the 32 shape-transpose pairs (5 shapes all four; 96x16x32 with B
  // transposed, 33x32x64 with A as stored, 5x64x2 N N only), two betas each.
  BOOST_TEST(checked == 2 * 25);
#else
  BOOST_TEST(checked == 0);
#endif
  // What it does not take: odd leading dimensions of the K-contiguous
  // operands, sides past kSmallBf16Max.
  BOOST_TEST(!detail::small_bf16_gemm_fits(false, false, 64, 64, 64, 65, 64));
  BOOST_TEST(!detail::small_bf16_gemm_fits(false, true, 64, 64, 64, 64, 65));
  BOOST_TEST(!detail::small_bf16_gemm_fits(false, false, 64, 64, 2 * detail::kSmallBf16Max, 64, 64));
}

// TAPEGRAD_GEMM_BF16 decides where small bfloat16 products run (meson test
// autocast_bf16_onednn sets onednn); under measure, tapegrad's kernel keeps
// them unless oneDNN measured clearly faster.
BOOST_AUTO_TEST_CASE(small_bf16_backend_follows_the_environment) {
  BOOST_CHECK_EXCEPTION(detail::parse_gemm_bf16_policy("oneDNN"), ValueError, [](const ValueError& e) {
    return std::string(e.what()) == "TAPEGRAD_GEMM_BF16=oneDNN: give onednn, tapegrad or measure";
  });
  const char* env = std::getenv("TAPEGRAD_GEMM_BF16");
  const detail::GemmBf16Policy policy = detail::parse_gemm_bf16_policy(env);
  BOOST_TEST((detail::gemm_bf16_policy() == policy));
  const detail::GemmBf16Choice c = detail::gemm_bf16_choice();
  const std::string info = gemm_backend_info();
  if (policy == detail::GemmBf16Policy::measure) {
    BOOST_TEST((c.backend == detail::GemmBackend::onednn) == (c.onednn_gflops > detail::kOnednnClearWin * c.tapegrad_gflops));
    BOOST_TEST(info.find("bf16_small " + c.shape + ": ") != std::string::npos, info);
#if defined(__AVX512BF16__)
    BOOST_TEST(c.tapegrad_gflops > 0);
#endif
  } else {
    BOOST_TEST((c.backend == (policy == detail::GemmBf16Policy::onednn ? detail::GemmBackend::onednn
                                                                        : detail::GemmBackend::tapegrad)));
    BOOST_TEST(info.find(std::string("TAPEGRAD_GEMM_BF16=") + env) != std::string::npos, info);
  }
}

// Run with ONEDNN_MAX_CPU_ISA=AVX2 (meson test autocast_avx2): oneDNN must
// then use no bfloat16 instructions, and the GEMM above still passes.
BOOST_AUTO_TEST_CASE(isa_limit_is_honoured) {
  const char* limit = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (!limit) return;
  BOOST_TEST(gemm_backend_info().find("oneDNN avx2 has no bfloat16 matmul") != std::string::npos, gemm_backend_info());
}

// ---------------------------------------------------------------- autocast

BOOST_AUTO_TEST_CASE(autocast_matmul_forward_and_backward_in_bf16) {
  Tensor x = random({48, 96}, 1).requires_grad_(), w = random({96, 40}, 2).requires_grad_();
  Tensor g = random({48, 40}, 3);
  Tensor y32 = matmul(x, w);
  Tensor y;
  {
    AutocastGuard bf16(DType::bf16);
    BOOST_TEST(autocast_enabled());
    y = matmul(x, w);
  }
  BOOST_TEST(!autocast_enabled());
  BOOST_TEST((y.dtype() == DType::f32));
  BOOST_TEST(max_abs_diff(y, product(x, w, true)) < 1e-4);
  BOOST_TEST(max_abs_diff(y32, product(x, w, true)) > 1e-3);  // float32 did not round
  // Backward runs outside the guard, in the precision the node was recorded in.
  y.backward(g);
  BOOST_TEST(max_abs_diff(x.grad(), product(g, w.t(), true)) < 1e-4);
  BOOST_TEST(max_abs_diff(w.grad(), product(x.t(), g, true)) < 1e-4);
  // A guard of f32 turns it off inside an autocast region.
  AutocastGuard bf16(DType::bf16);
  {
    AutocastGuard off(DType::f32);
    BOOST_TEST(max_abs_diff(matmul(x, w), y32) == 0.0);
  }
}

// A parameter's bfloat16 copy is made once and follows its version: an
// optimizer's in-place update (and a raw write that bumps the version) is
// seen by the next GEMM.
BOOST_AUTO_TEST_CASE(parameter_copy_follows_the_version) {
  Tensor x = random({32, 64}, 4), w = random({64, 24}, 5).requires_grad_();
  AutocastGuard bf16(DType::bf16);
  Tensor y1 = matmul(x, w);  // records the node: w's storage is kept from here on
  Tensor y2 = matmul(x, w);  // served from the copy
  BOOST_TEST(max_abs_diff(y1, y2) == 0.0);
  {
    NoGradGuard ng;
    w.add_(ones_like(w));  // bumps the version
  }
  BOOST_TEST(max_abs_diff(matmul(x, w), product(x, w, true)) < 1e-4);
  w.data<float>()[0] += 100.0f;
  w.bump_version();
  BOOST_TEST(max_abs_diff(matmul(x, w), product(x, w, true)) < 1e-4);
  // Views of the parameter (a tied output head multiplies by its transpose) are served too.
  Tensor h = random({8, 24}, 6);
  BOOST_TEST(max_abs_diff(matmul(h, w.t()), product(h, w.t(), true)) < 1e-4);
}

// A product of few rows by a kept copy reads it packed in oneDNN's layout
// from the second call in a row with it (a recurrence's steps); a new
// version of the parameter is packed again, and calls that take turns
// between two parameters of one shape read each one's own values.
BOOST_AUTO_TEST_CASE(packed_parameter_follows_the_version) {
  Tensor h = random({16, 64}, 12), w = random({64, 48}, 13).requires_grad_(), u = random({64, 48}, 14).requires_grad_();
  AutocastGuard bf16(DType::bf16);
  for (int version = 0; version < 3; ++version) {
    for (int call = 0; call < 3; ++call) BOOST_TEST(max_abs_diff(matmul(h, w), product(h, w, true)) < 1e-4);
    for (int call = 0; call < 3; ++call) {
      BOOST_TEST(max_abs_diff(matmul(h, w), product(h, w, true)) < 1e-4);
      BOOST_TEST(max_abs_diff(matmul(h, u), product(h, u, true)) < 1e-4);
    }
    NoGradGuard ng;
    w.add_(ones_like(w));
  }
}

// A RoundOnce's copy serves GEMMs for its scope only, unless autocast keeps
// the storage meanwhile (a parameter recorded inside the scope): then the
// copy stays, as the parameter's.
BOOST_AUTO_TEST_CASE(round_once_copy_is_dropped_unless_kept) {
  AutocastGuard bf16(DType::bf16);
  Tensor t = random({8, 8}, 15), w = random({8, 8}, 16);
  {
    detail::RoundOnce once(t);
    const bfloat16* copy = detail::autocast_cached(t.data<float>() + 3);
    BOOST_REQUIRE(copy != nullptr);
    BOOST_TEST(copy->bits == bfloat16(t.data<float>()[3]).bits);
  }
  BOOST_TEST(detail::autocast_cached(t.data<float>()) == nullptr);
  {
    detail::RoundOnce once(w);
    detail::autocast_keep(w);
  }
  BOOST_TEST(detail::autocast_cached(w.data<float>()) != nullptr);
}

// GEMMs that run on the pool's workers (attention's heads, the recurrences'
// parts) take the caller's precision: 2 threads give 1 thread's result, and
// both differ from float32's.
BOOST_AUTO_TEST_CASE(pool_workers_take_the_callers_precision) {
  Tensor q = random({2, 4, 64, 32}, 7), k = random({2, 4, 64, 32}, 8), v = random({2, 4, 64, 32}, 9);
  Tensor xp = random({6, 8, 4 * 64}, 10), w_hh = random({4 * 64, 64}, 11) * 0.1;
  w_hh.requires_grad_();
  auto run = [&](int threads, bool bf16) {
    set_num_threads(threads);
    AutocastGuard precision(bf16 ? DType::bf16 : DType::f32);
    return std::pair{scaled_dot_product_attention(q, k, v, true), lstm_recurrence(xp, w_hh)};
  };
  auto [a1, l1] = run(1, true);
  auto [a2, l2] = run(2, true);
  auto [a32, l32] = run(2, false);
  BOOST_TEST(max_abs_diff(a1, a2) < 1e-6);
  BOOST_TEST(max_abs_diff(l1, l2) < 1e-6);
  BOOST_TEST(max_abs_diff(a1, a32) > 1e-4);
  BOOST_TEST(max_abs_diff(l1, l32) > 1e-4);
  BOOST_TEST(max_abs_diff(a1, a32) < 5e-2);
  BOOST_TEST(max_abs_diff(l1, l32) < 5e-2);
  set_num_threads(2);
}

// Under bfloat16 autocast with enough batch rows, the recurrences split a
// step by batch rows (W_hh stays packed across steps) rather than by units:
// at 2 threads that split must give what 1 thread gives (one part, every
// row), outputs and the gradients of xp, w_hh and h0, up to the order of
// float32 sums; with few rows, or in float32, the split stays by units.
BOOST_AUTO_TEST_CASE(recurrences_split_by_rows_under_autocast) {
  const int64_t T = 5, B = 32, H = 64;
  struct Cell {
    const char* name;
    int64_t gates;
    std::function<Tensor(const Tensor&, const Tensor&, const Tensor&)> run;
  };
  using Args = const Tensor&;
  const std::vector<Cell> cells{
      {"rnn_tanh", 1, [](Args xp, Args w, Args h0) { return rnn_tanh_recurrence(xp, w, h0); }},
      {"lstm", 4, [](Args xp, Args w, Args h0) { return lstm_recurrence(xp, w, h0); }},
      {"gru", 3, [](Args xp, Args w, Args h0) { return gru_recurrence(xp, w, Tensor(), h0); }},
  };
  for (const Cell& cell : cells) {
    const Tensor w = (random({cell.gates * H, H}, 61) * 0.1).requires_grad_();
    auto run = [&](int threads) {
      set_num_threads(threads);
      AutocastGuard bf16(DType::bf16);
      const Tensor xp = random({T, B, cell.gates * H}, 62).requires_grad_(), h0 = random({B, H}, 63).requires_grad_();
      const Tensor out = cell.run(xp, w, h0);
      std::vector<Tensor> result = grad({sum(mul(out, random(out.shape(), 64)))}, {xp, w, h0});
      result.insert(result.begin(), out);
      return result;
    };
    const std::vector<Tensor> one = run(1), two = run(2);
    for (size_t k = 0; k < one.size(); ++k) {
      const double scale = std::max(1.0, max_abs_diff(one[k], zeros(one[k].shape())));
      BOOST_TEST(max_abs_diff(one[k], two[k]) <= 1e-5 * scale, cell.name << " result " << k);
    }
  }
  using detail::rnn::StepSplit;
  set_num_threads(2);
  {
    AutocastGuard bf16(DType::bf16);
    BOOST_TEST(StepSplit({T, B, H}, 4, DType::f32).by_rows);
    BOOST_TEST(!StepSplit({T, 8, H}, 4, DType::f32).by_rows);  // 4 rows a thread: by units
    BOOST_TEST(!StepSplit({T, B, H}, 4, DType::f64).by_rows);
  }
  BOOST_TEST(!StepSplit({T, B, H}, 4, DType::f32).by_rows);  // float32 GEMMs repack W_hh every step
}

// The parts of a by-rows recurrence, one a thread, all multiply by W_hh^T:
// each packs a copy of its own once for all T steps. Where oneDNN has no
// bfloat16 matmul (GEMMs on widened copies) nothing is packed.
BOOST_AUTO_TEST_CASE(rows_parts_pack_the_weight_once_each) {
  const int64_t T = 4, B = 32, H = 80;  // a shape no other case packs
  const Tensor w = (random({4 * H, H}, 65) * 0.1).requires_grad_(), xp = random({T, B, 4 * H}, 66);
  set_num_threads(2);
  AutocastGuard bf16(DType::bf16);
  NoGradGuard ng;
  const detail::rnn::StepSplit split({T, B, H}, 4, DType::f32);
  BOOST_REQUIRE(split.by_rows);
  const size_t before = detail::onednn_packed_bytes();
  const uint64_t packs_before = detail::onednn_packs();
  lstm_recurrence(xp, w, Tensor(), Tensor());
  const size_t packed = detail::onednn_packed_bytes() - before;  // a new primitive's (16 rows a part)
  const uint64_t packs = detail::onednn_packs() - packs_before;
  const size_t one = static_cast<size_t>(H * 4 * H) * sizeof(bfloat16), parts = static_cast<size_t>(split.parts);
  if (detail::onednn_has_bf16()) {
    BOOST_TEST(packs == parts);
    BOOST_TEST(packed >= parts * one);
    BOOST_TEST(packed < 2 * parts * one);
  } else {
    BOOST_TEST(packs == 0u);
    BOOST_TEST(packed == 0u);
  }
}

// The parts of a by-units recurrence multiply by rows of W_hh of their own,
// each as large as the others': every part packs its rows once and reads
// them from then on (taking turns on one copy of the shape, the parts
// repacked it at every step), and the output is the one-thread one.
BOOST_AUTO_TEST_CASE(units_parts_pack_their_own_rows_once) {
  const int64_t T = 6, B = 8, H = 96;  // a shape no other case packs
  const Tensor w = (random({4 * H, H}, 67) * 0.1).requires_grad_(), xp = random({T, B, 4 * H}, 68);
  AutocastGuard bf16(DType::bf16);
  NoGradGuard ng;
  set_num_threads(1);
  const Tensor one = lstm_recurrence(xp, w, Tensor(), Tensor());
  set_num_threads(2);
  const detail::rnn::StepSplit split({T, B, H}, 4, DType::f32);
  BOOST_REQUIRE(!split.by_rows);
  BOOST_REQUIRE(split.parts == 2);
  const uint64_t before = detail::onednn_packs();
  const Tensor two = lstm_recurrence(xp, w, Tensor(), Tensor());
  const uint64_t packs = detail::onednn_packs() - before;
  BOOST_TEST(packs == (detail::onednn_has_bf16() ? static_cast<uint64_t>(split.parts) : 0u));
  BOOST_TEST(max_abs_diff(one, two) <= 1e-5 * std::max(1.0, max(abs(one)).item()));
}

// A thread's packed copies are freed when it ends: a program that starts
// threads for its work does not pile them up.
BOOST_AUTO_TEST_CASE(a_threads_packed_copies_end_with_it) {
  const int64_t T = 4, B = 8, H = 112;  // a shape no other case packs
  const Tensor w = (random({4 * H, H}, 69) * 0.1).requires_grad_(), xp = random({T, B, 4 * H}, 70);
  set_num_threads(1);  // every step's GEMM on the thread below
  const size_t before = detail::onednn_packed_bytes();
  size_t during = 0;
  std::thread([&] {
    AutocastGuard bf16(DType::bf16);
    NoGradGuard ng;
    lstm_recurrence(xp, w, Tensor(), Tensor());
    during = detail::onednn_packed_bytes();
  }).join();
  if (detail::onednn_has_bf16()) BOOST_TEST(during > before);
  BOOST_TEST(detail::onednn_packed_bytes() == before);
}

// grad() with create_graph under autocast: a Hessian-vector product of a
// small MLP, within bfloat16's tolerance of float32's.
BOOST_AUTO_TEST_CASE(create_graph_under_autocast) {
  Tensor x = random({16, 32}, 12), w1 = (random({32, 48}, 13) * 0.2).requires_grad_(),
         w2 = (random({48, 1}, 14) * 0.2).requires_grad_(), v1 = random({32, 48}, 15), v2 = random({48, 1}, 16);
  auto hvp = [&](bool bf16) {
    AutocastGuard precision(bf16 ? DType::bf16 : DType::f32);
    Tensor loss = sum(pow(matmul(tanh(matmul(x, w1)), w2), 2.0));
    auto g = grad({loss}, {w1, w2}, {}, {.create_graph = true});
    Tensor dot = add(sum(mul(g[0], v1)), sum(mul(g[1], v2)));
    return grad({dot}, {w1, w2});
  };
  auto h16 = hvp(true), h32 = hvp(false);
  for (int k = 0; k < 2; ++k) {
    const double scale = max(abs(h32[k])).item();
    BOOST_TEST(max_abs_diff(h16[k], h32[k]) < 3e-2 * scale);
    BOOST_TEST(max_abs_diff(h16[k], h32[k]) > 0.0);
  }
}

// Attention's q, k, v as views of one projection, as a transformer layer
// makes them: (B,T,3,H,D) -> three (B,H,T,D).
struct Projected {
  Tensor qkv, q, k, v;
};
Projected project(const Tensor& x, const Tensor& w, int64_t H) {
  Projected p;
  const int64_t B = x.shape()[0], T = x.shape()[1], D = w.shape()[1] / (3 * H);
  p.qkv = matmul(x, w);
  Tensor heads = reshape(p.qkv, {B, T, 3, H, D});
  p.q = permute(select(heads, 2, 0), {0, 2, 1, 3});
  p.k = permute(select(heads, 2, 1), {0, 2, 1, 3});
  p.v = permute(select(heads, 2, 2), {0, 2, 1, 3});
  return p;
}

// Under autocast the attention node keeps bfloat16 copies of q, k, v (what
// its GEMMs read), so the float32 projection they are views of is freed
// once the forward is done with it; in float32 the graph holds it.
BOOST_AUTO_TEST_CASE(attention_under_autocast_keeps_bfloat16_copies_of_q_k_v) {
  const int64_t B = 2, T = 16, H = 2, C = 32;
  Tensor x = random({B, T, C}, 21), w = (random({C, 3 * C}, 22) * 0.2).requires_grad_();
  auto projection_held = [&](bool bf16) {
    AutocastGuard precision(bf16 ? DType::bf16 : DType::f32);
    Tensor out;
    std::weak_ptr<Storage> projection;
    {
      Projected p = project(x, w, H);
      projection = p.qkv.storage();
      out = scaled_dot_product_attention(p.q, p.k, p.v, true);
    }
    const bool held = !projection.expired();
    sum(out).backward();  // and the kept copies differentiate
    BOOST_TEST(max(abs(w.grad())).item() > 0.0);
    w.grad() = Tensor();
    return held;
  };
  BOOST_TEST(projection_held(false));
  BOOST_TEST(!projection_held(true));
}

// A Hessian-vector product through attention whose q, k, v come from a
// projection: under autocast its node keeps bfloat16 copies, which a
// recorded backward reads as float32 attached to the projection's graph, so
// the second derivative reaches w as in float32 (within bfloat16's tolerance).
BOOST_AUTO_TEST_CASE(create_graph_through_attention_under_autocast) {
  Tensor x = random({2, 8, 16}, 31), w = (random({16, 48}, 32) * 0.3).requires_grad_(), v = random({16, 48}, 33);
  check_hvp_under_autocast(w, v, [&] {
    Projected p = project(x, w, 2);
    return sum(pow(scaled_dot_product_attention(p.q, p.k, p.v, true), 2.0));
  });
}

// gelu under autocast computes on its input's bfloat16 copy and keeps only
// that: its value and gradient are float32 gelu's at the rounded input, bit
// for bit, the float32 input is freed after the forward, an MLP's second
// Linear keeps its own bfloat16 copy of gelu's output (so backward rebuilds
// neither gelu nor the layer_norm before the first Linear), and a recorded
// backward differentiates through it.
BOOST_AUTO_TEST_CASE(gelu_under_autocast_computes_on_and_keeps_the_bfloat16_copy) {
  for (bool tanh_form : {false, true}) {
    Tensor a = random({64, 48}, 81).requires_grad_(), g = random({64, 48}, 82);
    Tensor x32 = (a * 2.0).detach();  // what the autocast forward sees
    Tensor xr = x32.to(DType::bf16).to(DType::f32).requires_grad_();
    Tensor ref = gelu(xr, tanh_form);
    ref.backward(g);
    const Tensor ref_grad = xr.grad() * 2.0;
    std::weak_ptr<Storage> input;
    Tensor y;
    {
      AutocastGuard bf16(DType::bf16);
      Tensor x = a * 2.0;
      input = x.storage();
      y = gelu(x, tanh_form);
    }
    BOOST_TEST(input.expired(), "the node kept the float32 input");
    BOOST_TEST(max_abs_diff(y, ref) == 0.0);
    y.backward(g);
    BOOST_TEST(max_abs_diff(a.grad(), ref_grad) == 0.0);
  }
  // An odd size (the rounding pass's tails), contiguous and as a transposed view.
  for (bool transposed : {false, true}) {
    const Tensor x = random({37, 1029}, 86) * 2.0, xt = transposed ? x.t() : x;
    AutocastGuard bf16(DType::bf16);
    const Tensor ref = [&] {
      AutocastGuard off(DType::f32);
      return gelu(xt.to(DType::bf16).to(DType::f32));
    }();
    BOOST_TEST(max_abs_diff(gelu(xt), ref) == 0.0, (transposed ? "transposed" : "contiguous"));
  }
  // On a leaf (kept in float32): the backward, and an output rebuilt for mul (which saves it by
  // reference), still see the rounded input.
  {
    Tensor xl = random({8, 12}, 87).requires_grad_();
    Tensor xr = xl.detach().to(DType::bf16).to(DType::f32).requires_grad_();
    Tensor ref = gelu(xr);
    sum(mul(ref, ref)).backward();
    Tensor y;
    {
      AutocastGuard bf16(DType::bf16);
      y = gelu(xl);
    }
    sum(mul(y, y)).backward();
    BOOST_TEST(max_abs_diff(y, ref) == 0.0);
    BOOST_TEST(max_abs_diff(xl.grad(), xr.grad()) == 0.0);
  }
  // An MLP after a layer norm: the Linears' weight gradients read their own
  // bfloat16 copies of what they multiplied; nothing is rebuilt.
  Tensor x = random({32, 16}, 83), w1 = (random({64, 16}, 84) * 0.3).requires_grad_();
  Tensor w2 = (random({8, 64}, 85) * 0.3).requires_grad_();
  Tensor h;
  {
    AutocastGuard bf16(DType::bf16);
    h = gelu(linear(layer_norm(x, ones({16}).requires_grad_(), Tensor()), w1));
    Tensor loss = sum(linear(h, w2));
    profiler_reset();
    profiler_enable(true);
    loss.backward();
    profiler_enable(false);
  }
  const std::string report = profiler_report();
  BOOST_TEST(report.find("linear (backward)") != std::string::npos, report);
  BOOST_TEST(report.find("(recompute)") == std::string::npos, report);
  const Tensor expect = matmul(ones({8, 32}), h.to(DType::bf16).to(DType::f32));  // g^T h, g all ones
  BOOST_TEST(max_abs_diff(w2.grad(), expect) < 1e-4 * (1.0 + max(abs(expect)).item()));
  // Recorded: a Hessian-vector product through gelu under autocast is float32's within bfloat16's error.
  Tensor v = random({64, 16}, 86);
  check_hvp_under_autocast(w1, v, [&] { return sum(pow(gelu(linear(x, w1)), 2.0)); });
}

// Under autocast lstm_recurrence keeps its gates (T,B,4H) in bfloat16: half
// the bytes held between forward and backward; its plain backward reads them
// so, and a recorded one (a Hessian-vector product, through the gates' side
// output) reads their float32 values and stays within bfloat16's error of
// float32's.
BOOST_AUTO_TEST_CASE(lstm_under_autocast_keeps_its_gates_in_bfloat16) {
  const int64_t T = 6, B = 4, H = 32;
  Tensor x = random({T, B, 16}, 91), wi = (random({4 * H, 16}, 92) * 0.3).requires_grad_();
  Tensor wh = (random({4 * H, H}, 93) * 0.3).requires_grad_(), v = random({4 * H, H}, 94);
  auto held_after_forward = [&](bool bf16) {
    AutocastGuard precision(bf16 ? DType::bf16 : DType::f32);
    Tensor xp = linear(x, wi);
    empty_cache();  // each block new, of its own size class, whatever earlier cases left cached
    const size_t before = memory_stats().bytes_in_use;
    Tensor out = lstm_recurrence(xp, wh, Tensor(), Tensor());
    return memory_stats().bytes_in_use - before;
  };
  const size_t f32 = held_after_forward(false), bf16 = held_after_forward(true);
  BOOST_TEST(f32 - bf16 == static_cast<size_t>(T * B * 4 * H * 2), "float32 " << f32 << ", bfloat16 " << bf16);
  check_hvp_under_autocast(wh, v,
                           [&] { return sum(pow(lstm_recurrence(linear(x, wi), wh, Tensor(), Tensor()), 2.0)); });
}

// linear's backward with a bias rounds g and sums its rows in one pass: the
// bias's gradient is sum_to's float32 sum bit for bit, and the GEMMs get the
// same rounded g as without a bias; at 1 and 2 threads (columns split).
BOOST_AUTO_TEST_CASE(linear_bias_gradient_rides_on_the_rounding_of_g) {
  const int threads_before = num_threads();
  const Tensor x = random({3, 70, 48}, 51), w = random({300, 48}, 52) * 0.2, g = random({3, 70, 300}, 53);
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    auto grads = [&](bool with_bias) {
      const Tensor xl = x.clone().requires_grad_(), wl = w.clone().requires_grad_();
      const Tensor bl = zeros({300}).requires_grad_();
      AutocastGuard bf16(DType::bf16);
      Tensor y = linear(xl, wl, with_bias ? bl : Tensor());
      y.backward(g);
      return std::vector<Tensor>{xl.grad(), wl.grad(), bl.grad()};
    };
    const std::vector<Tensor> fused = grads(true), plain = grads(false);
    BOOST_TEST(max_abs_diff(fused[0], plain[0]) == 0.0, threads << " threads");
    BOOST_TEST(max_abs_diff(fused[1], plain[1]) == 0.0, threads << " threads");
    BOOST_TEST(max_abs_diff(fused[2], sum_to(g, {300})) == 0.0, threads << " threads");
    BOOST_TEST(max_abs_diff(fused[1], product(g.reshape({210, 300}).t(), x.reshape({210, 48}), true)) < 1e-3);
  }
  set_num_threads(threads_before);
}

// Under autocast a product keeps the bfloat16 copy of an operand that an op
// computed (GEMMs read it in forward and backward), where a leaf operand is
// rounded by each GEMM that reads it: the same values, so the same results,
// bit for bit, for linear, matmul and attention.
BOOST_AUTO_TEST_CASE(kept_bfloat16_operands_give_what_rounding_in_each_gemm_gives) {
  AutocastGuard bf16(DType::bf16);
  const Tensor w = (random({24, 16}, 41) * 0.3).requires_grad_(), bias = random({24}, 42).requires_grad_();
  const std::vector<Tensor> init{random({4, 5, 16}, 43), random({4, 16, 6}, 44), random({2, 2, 5, 4}, 45),
                                 random({2, 2, 5, 4}, 46), random({2, 2, 5, 3}, 47)};
  auto run = [&](bool computed) {
    std::vector<Tensor> leaves, in;
    for (const Tensor& t : init) {
      leaves.push_back(t.clone().requires_grad_());
      in.push_back(computed ? mul(leaves.back(), 1.0) : leaves.back());  // an op's output, or the leaf itself
    }
    const std::vector<Tensor> outs{linear(in[0], w, bias), matmul(in[0], in[1]),
                                   scaled_dot_product_attention(in[2], in[3], in[4], true)};
    Tensor loss = sum(pow(outs[0], 2.0));
    for (size_t k = 1; k < outs.size(); ++k) loss = add(loss, sum(pow(outs[k], 2.0)));
    std::vector<Tensor> result = outs, wrt = leaves;
    wrt.push_back(w);
    wrt.push_back(bias);
    for (const Tensor& g : grad({loss}, wrt)) result.push_back(g);
    return result;
  };
  const std::vector<Tensor> kept = run(true), rounded_each_time = run(false);
  for (size_t k = 0; k < kept.size(); ++k)
    BOOST_TEST(max_abs_diff(kept[k], rounded_each_time[k]) == 0.0, "result " << k);
}

// ---------------------------------------------------------------- the op table

// Every sample of every op, in float32 under autocast, against float64: the
// value and the gradient (a backward with a fixed cotangent) within
// bfloat16's tolerance: each operand of a GEMM rounded loses 2^-9, a product
// 2^-8, and the samples' reductions are short, so 2^-6 of the result's scale.
// Ops without GEMMs must give float32's results bit for bit. The ops whose
// results autocast changes are listed: doc/autograd.md's table comes from this.
BOOST_AUTO_TEST_CASE(every_op_under_autocast_against_float64) {
  std::set<std::string> changed;
  int samples = 0;
  for (const OpDef* op : op_table()) {
    int ran = 0;
    for (const OpSample& s : op->samples()) {
      auto run = [&](DType dtype, bool bf16) {
        std::vector<Tensor> in, wrt;
        for (const Tensor& t : s.inputs) {
          if (!t.defined() || !is_floating(t.dtype())) {
            in.push_back(t);
            continue;
          }
          Tensor c = t.detach().to(dtype);
          if (t.requires_grad()) wrt.push_back(c.requires_grad_());
          in.push_back(c);
        }
        AutocastGuard precision(bf16 ? DType::bf16 : DType::f32);
        Tensor out = s.fn(in);
        std::vector<Tensor> result{out.detach().to(DType::f64)};
        Tensor u = samples::uniform(out.shape(), 97).to(out.dtype());
        for (const Tensor& gk : grad({out}, wrt, {u}, {.allow_unused = true}))
          result.push_back(gk.defined() ? gk.to(DType::f64) : Tensor());
        return result;
      };
      const std::vector<Tensor> ref = run(DType::f64, false), f32 = run(DType::f32, false), ac = run(DType::f32, true);
      ++ran;
      for (size_t k = 0; k < ref.size(); ++k) {
        if (!ref[k].defined()) continue;
        const double scale = 1.0 + max(abs(ref[k])).item();
        const double err = max_abs_diff(ac[k], ref[k]);
        BOOST_TEST(err <= std::ldexp(scale, -6), op->name << " / " << s.desc << (k ? " gradient " : " value ") << k
                                                          << ": off by " << err << " at scale " << scale);
        if (max_abs_diff(ac[k], f32[k]) > 0) changed.insert(std::string(op->name));
      }
      ++samples;
    }
    BOOST_TEST(ran > 0, op->name << ": no sample runs in float32");
  }
  std::string list;
  for (const std::string& n : changed) list += (list.empty() ? "" : ", ") + n;
  BOOST_TEST_MESSAGE(samples << " samples in float32; ops whose results autocast changes: " << list);
  // Exactly the ops with GEMMs inside (doc/autograd.md's table lists them; and
  // checkpoint, whose samples' functions hold a matmul) and gelu, which runs
  // on its input's bfloat16 copy: one missing ran in float32, one extra lost
  // precision where autocast does not round.
  const std::set<std::string> bf16_ops{"checkpoint",     "gated_recurrence_grad", "gelu",
                                       "gru_recurrence", "linear",                "lstm_recompute",
                                       "lstm_recurrence", "lstm_recurrence_grad", "matmul",
                                       "rnn_tanh_recurrence", "scaled_dot_product_attention"};
  BOOST_TEST((changed == bf16_ops), "changed under autocast: " << list);
}
