#define BOOST_TEST_MODULE index
#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
namespace tt = boost::test_tools;

namespace {

template <class E>
void check_message(const std::function<void()>& f, const std::string& expected) {
  try {
    f();
    BOOST_ERROR("no exception, expected: " << expected);
  } catch (const E& e) {
    BOOST_TEST(std::string(e.what()) == expected);
  }
}

}  // namespace

BOOST_AUTO_TEST_CASE(index_select_values) {
  Tensor x = from_vector(std::vector<float>{0, 1, 2, 10, 11, 12, 20, 21, 22}, {3, 3});
  Tensor rows = index_select(x, 0, ids({2, 0, 2}));
  BOOST_TEST(rows.shape() == (Shape{3, 3}));
  BOOST_TEST(rows.to_vector<float>() == (std::vector<float>{20, 21, 22, 0, 1, 2, 20, 21, 22}), tt::per_element());
  Tensor cols = index_select(x, 1, ids({1, 0, 0, 2}, {2, 2}));  // index shape replaces the axis
  BOOST_TEST(cols.shape() == (Shape{3, 2, 2}));
  BOOST_TEST(cols.to_vector<float>() == (std::vector<float>{1, 0, 0, 2, 11, 10, 10, 12, 21, 20, 20, 22}),
             tt::per_element());
  Tensor cols_t = index_select(x.t(), 0, ids({1}));  // non-contiguous input: column 1
  BOOST_TEST(cols_t.to_vector<float>() == (std::vector<float>{1, 11, 21}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(index_select_backward_scatter_adds_repeats) {
  Tensor x = zeros({3, 2}, DType::f64).requires_grad_();
  Tensor y = index_select(x, 0, ids({2, 0, 2, 2}));
  Tensor w = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8}, {4, 2});
  sum(mul(y, w)).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{3, 4, 0, 0, 13, 16}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(embedding_values_and_padding_gradient) {
  Tensor w = from_vector(std::vector<double>{0, 0, 1, 1, 2, 2, 3, 3}, {4, 2}).requires_grad_();
  Tensor e = embedding(w, ids({3, 1, 0, 1}, {2, 2}), 1);
  BOOST_TEST(e.shape() == (Shape{2, 2, 2}));
  BOOST_TEST(e.to_vector<double>() == (std::vector<double>{3, 3, 1, 1, 0, 0, 1, 1}), tt::per_element());
  sum(e).backward();
  // Row 1 is the padding row: no gradient although it was looked up twice.
  BOOST_TEST(w.grad().to_vector<double>() == (std::vector<double>{1, 1, 0, 0, 0, 0, 1, 1}), tt::per_element());
  Tensor w2 = ones({4, 2}, DType::f64).requires_grad_();
  sum(embedding(w2, ids({1, 1, 1}))).backward();  // no padding: repeats add up
  BOOST_TEST(w2.grad().to_vector<double>() == (std::vector<double>{0, 0, 3, 3, 0, 0, 0, 0}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(embedding_backward_large_matches_dense_reference) {
  // Enough rows and columns to take the multithreaded column split.
  Generator g(3);
  const int64_t V = 50, C = 96, N = 2000;
  Tensor w = randn({V, C}, DType::f32, &g).requires_grad_();
  Tensor id = randint(0, V, {N}, &g);
  Tensor gy = randn({N, C}, DType::f32, &g);
  embedding(w, id).backward(gy);
  std::vector<double> ref(V * C, 0.0);
  std::vector<int64_t> iv = id.to_vector<int64_t>();
  std::vector<float> gv = gy.to_vector<float>();
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) ref[iv[n] * C + c] += gv[n * C + c];
  std::vector<float> got = w.grad().to_vector<float>();
  for (int64_t k = 0; k < V * C; ++k) BOOST_CHECK_SMALL(got[k] - ref[k], 1e-3);
}

BOOST_AUTO_TEST_CASE(gather_scatter_values) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor g1 = gather(x, 1, ids({2, 0, 1, 1}, {2, 2}));
  BOOST_TEST(g1.to_vector<double>() == (std::vector<double>{3, 1, 5, 5}), tt::per_element());
  Tensor g0 = gather(x, 0, ids({1, 0, 1}, {1, 3}));
  BOOST_TEST(g0.to_vector<double>() == (std::vector<double>{4, 2, 6}), tt::per_element());
  Tensor src = from_vector(std::vector<double>{10, 20, 30, 40}, {2, 2});
  Tensor s = scatter(x, 1, ids({2, 0, 1, 0}, {2, 2}), src);
  BOOST_TEST(s.to_vector<double>() == (std::vector<double>{20, 2, 10, 40, 30, 6}), tt::per_element());
  BOOST_TEST(x.to_vector<double>() == (std::vector<double>{1, 2, 3, 4, 5, 6}), tt::per_element());  // a copy
  Tensor sa = scatter_add(x, 1, ids({2, 2, 0, 0}, {2, 2}), src);
  BOOST_TEST(sa.to_vector<double>() == (std::vector<double>{1, 2, 33, 74, 5, 6}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(scatter_gradients_by_hand) {
  Tensor x = from_vector(std::vector<double>{1, 2, 3}, {1, 3}).requires_grad_();
  Tensor src = from_vector(std::vector<double>{7, 8}, {1, 2}).requires_grad_();
  Tensor w = from_vector(std::vector<double>{1, 10, 100}, {1, 3});
  sum(mul(scatter(x, 1, ids({2, 0}, {1, 2}), src), w)).backward();
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{0, 10, 0}), tt::per_element());
  BOOST_TEST(src.grad().to_vector<double>() == (std::vector<double>{100, 1}), tt::per_element());
  Tensor x2 = zeros({1, 3}, DType::f64).requires_grad_();
  Tensor src2 = zeros({1, 2}, DType::f64).requires_grad_();
  sum(mul(scatter_add(x2, 1, ids({2, 2}, {1, 2}), src2), w)).backward();
  BOOST_TEST(x2.grad().to_vector<double>() == (std::vector<double>{1, 10, 100}), tt::per_element());
  BOOST_TEST(src2.grad().to_vector<double>() == (std::vector<double>{100, 100}), tt::per_element());
}

BOOST_AUTO_TEST_CASE(one_hot_values) {
  Tensor oh = one_hot(ids({2, 0, 1}), 3);
  BOOST_TEST(oh.shape() == (Shape{3, 3}));
  BOOST_CHECK(oh.dtype() == DType::f32);
  BOOST_TEST(oh.to_vector<float>() == (std::vector<float>{0, 0, 1, 1, 0, 0, 0, 1, 0}), tt::per_element());
  BOOST_TEST(one_hot(ids({1, 0}, {2, 1}), 2, DType::i64).to_vector<int64_t>() == (std::vector<int64_t>{0, 1, 1, 0}),
             tt::per_element());
}

BOOST_AUTO_TEST_CASE(index_errors_name_op_index_position_and_bound) {
  Tensor x = zeros({5, 3});
  check_message<IndexError>(
      [&] {
        index_select(x, 0, ids({0, 1, 7}));
      },
      "index_select: index 7 at position (2) is out of range for axis 0 of input (5,3) of size 5");
  check_message<IndexError>(
      [&] {
        embedding(x, ids({0, 1, -1, 2}, {2, 2}));
      },
      "embedding: index -1 at position (1,0) is out of range for weight (5,3) of size 5");
  check_message<IndexError>(
      [&] {
        gather(x, 1, ids({0, 3}, {1, 2}));
      },
      "gather: index 3 at position (0,1) is out of range for axis 1 of input (5,3) of size 3");
  check_message<IndexError>(
      [&] {
        one_hot(ids({0, 4}), 4);
      },
      "one_hot: index 4 at position (1) is out of range for num_classes of size 4");
  BOOST_CHECK_THROW(scatter(x, 0, ids({5}, {1, 1}), zeros({1, 1})), IndexError);
  BOOST_CHECK_THROW(scatter_add(x, 1, ids({-2}, {1, 1}), zeros({1, 1})), IndexError);
  BOOST_CHECK_THROW(index_select(x, 2, ids({0})), IndexError);  // axis out of range
}

BOOST_AUTO_TEST_CASE(index_dtype_and_shape_errors) {
  Tensor x = zeros({5, 3});
  BOOST_CHECK_THROW(index_select(x, 0, zeros({2})), DTypeError);  // float index
  BOOST_CHECK_THROW(embedding(x, zeros({2})), DTypeError);
  BOOST_CHECK_THROW(index_select(ids({1, 2}), 0, ids({0})), DTypeError);  // integer source
  BOOST_CHECK_THROW(embedding(zeros({5}), ids({0})), ShapeError);
  BOOST_CHECK_THROW(embedding(x, ids({0}), 5), ValueError);  // padding_idx outside [0, V)
  BOOST_CHECK_THROW(gather(x, 1, ids({0, 1})), ShapeError);  // rank 1 vs 2
  BOOST_CHECK_THROW(gather(x, 1, ids({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {6, 2})), ShapeError);  // 6 > 5 rows
  BOOST_CHECK_THROW(scatter(x, 1, ids({0, 1}, {1, 2}), zeros({1, 1})), ShapeError);  // index larger than src
  BOOST_CHECK_THROW(scatter(x, 1, ids({0}, {1, 1}), zeros({1, 1}, DType::f64)), DTypeError);
  BOOST_CHECK_THROW(one_hot(ids({0}), 0), ValueError);
  BOOST_CHECK_THROW(one_hot(zeros({1}), 2), DTypeError);
}
