// Constant stores that GCC 12.2 miscompiles on AVX-512 machines, compiled
// with this project's flags (-O3 -march=native): a 32- or 64-byte constant
// whose low 64-bit words are equal and whose upper words are zero is stored
// as a broadcast of its low word, so
// from_vector(std::vector<int64_t>{2, 2, 0, 0}, {2, 2}) held [2, 2, 2, 2].
// tests/toolchain/wide_constant_broadcast.cpp explains the compiler bug;
// meson.build runs it and, where the compiler has it, adds the flag that
// avoids it. These tests fail if the bug reaches this build again.
//
// Expected values are never written as vectors of the same shape (their
// constants would be stored wrong the same way and compare equal): each
// element is compared with a scalar.
#define BOOST_TEST_MODULE codegen
#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <vector>

#include "autograd/autograd.h"

using namespace tg;

namespace {

// The n values at p as memory holds them: the empty asm tells the compiler
// that the memory may have changed, so it cannot answer with the constants
// it meant to store.
template <class T>
std::vector<T> stored(const T* p, size_t n) {
  asm volatile("" : : "r"(p) : "memory");
  return std::vector<T>(p, p + n);
}

template <class T, size_t N>
void check_elements(const std::vector<T>& got, const T (&want)[N], const char* what) {
  BOOST_REQUIRE_EQUAL(got.size(), N);
  for (size_t i = 0; i < N; ++i) BOOST_TEST(got[i] == want[i], what << "[" << i << "]");
}

constexpr int64_t k2200[] = {2, 2, 0, 0};
constexpr int64_t k2220[] = {2, 2, 2, 0};
constexpr int64_t k22220000[] = {2, 2, 2, 2, 0, 0, 0, 0};
constexpr int64_t k22000000[] = {2, 2, 0, 0, 0, 0, 0, 0};
constexpr int32_t k11110000[] = {1, 1, 1, 1, 0, 0, 0, 0};
constexpr double k1100[] = {1.0, 1.0, 0.0, 0.0};

}  // namespace

BOOST_AUTO_TEST_CASE(braced_int64_vector_into_from_vector) {
  Tensor t = from_vector(std::vector<int64_t>{2, 2, 0, 0}, {2, 2});
  check_elements(t.to_vector<int64_t>(), k2200, "from_vector({2, 2, 0, 0})");
  // An index tensor of that pattern drives scatter_add: rows 0 and 1 of src
  // add into columns 2 and 0 of x.
  Tensor x = zeros({2, 3}, DType::f64);
  Tensor src = from_vector(std::vector<double>{10, 20, 30, 40}, {2, 2});
  Tensor index = from_vector(std::vector<int64_t>{2, 2, 0, 0}, {2, 2});
  std::vector<double> sa = scatter_add(x, 1, index, src).to_vector<double>();
  const double want[] = {0, 0, 30, 70, 0, 0};
  check_elements(sa, want, "scatter_add");
}

BOOST_AUTO_TEST_CASE(wide_constants_of_equal_low_words_and_zero_upper_words) {
  const std::vector<int64_t> a{2, 2, 2, 0};
  check_elements(stored(a.data(), a.size()), k2220, "int64 {2, 2, 2, 0}");
  const std::vector<int64_t> b{2, 2, 2, 2, 0, 0, 0, 0};
  check_elements(stored(b.data(), b.size()), k22220000, "int64 {2, 2, 2, 2, 0, 0, 0, 0}");
  const std::vector<int64_t> c{2, 2, 0, 0, 0, 0, 0, 0};
  check_elements(stored(c.data(), c.size()), k22000000, "int64 {2, 2, 0, 0, 0, 0, 0, 0}");
  const std::vector<int32_t> d{1, 1, 1, 1, 0, 0, 0, 0};
  check_elements(stored(d.data(), d.size()), k11110000, "int32 {1, 1, 1, 1, 0, 0, 0, 0}");
  const std::vector<double> e{1.0, 1.0, 0.0, 0.0};
  check_elements(stored(e.data(), e.size()), k1100, "double {1, 1, 0, 0}");
}
