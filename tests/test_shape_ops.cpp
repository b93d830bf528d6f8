// Copying shape ops (autograd/ops/shape.cpp): concat, stack, split, chunk,
// pad, flip, triu, tril. Hand-computed values, gradients (gradcheck of every
// OpDef sample, plus explicit backward values), and every error path.
#define BOOST_TEST_MODULE shape_ops
#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/samples.h"
#include "tests/testing.h"

using namespace tg;
using tg::testing::says;

namespace {

// 0, 1, 2, ... as float64 in the given shape.
Tensor iota(const Shape& s) { return arange(0.0, static_cast<double>(s.numel()), 1.0, DType::f64).reshape(s); }

std::vector<double> values(const Tensor& t) { return t.to(DType::f64).contiguous().to_vector<double>(); }


}  // namespace

BOOST_AUTO_TEST_CASE(concat_and_stack_take_a_list_of_inputs) {
  BOOST_TEST(find_op("concat")->arity == -1);
  BOOST_TEST(find_op("stack")->arity == -1);
}

BOOST_AUTO_TEST_CASE(concat_joins_along_an_axis_and_splits_the_gradient) {
  Tensor a = iota({2, 2}).requires_grad_(), b = add(iota({2, 1}), 10.0).detach().requires_grad_();
  Tensor c = concat({a, b}, -1);
  BOOST_TEST(c.shape() == Shape({2, 3}));
  BOOST_TEST(values(c) == (std::vector<double>{0, 1, 10, 2, 3, 11}), boost::test_tools::per_element());
  sum(mul(c, iota({2, 3}))).backward();
  BOOST_TEST(values(a.grad()) == (std::vector<double>{0, 1, 3, 4}), boost::test_tools::per_element());
  BOOST_TEST(values(b.grad()) == (std::vector<double>{2, 5}), boost::test_tools::per_element());
  // A single tensor and zero-length pieces.
  BOOST_TEST(values(concat({a}, 0)) == values(a), boost::test_tools::per_element());
  BOOST_TEST(concat({a, zeros({0, 2}, DType::f64)}, 0).shape() == Shape({2, 2}));
}

