#define BOOST_TEST_MODULE reduce
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <limits>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
namespace tt = boost::test_tools;

namespace {

Tensor m23() { return from_vector(std::vector<double>{1, 5, 3, 4, 2, 6}, {2, 3}); }

}  // namespace

BOOST_AUTO_TEST_CASE(sum_and_mean_values) {
  Tensor x = m23();
  BOOST_TEST(sum(x).item() == 21.0);
  BOOST_TEST(sum(x, {0}).to_vector<double>() == (std::vector<double>{5, 7, 9}), tt::per_element());
  Tensor k = sum(x, {-1}, true);
  BOOST_TEST(k.shape() == (Shape{2, 1}));
  BOOST_TEST(k.to_vector<double>() == (std::vector<double>{9, 12}), tt::per_element());
  BOOST_TEST(mean(x, {1}).to_vector<double>() == (std::vector<double>{3, 4}), tt::per_element());
  BOOST_TEST(sum(x.t(), {1}).to_vector<double>() == (std::vector<double>{5, 7, 9}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(var_and_std_values) {
  Tensor x = tensor({1.0, 2.0, 3.0, 4.0});
  BOOST_CHECK_CLOSE(var(x).item(), 5.0 / 3.0, 1e-12);    // unbiased
  BOOST_CHECK_CLOSE(var(x, {}, 0).item(), 1.25, 1e-12);  // population
  BOOST_CHECK_CLOSE(tg::std(x).item(), std::sqrt(5.0 / 3.0), 1e-12);
  Tensor v = var(m23(), {1});  // rows (1,5,3): mean 3, var 4; (4,2,6): mean 4, var 4
  BOOST_TEST(v.to_vector<double>() == (std::vector<double>{4, 4}), tt::per_element());
  Tensor v0 = var(m23(), {0}, 1, true);  // columns: (1,4) (5,2) (3,6) -> 4.5 each
  BOOST_TEST(v0.shape() == (Shape{1, 3}));
  BOOST_TEST(v0.to_vector<double>() == (std::vector<double>{4.5, 4.5, 4.5}), tt::per_element());
  // Far from zero, the two-pass kernel keeps full accuracy in float32.
  Tensor big = tensor({1e4f + 1, 1e4f + 2, 1e4f + 3});
  BOOST_CHECK_CLOSE(var(big).item(), 1.0, 1e-3);
}

BOOST_AUTO_TEST_CASE(var_backward_by_hand) {
  Tensor x = tensor({1.0, 2.0, 3.0, 4.0}).requires_grad_();
  var(x).backward();  // d var / dx = 2 (x - mean) / (N - 1)
  std::vector<double> expected{-1.0, -1.0 / 3, 1.0 / 3, 1.0};
  std::vector<double> got = x.grad().to_vector<double>();
  for (int k = 0; k < 4; ++k) BOOST_CHECK_CLOSE(got[k], expected[k], 1e-10);
}

BOOST_AUTO_TEST_CASE(logsumexp_values_and_stability) {
  Tensor x = from_vector(std::vector<double>{0, 0, 1e4, 1e4, -1e4, -1e4}, {3, 2});
  Tensor l = logsumexp(x, {1});
  BOOST_CHECK_CLOSE(l.at({0}), std::log(2.0), 1e-10);
  BOOST_CHECK_CLOSE(l.at({1}), 1e4 + std::log(2.0), 1e-12);
  BOOST_CHECK_CLOSE(l.at({2}), -1e4 + std::log(2.0), 1e-12);
  Tensor f = logsumexp(from_vector(std::vector<float>{1e4f, 1e4f}, {2}), {0});
  BOOST_TEST(std::isfinite(f.item()));
  const double inf = std::numeric_limits<double>::infinity();
  BOOST_TEST(logsumexp(tensor({-inf, -inf}), {0}).item() == -inf);
  Tensor k = logsumexp(m23(), {0, 1}, true);
  BOOST_TEST(k.shape() == (Shape{1, 1}));
  BOOST_CHECK_CLOSE(k.item(),
                    std::log(std::exp(1.) + std::exp(5.) + std::exp(3.) + std::exp(4.) + std::exp(2.) + std::exp(6.)),
                    1e-10);
  // The gradient is the softmax of the row.
  Tensor y = tensor({0.0, std::log(3.0)}).requires_grad_();
  logsumexp(y, {0}).backward();
  BOOST_CHECK_CLOSE(y.grad().at({0}), 0.25, 1e-10);
  BOOST_CHECK_CLOSE(y.grad().at({1}), 0.75, 1e-10);
}

BOOST_AUTO_TEST_CASE(max_min_arg_values) {
  Tensor x = m23();  // [[1,5,3],[4,2,6]]
  BOOST_TEST(max(x, 1).to_vector<double>() == (std::vector<double>{5, 6}), tt::per_element());
  BOOST_TEST(min(x, 0).to_vector<double>() == (std::vector<double>{1, 2, 3}), tt::per_element());
  BOOST_TEST(argmax(x, 1).to_vector<int64_t>() == (std::vector<int64_t>{1, 2}), tt::per_element());
  BOOST_TEST(argmin(x, 0).to_vector<int64_t>() == (std::vector<int64_t>{0, 1, 0}), tt::per_element());
  BOOST_TEST(argmax(x, -1, true).shape() == (Shape{2, 1}));
  BOOST_TEST(max(x, 0, true).shape() == (Shape{1, 3}));
  BOOST_TEST(max(x).item() == 6.0);
  BOOST_TEST(min(x).item() == 1.0);
  BOOST_TEST(max(x.t(), 0).to_vector<double>() == (std::vector<double>{5, 6}), tt::per_element());
  // Ties: the first extreme index.
  Tensor t = tensor({2.0, 7.0, 7.0, 1.0, 1.0});
  BOOST_TEST(argmax(t, 0).item<int64_t>() == 1);
  BOOST_TEST(argmin(t, 0).item<int64_t>() == 3);
  // Integer tensors reduce too (no gradient).
  BOOST_TEST(argmax(from_vector(std::vector<int64_t>{3, 9, 2}, {3}), 0).item<int64_t>() == 1);
  BOOST_TEST(max(from_vector(std::vector<int64_t>{3, 9, 2}, {3})).item<int64_t>() == 9);
}

BOOST_AUTO_TEST_CASE(max_gradient_goes_to_first_extreme) {
  Tensor x = from_vector(std::vector<double>{1, 7, 7, 3, 0, 0}, {2, 3}).requires_grad_();
  Tensor w = tensor({10.0, 20.0});
  sum(mul(max(x, 1), w)).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0, 10, 0, 20, 0, 0}), tt::per_element());
  Tensor y = from_vector(std::vector<double>{1, 7, 3, 0}, {2, 2}).requires_grad_();
  min(y).backward();
  BOOST_TEST(y.grad().to_vector<double>() == (std::vector<double>{0, 0, 0, 1}), tt::per_element());
  Tensor z = from_vector(std::vector<double>{1, 7, 3, 0}, {2, 2}).requires_grad_();
  max(z.t(), 1).backward(tensor({1.0, 2.0}));  // z^T = [[1,3],[7,0]]: maxima at z[1][0] and z[0][1]
  BOOST_TEST(z.grad().to_vector<double>() == (std::vector<double>{0, 2, 1, 0}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(last_axis_reductions_take_no_copy) {
  Generator g(1);
  Tensor x = randn({64, 128}, DType::f32, &g);
  const uint64_t before = memory_stats().allocations;
  Tensor l = logsumexp(x, {-1});
  BOOST_TEST(memory_stats().allocations - before == 1u);  // the result only
  BOOST_TEST(l.shape() == (Shape{64}));
  const uint64_t before_max = memory_stats().allocations;
  max(x, -1);
  BOOST_TEST(memory_stats().allocations - before_max == 2u);  // values and indices
}

BOOST_AUTO_TEST_CASE(reduce_errors) {
  Tensor x = m23();
  BOOST_CHECK_THROW(sum(x, {2}), IndexError);
  BOOST_CHECK_THROW(var(x, {0, -2}), ShapeError);  // repeated axis
  BOOST_CHECK_THROW(var(x, {}, -1), ValueError);
  BOOST_CHECK_THROW(var(from_vector(std::vector<int64_t>{1, 2}, {2})), DTypeError);
  BOOST_CHECK_THROW(logsumexp(from_vector(std::vector<int64_t>{1, 2}, {2}), {0}), DTypeError);
  BOOST_CHECK_THROW(max(x, 3), IndexError);
  BOOST_CHECK_THROW(argmin(x, -3), IndexError);
  BOOST_CHECK_THROW(max(zeros({2, 0}), 1), ValueError);
  BOOST_CHECK_THROW(min(zeros({0})), ValueError);
  BOOST_CHECK_THROW(sum_to(x, {4, 3}), ShapeError);
  BOOST_CHECK_THROW(max(Tensor()), ValueError);
}
