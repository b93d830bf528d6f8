#define BOOST_TEST_MODULE matmul
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "autograd/autograd.h"
#include "autograd/blas.h"
#include "autograd/gradcheck.h"
#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/view.h"
#include "autograd/storage.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;

namespace {

// Every value of a equals b's within tol (same shape).
void check_close(const Tensor& a, const Tensor& b, double tol = 1e-5) {
  BOOST_REQUIRE(a.shape() == b.shape());
  std::vector<double> va = a.to(DType::f64).to_vector<double>(), vb = b.to(DType::f64).to_vector<double>();
  for (size_t k = 0; k < va.size(); ++k) BOOST_CHECK_SMALL(va[k] - vb[k], tol);
}

// The reference product: plain loops over (batch, M, N, K) in double.
Tensor naive_matmul(const Tensor& a3, const Tensor& b3) {  // (B,M,K) @ (B,K,N)
  const int64_t B = a3.size(0), M = a3.size(1), K = a3.size(2), N = b3.size(2);
  std::vector<double> out(B * M * N, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        for (int64_t k = 0; k < K; ++k) out[(b * M + i) * N + j] += a3.at({b, i, k}) * b3.at({b, k, j});
  return from_vector(out, {B, M, N});
}

}  // namespace

BOOST_AUTO_TEST_CASE(matmul_2d_hand_computed) {
  Tensor a = from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector(std::vector<float>{7, 8, 9, 10, 11, 12}, {3, 2});
  Tensor c = matmul(a, b);
  BOOST_TEST(c.shape() == (Shape{2, 2}));
  BOOST_TEST(c.to_vector<float>() == (std::vector<float>{58, 64, 139, 154}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(matmul_1d_cases) {
  Tensor v = tensor({1.0, 2.0, 3.0}), w = tensor({4.0, 5.0, 6.0});
  Tensor dot = matmul(v, w);
  BOOST_TEST(dot.dim() == 0);
  BOOST_TEST(dot.item() == 32.0);
  Tensor m = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor vm = matmul(v, m);  // (3) @ (3,2) -> (2)
  BOOST_TEST(vm.shape() == (Shape{2}));
  BOOST_TEST(vm.to_vector<double>() == (std::vector<double>{22, 28}), boost::test_tools::per_element());
  Tensor mv = matmul(m.t(), v);  // (2,3) @ (3) -> (2)
  BOOST_TEST(mv.to_vector<double>() == (std::vector<double>{22, 28}), boost::test_tools::per_element());
  Generator g(5);
  Tensor batch = randn({4, 3, 2}, DType::f64, &g);
  Tensor vb = matmul(v, batch);  // (3) @ (4,3,2) -> (4,2)
  BOOST_TEST(vb.shape() == (Shape{4, 2}));
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t j = 0; j < 2; ++j)
      BOOST_CHECK_CLOSE(vb.at({b, j}), batch.at({b, 0, j}) + 2 * batch.at({b, 1, j}) + 3 * batch.at({b, 2, j}), 1e-9);
}

BOOST_AUTO_TEST_CASE(matmul_batched_and_broadcast_match_loops) {
  Generator g(7);
  Tensor a = randn({3, 4, 5}, DType::f64, &g), b = randn({3, 5, 2}, DType::f64, &g);
  check_close(matmul(a, b), naive_matmul(a, b), 1e-12);
  // (2,1,4,5) @ (3,5,2) -> (2,3,4,2): a broadcast over 3, b over 2.
  Tensor a4 = randn({2, 1, 4, 5}, DType::f64, &g);
  Tensor c = matmul(a4, b);
  BOOST_TEST(c.shape() == (Shape{2, 3, 4, 2}));
  for (int64_t i = 0; i < 2; ++i)
    check_close(c.select(0, i), naive_matmul(expand(a4.select(0, i), {3, 4, 5}), b), 1e-12);
  // Batched @ 2-D folds the batch into one GEMM; the values must not change.
  Tensor w = randn({5, 6}, DType::f64, &g);
  check_close(matmul(a, w), naive_matmul(a, expand(w, {3, 5, 6})), 1e-12);
  check_close(matmul(w.t(), a.transpose(1, 2)), naive_matmul(expand(w.t(), {3, 6, 5}), a.transpose(1, 2)), 1e-12);
}

BOOST_AUTO_TEST_CASE(transposed_views_go_to_gemm_without_copies) {
  Generator g(11);
  Tensor x = randn({6, 4}, DType::f32, &g), y = randn({5, 6}, DType::f32, &g);
  NoGradGuard ng;
  Tensor xt = x.t(), yt = y.t();  // (4,6) and (6,5), both transposed views
  BOOST_REQUIRE(!xt.is_contiguous());
  Tensor expected = matmul(xt.contiguous(), yt.contiguous());
  const uint64_t before = memory_stats().allocations;
  Tensor c = matmul(xt, yt);
  BOOST_TEST(memory_stats().allocations - before == 1u);  // the output only
  check_close(c, expected, 1e-5);
  // A batch of transposed matrices (attention's q @ k^T) is not copied either.
  Tensor q = randn({2, 3, 7, 4}, DType::f32, &g), k = randn({2, 3, 7, 4}, DType::f32, &g);
  Tensor kt = k.transpose(-1, -2);
  Tensor expected_att = matmul(q, kt.contiguous());
  const uint64_t before_att = memory_stats().allocations;
  Tensor att = matmul(q, kt);
  BOOST_TEST(memory_stats().allocations - before_att == 1u);
  check_close(att, expected_att, 1e-5);
  // A strided slice (column stride 2) is not GEMM-readable: it is copied once.
  Tensor s = x.slice(1, 0, 4, 2);  // (6,2)
  const uint64_t before_s = memory_stats().allocations;
  Tensor cs = matmul(y, s);
  BOOST_TEST(memory_stats().allocations - before_s == 2u);
  check_close(cs, matmul(y, s.contiguous()), 1e-5);
}

BOOST_AUTO_TEST_CASE(linear_matches_matmul_plus_bias) {
  Generator g(13);
  Tensor x = randn({2, 3, 4}, DType::f64, &g), w = randn({5, 4}, DType::f64, &g), b = randn({5}, DType::f64, &g);
  Tensor y = linear(x, w, b);
  BOOST_TEST(y.shape() == (Shape{2, 3, 5}));
  check_close(y, add(matmul(x, w.t()), b), 1e-12);
  check_close(linear(x, w), matmul(x, w.t()), 1e-12);
  Tensor v =
      linear(tensor({1.0, -1.0}), from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {3, 2}), tensor({0.5, 0.0, -0.5}));
  BOOST_TEST(v.to_vector<double>() == (std::vector<double>{-0.5, -1.0, -1.5}), boost::test_tools::per_element());
  // One GEMM into the output: no allocation besides the output itself.
  Tensor xf = x.to(DType::f32), wf = w.to(DType::f32), bf = b.to(DType::f32);
  const uint64_t before = memory_stats().allocations;
  Tensor yf = linear(xf, wf, bf);
  BOOST_TEST(memory_stats().allocations - before == 1u);
  check_close(yf, y, 1e-5);
}

BOOST_AUTO_TEST_CASE(linear_backward_by_hand) {
  // y = x W^T + b with x (2,2), W (1,2): dL/dW = sum_rows x, dL/db = rows, dL/dx = W per row.
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor w = from_vector(std::vector<double>{0.5, -1}, {1, 2}).requires_grad_();
  Tensor b = tensor({0.25}).requires_grad_();
  sum(linear(x, w, b)).backward();
  BOOST_TEST(w.grad().to_vector<double>() == (std::vector<double>{4, 6}), boost::test_tools::per_element());
  BOOST_TEST(b.grad().item() == 2.0);
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0.5, -1, 0.5, -1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(matmul_gradients_accumulate_over_broadcast_batch) {
  // a (2,2) is shared by 3 batch entries of b: its gradient sums the three.
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor b = ones({3, 2, 2}, DType::f64).requires_grad_();
  sum(matmul(a, b)).backward();
  // d sum(a @ b_i) / da = 1 1^T b_i^T = all 2s, times 3 batches.
  BOOST_TEST(a.grad().to_vector<double>() == (std::vector<double>{6, 6, 6, 6}), boost::test_tools::per_element());
  // d/db_i = a^T 1 1^T: column sums of a per row of b: (1+3, 2+4).
  BOOST_TEST(b.grad().shape() == (Shape{3, 2, 2}));
  BOOST_TEST(b.grad().to_vector<double>() == (std::vector<double>{4, 4, 6, 6, 4, 4, 6, 6, 4, 4, 6, 6}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(gradient_of_a_transposed_operand_is_dense_after_the_transpose) {
  // The product's gradient for a transposed view is laid out like the view
  // (column-major), so the transpose's backward hands on a dense tensor, which
  // later contributions add into at memory speed. Batched and broadcast too.
  Generator gen(23);
  Tensor a = randn({2, 4, 3}, DType::f64, &gen).requires_grad_(), b = randn({5, 4}, DType::f64, &gen).requires_grad_();
  Tensor w = randn({2, 3, 5}, DType::f64, &gen);
  // (2,3,4) @ (4,5): a read as a^T, b as b^T broadcast over the batch.
  std::vector<Tensor> g = grad({sum(mul(matmul(transpose(a, 1, 2), transpose(b, 0, 1)), w))}, {a, b});
  BOOST_TEST(g[0].is_contiguous());
  BOOST_TEST(g[1].is_contiguous());
  // The values: the same sum with the operands made dense first.
  Tensor at = transpose(a, 1, 2).contiguous(), bt = transpose(b, 0, 1).contiguous();
  std::vector<Tensor> ref = grad({sum(mul(matmul(at, bt), w))}, {a, b});
  check_close(g[0], ref[0], 1e-12);
  check_close(g[1], ref[1], 1e-12);
}

BOOST_AUTO_TEST_CASE(only_needed_gradients_are_computed) {
  Tensor a = from_vector(std::vector<double>{1, 2, 3, 4}, {2, 2}).requires_grad_();
  Tensor b = from_vector(std::vector<double>{1, 0, 0, 1}, {2, 2});
  sum(matmul(a, b)).backward();
  BOOST_TEST(a.grad().to_vector<double>() == (std::vector<double>{1, 1, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(!b.grad().defined());
}

BOOST_AUTO_TEST_CASE(float32_matches_float64) {
  Generator g(17);
  Tensor a = randn({3, 16, 32}, DType::f64, &g), b = randn({32, 8}, DType::f64, &g);
  check_close(matmul(a.to(DType::f32), b.to(DType::f32)), matmul(a, b), 1e-4);
}

BOOST_AUTO_TEST_CASE(empty_and_zero_inner_dims) {
  Tensor c = matmul(zeros({2, 0}), zeros({0, 3}));
  BOOST_TEST(c.shape() == (Shape{2, 3}));
  BOOST_TEST(c.to_vector<float>() == std::vector<float>(6, 0.0f), boost::test_tools::per_element());
  BOOST_TEST(matmul(zeros({0, 4}), zeros({4, 3})).shape() == (Shape{0, 3}));
  Tensor l = linear(zeros({2, 0}), zeros({3, 0}), tensor({1.f, 2.f, 3.f}));
  BOOST_TEST(l.to_vector<float>() == (std::vector<float>{1, 2, 3, 1, 2, 3}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(matmul_errors) {
  BOOST_CHECK_EXCEPTION(matmul(zeros({2, 3}), zeros({4, 5})), ShapeError, [](const ShapeError& e) {
    return std::string(e.what()) == "matmul: cannot multiply (2,3) by (4,5)";
  });
  BOOST_CHECK_THROW(matmul(zeros({3}), zeros({4})), ShapeError);
  BOOST_CHECK_THROW(matmul(zeros({2, 2, 3}), zeros({3, 3, 4})), ShapeError);  // batch 2 vs 3
  BOOST_CHECK_THROW(matmul(scalar(1.0), zeros({3})), ShapeError);
  BOOST_CHECK_THROW(matmul(zeros({2, 3}), zeros({3, 2}, DType::f64)), DTypeError);
  BOOST_CHECK_THROW(matmul(zeros({2, 3}, DType::i64), zeros({3, 2}, DType::i64)), DTypeError);
  BOOST_CHECK_THROW(matmul(Tensor(), zeros({3})), ValueError);
}

BOOST_AUTO_TEST_CASE(linear_errors) {
  BOOST_CHECK_EXCEPTION(linear(zeros({4, 3}), zeros({2, 5})), ShapeError, [](const ShapeError& e) {
    return std::string(e.what()) == "linear: input (4,3) has 3 features, weight (2,5) expects 5";
  });
  BOOST_CHECK_THROW(linear(zeros({4, 3}), zeros({3})), ShapeError);
  BOOST_CHECK_THROW(linear(zeros({4, 3}), zeros({2, 3}), zeros({3})), ShapeError);
  BOOST_CHECK_THROW(linear(zeros({4, 3}), zeros({2, 3}), zeros({2}, DType::f64)), DTypeError);
  BOOST_CHECK_THROW(linear(scalar(1.0), zeros({2, 1})), ShapeError);
}

// ---- the float32 backend: TAPEGRAD_GEMM_F32 and the measured choice.
// Run again with TAPEGRAD_GEMM_F32=openblas and =onednn (meson test
// matmul_openblas, matmul_onednn): every test above passes on either backend.

BOOST_AUTO_TEST_CASE(gemm_f32_policy_parses_the_environment_variable) {
  using detail::GemmF32Policy;
  BOOST_TEST((detail::parse_gemm_f32_policy(nullptr) == GemmF32Policy::measure));
  BOOST_TEST((detail::parse_gemm_f32_policy("") == GemmF32Policy::measure));
  BOOST_TEST((detail::parse_gemm_f32_policy("measure") == GemmF32Policy::measure));
  BOOST_TEST((detail::parse_gemm_f32_policy("openblas") == GemmF32Policy::openblas));
  BOOST_TEST((detail::parse_gemm_f32_policy("onednn") == GemmF32Policy::onednn));
  BOOST_CHECK_EXCEPTION(detail::parse_gemm_f32_policy("OpenBLAS"), ValueError, [](const ValueError& e) {
    return std::string(e.what()) == "TAPEGRAD_GEMM_F32=OpenBLAS: give openblas, onednn or measure";
  });
}

// What this process's TAPEGRAD_GEMM_F32 asks for is what every class runs on;
// under measure, a class runs on oneDNN only where it measured clearly faster.
BOOST_AUTO_TEST_CASE(gemm_f32_backend_follows_the_environment) {
  const std::string info = gemm_backend_info();
  BOOST_TEST_MESSAGE("GEMMs: " << info);
  const char* env = std::getenv("TAPEGRAD_GEMM_F32");
  const detail::GemmF32Policy policy = detail::parse_gemm_f32_policy(env);
  BOOST_TEST((detail::gemm_f32_policy() == policy));
  const std::vector<detail::GemmF32Choice> choices = detail::gemm_f32_choices();
  BOOST_TEST(choices.size() == 4u);
  for (const detail::GemmF32Choice& c : choices) {
    BOOST_TEST_CONTEXT(c.name << " " << c.shape) {
      if (policy == detail::GemmF32Policy::measure) {
        BOOST_TEST(c.openblas_gflops > 0);
        BOOST_TEST(c.onednn_gflops > 0);
        BOOST_TEST((c.backend == detail::GemmBackend::onednn) == (c.onednn_gflops > detail::kOnednnClearWin * c.openblas_gflops));
        BOOST_TEST(info.find(c.name + " " + c.shape + ": ") != std::string::npos, info);
      } else {
        const auto forced = policy == detail::GemmF32Policy::onednn ? detail::GemmBackend::onednn
                                                                    : detail::GemmBackend::openblas;
        BOOST_TEST((c.backend == forced));
        BOOST_TEST(info.find(std::string("TAPEGRAD_GEMM_F32=") + env) != std::string::npos, info);
      }
    }
  }
}

// Both backends, whatever the policy, against a float64 product: every
// shape class, each transpose, leading dimensions wider than the operands,
// alpha and beta.
BOOST_AUTO_TEST_CASE(both_f32_backends_agree_with_float64) {
  struct Case {
    int64_t M, N, K;
  };
  for (Case s : {Case{7, 5, 3}, Case{40, 48, 32}, Case{16, 300, 100}, Case{130, 90, 40}, Case{96, 80, 72}})
    for (int flags = 0; flags < 4; ++flags)
      for (detail::GemmBackend be : {detail::GemmBackend::openblas, detail::GemmBackend::onednn}) {
        const bool ta = flags & 1, tb = flags & 2;
        const int64_t M = s.M, N = s.N, K = s.K;
        // Stored (M,K) or (K,M), (K,N) or (N,K), (M,N); 3 spare columns each.
        const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 3, ldc = N + 3;
        Generator g(M * 1000 + N * 10 + flags);
        std::vector<float> a = randn({(ta ? K : M) * lda}, DType::f32, &g).to_vector<float>();
        std::vector<float> b = randn({(tb ? N : K) * ldb}, DType::f32, &g).to_vector<float>();
        std::vector<float> c = randn({M * ldc}, DType::f32, &g).to_vector<float>();
        const std::vector<float> c0 = c;
        const float alpha = 0.75f, beta = -0.5f;
        detail::gemm_f32_on(be, ta, tb, M, N, K, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
        double worst = 0;
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; ++k) {
              const double t = double(ta ? a[k * lda + i] : a[i * lda + k]) * double(tb ? b[j * ldb + k] : b[k * ldb + j]);
              acc += t, mag += std::abs(t);
            }
            const double expect = alpha * acc + beta * double(c0[i * ldc + j]);
            worst = std::max(worst, std::abs(c[i * ldc + j] - expect) / (1 + mag));
          }
        BOOST_TEST(worst < 1e-5, (be == detail::GemmBackend::onednn ? "oneDNN " : "OpenBLAS ")
                                     << M << "x" << N << "x" << K << " ta " << ta << " tb " << tb << ": " << worst);
        // The spare columns of C are left alone.
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = N; j < ldc; ++j) BOOST_TEST(c[i * ldc + j] == c0[i * ldc + j]);
      }
}

// Run with OPENBLAS_CORETYPE=Prescott too (meson test matmul_prescott): on a
// CPU with AVX2 and FMA, OpenBLAS's SSE3 fallback is 4x slower than oneDNN,
// so the measured choice of the large class must be oneDNN, and every test
// above still passes.
BOOST_AUTO_TEST_CASE(measurement_avoids_a_fallback_openblas_core) {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  const bool forced_fallback = core && std::string(core) == "Prescott" && __builtin_cpu_supports("avx2") &&
                               __builtin_cpu_supports("fma");
  if (!forced_fallback || detail::gemm_f32_policy() != detail::GemmF32Policy::measure) return;
  for (const detail::GemmF32Choice& c : detail::gemm_f32_choices())
    if (c.name == "large") BOOST_TEST((c.backend == detail::GemmBackend::onednn), gemm_backend_info());
}

// A bias (N) lands once on every row of C however the GEMM is cut: the
// pool's parts (rows, columns, or K: only K's first part takes it),
// autocast's slices of a large operand (columns: the bias goes with them;
// K: the first slice only), each precision, alpha 1 (in oneDNN's kernel) or
// not (C starts as the bias), beta 0 or not.
BOOST_AUTO_TEST_CASE(gemm_adds_the_bias_once_to_every_row) {
  struct Case {
    int64_t M, N, K;
  };
  const int threads = num_threads();
  for (Case s : {Case{7, 5, 3}, Case{33, 300, 40}, Case{300, 33, 40}, Case{40, 48, 2048}, Case{24, 1100, 500},
                 Case{64, 64, 4200}}) {
    const int64_t M = s.M, N = s.N, K = s.K;
    Generator g(M + N + K);
    const Tensor a = randn({M, K}, DType::f32, &g), b = randn({N, K}, DType::f32, &g);  // B stored (N,K): op(B) = b^T
    const Tensor c0 = randn({M, N}, DType::f32, &g), bias = randn({N}, DType::f32, &g);
    auto rounded = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f64); };
    const Tensor exact = matmul(a.to(DType::f64), b.to(DType::f64).t());
    const Tensor of_rounded = matmul(rounded(a), rounded(b).t());
    const Tensor mag = matmul(abs(a.to(DType::f64)), abs(b.to(DType::f64)).t());
    for (int n : {1, 2})
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -0.5f}})
        for (const char* path : {"f32", "f64", "bf16", "autocast"}) {
          set_num_threads(n);
          const std::string p = path;
          Tensor c = p == "f64" ? c0.to(DType::f64) : c0.clone();
          if (p == "f64") {
            const Tensor a64 = a.to(DType::f64), b64 = b.to(DType::f64), bias64 = bias.to(DType::f64);
            gemm(false, true, M, N, K, double(alpha), a64.data<double>(), K, b64.data<double>(), K, double(beta),
                 c.data<double>(), N, bias64.data<double>());
          } else if (p == "bf16") {
            const Tensor ab = a.to(DType::bf16), bb = b.to(DType::bf16);
            gemm(false, true, M, N, K, alpha, ab.data<bfloat16>(), K, bb.data<bfloat16>(), K, beta, c.data<float>(), N,
                 bias.data<float>());
          } else {
            std::optional<AutocastGuard> guard;
            if (p == "autocast") guard.emplace(DType::bf16);
            gemm(false, true, M, N, K, alpha, a.data<float>(), K, b.data<float>(), K, beta, c.data<float>(), N,
                 bias.data<float>());
          }
          const Tensor product = p == "bf16" || p == "autocast" ? of_rounded : exact;
          const Tensor expect = product * double(alpha) + c0.to(DType::f64) * double(beta) + bias.to(DType::f64);
          const double worst = max(abs(c.to(DType::f64) - expect) / (mag + 1.0)).item();
          BOOST_TEST(worst < 1e-5, path << " " << M << "x" << N << "x" << K << " threads " << n << " alpha " << alpha
                                        << ": " << worst);
        }
  }
  set_num_threads(threads);
}