BOOST_AUTO_TEST_CASE(stack_adds_an_axis) {
  Tensor a = iota({2, 3}), b = add(iota({2, 3}), 100.0);
  Tensor s0 = stack({a, b}, 0), s2 = stack({a, b}, 2), sm = stack({a, b}, -1);
  BOOST_TEST(s0.shape() == Shape({2, 2, 3}));
  BOOST_TEST(s2.shape() == Shape({2, 3, 2}));
  BOOST_TEST(sm.shape() == Shape({2, 3, 2}));
  BOOST_TEST(s0.at({1, 1, 2}) == 105.0);
  BOOST_TEST(s2.at({1, 2, 0}) == 5.0);
  BOOST_TEST(s2.at({1, 2, 1}) == 105.0);
  Tensor x = samples::uniform({3}, 1), y = samples::uniform({3}, 2);
  sum(mul(stack({x, y, x}, 1), iota({3, 3}))).backward();  // x used twice: gradients accumulate
  BOOST_TEST(values(x.grad()) == (std::vector<double>{2, 8, 14}), boost::test_tools::per_element());
  BOOST_TEST(values(y.grad()) == (std::vector<double>{1, 4, 7}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(split_and_chunk_return_views_as_torch) {
  Tensor x = iota({2, 7});
  auto parts = split(x, {3, 0, 4}, 1);
  BOOST_TEST(parts.size() == 3u);
  BOOST_TEST(parts[0].shape() == Shape({2, 3}));
  BOOST_TEST(parts[1].shape() == Shape({2, 0}));
  BOOST_TEST(parts[2].at({1, 0}) == 10.0);
  BOOST_TEST(parts[2].storage() == x.storage());  // a view, no copy
  // torch.chunk: pieces of ceil(n / chunks); there may be fewer pieces.
  auto sizes = [](const std::vector<Tensor>& ps) {
    std::vector<int64_t> s;
    for (const Tensor& p : ps) s.push_back(p.shape()[1]);
    return s;
  };
  BOOST_TEST(sizes(chunk(x, 3, 1)) == (std::vector<int64_t>{3, 3, 1}), boost::test_tools::per_element());
  BOOST_TEST(sizes(chunk(iota({1, 6}), 4, -1)) == (std::vector<int64_t>{2, 2, 2}), boost::test_tools::per_element());
  BOOST_TEST(sizes(chunk(iota({1, 2}), 5, 1)) == (std::vector<int64_t>{1, 1}), boost::test_tools::per_element());
  // Gradient through a chunk lands in its place.
  Tensor y = samples::uniform({2, 6}, 3);
  sum(chunk(y, 3, 1)[1]).backward();
  BOOST_TEST(values(y.grad()) == (std::vector<double>{0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(pad_fills_and_crops) {
  Tensor x = iota({2, 3}).requires_grad_();
  Tensor p = pad(x, {1, 2}, -1.0);  // last axis: one before, two after
  BOOST_TEST(p.shape() == Shape({2, 6}));
  BOOST_TEST(values(p) == (std::vector<double>{-1, 0, 1, 2, -1, -1, -1, 3, 4, 5, -1, -1}),
             boost::test_tools::per_element());
  Tensor q = pad(x, {0, 0, 1, 0});  // first axis: one row before
  BOOST_TEST(q.shape() == Shape({3, 3}));
  BOOST_TEST(values(q) == (std::vector<double>{0, 0, 0, 0, 1, 2, 3, 4, 5}), boost::test_tools::per_element());
  Tensor c = pad(x, {-1, 1});  // crop one column in front, pad one behind
  BOOST_TEST(values(c) == (std::vector<double>{1, 2, 0, 4, 5, 0}), boost::test_tools::per_element());
  sum(mul(c, iota({2, 3}))).backward();
  BOOST_TEST(values(x.grad()) == (std::vector<double>{0, 0, 1, 0, 3, 4}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(flip_reverses_axes) {
  Tensor x = iota({2, 3});
  BOOST_TEST(values(flip(x, {1})) == (std::vector<double>{2, 1, 0, 5, 4, 3}), boost::test_tools::per_element());
  BOOST_TEST(values(flip(x, {0, -1})) == (std::vector<double>{5, 4, 3, 2, 1, 0}), boost::test_tools::per_element());
  BOOST_TEST(values(flip(x.t(), {0})) == (std::vector<double>{2, 5, 1, 4, 0, 3}), boost::test_tools::per_element());
  BOOST_TEST(values(flip(x, {})) == values(x), boost::test_tools::per_element());
  Tensor y = samples::uniform({4}, 4);
  sum(mul(flip(y, {0}), iota({4}))).backward();
  BOOST_TEST(values(y.grad()) == (std::vector<double>{3, 2, 1, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(triu_and_tril_keep_a_triangle) {
  Tensor x = add(iota({3, 4}), 1.0);
  BOOST_TEST(values(triu(x)) == (std::vector<double>{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12}),
             boost::test_tools::per_element());
  BOOST_TEST(values(triu(x, 2)) == (std::vector<double>{0, 0, 3, 4, 0, 0, 0, 8, 0, 0, 0, 0}),
             boost::test_tools::per_element());
  BOOST_TEST(values(tril(x)) == (std::vector<double>{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0}),
             boost::test_tools::per_element());
  BOOST_TEST(values(tril(x, -1)) == (std::vector<double>{0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0}),
             boost::test_tools::per_element());
  // Batched over leading axes, and on int64 (a causal mask).
  Tensor m = tril(ones({2, 2, 2}, DType::f64));
  BOOST_TEST(values(m) == (std::vector<double>{1, 0, 1, 1, 1, 0, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(tril(ones({3, 3}, DType::i64)).to_vector<int64_t>() == (std::vector<int64_t>{1, 0, 0, 1, 1, 0, 1, 1, 1}),
             boost::test_tools::per_element());
  Tensor y = samples::uniform({2, 2}, 5);
  sum(triu(y)).backward();
  BOOST_TEST(values(y.grad()) == (std::vector<double>{1, 1, 0, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(concat_and_stack_errors) {
  Tensor a = zeros({2, 3}), b = zeros({2, 4});
  BOOST_CHECK_EXCEPTION(concat({}, 0), ValueError, says<ValueError>({"concat", "empty"}));
  BOOST_CHECK_EXCEPTION(concat({a, b}, 0), ShapeError, says<ShapeError>({"concat", "(2,3)", "(2,4)", "axis 0"}));
  BOOST_CHECK_EXCEPTION(concat({a, zeros({2, 3, 1})}, 1), ShapeError, says<ShapeError>({"(2,3,1)"}));
  BOOST_CHECK_EXCEPTION(concat({a, zeros({2, 3}, DType::f64)}, 0), DTypeError,
                        says<DTypeError>({"concat", "float32", "float64"}));
  BOOST_CHECK_THROW(concat({scalar(1.0), scalar(2.0)}, 0), ShapeError);
  BOOST_CHECK_THROW(concat({a, b}, 2), IndexError);
  BOOST_CHECK_THROW(concat({a, Tensor()}, 0), ValueError);
  BOOST_CHECK_EXCEPTION(stack({a, b}, 0), ShapeError, says<ShapeError>({"stack", "(2,3)", "(2,4)"}));
  BOOST_CHECK_EXCEPTION(stack({a, a}, 3), IndexError, says<IndexError>({"stack", "axis 3"}));
  BOOST_CHECK_THROW(stack({a, a}, -4), IndexError);
  BOOST_CHECK_THROW(stack({}, 0), ValueError);
}

BOOST_AUTO_TEST_CASE(split_chunk_errors) {
  Tensor x = zeros({2, 5});
  BOOST_CHECK_EXCEPTION(split(x, {2, 2}, 1), ShapeError, says<ShapeError>({"split", "(2,2)", "(2,5)", "sum to 4"}));
  BOOST_CHECK_THROW(split(x, {6, -1}, 1), ShapeError);
  BOOST_CHECK_THROW(split(x, {5}, 2), IndexError);
  BOOST_CHECK_EXCEPTION(chunk(x, 0, 1), ValueError, says<ValueError>({"chunk", "0"}));
  BOOST_CHECK_THROW(chunk(scalar(1.0), 2, 0), ShapeError);
}

BOOST_AUTO_TEST_CASE(pad_flip_triangle_errors) {
  Tensor x = zeros({2, 3});
  BOOST_CHECK_EXCEPTION(pad(x, {1, 2, 3}), ValueError, says<ValueError>({"pad", "(1,2,3)"}));
  BOOST_CHECK_EXCEPTION(pad(x, {1, 1, 1, 1, 1, 1}), ShapeError, says<ShapeError>({"pad", "(2,3)", "3 axes"}));
  BOOST_CHECK_EXCEPTION(pad(x, {-2, -2}), ShapeError, says<ShapeError>({"pad", "negative"}));
  BOOST_CHECK_EXCEPTION(flip(x, {1, -1}), ShapeError, says<ShapeError>({"flip", "repeated"}));
  BOOST_CHECK_THROW(flip(x, {2}), IndexError);
  BOOST_CHECK_EXCEPTION(triu(zeros({4})), ShapeError, says<ShapeError>({"triu", "(4)"}));
  BOOST_CHECK_THROW(tril(scalar(1.0)), ShapeError);
}
