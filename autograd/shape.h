#pragma once
/// \file
/// Shape and strides: a fixed-capacity inline array, so creating a tensor never
/// allocates for its shape. Rank is limited to kMaxDims.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "error.h"

namespace tg {

/// The largest rank of a tensor.
inline constexpr int kMaxDims = 8;

/// Sizes (or strides) of up to kMaxDims axes, stored inline; a rank-0 Shape is
/// a scalar's. Written {2, 3} where a Shape is expected.
class Shape {
 public:
  Shape() = default;  ///< rank 0
  /// From a list: Shape{2, 3}. ShapeError above kMaxDims, as for every constructor.
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  /// From a span of sizes.
  explicit Shape(std::span<const int64_t> dims) { assign(dims.begin(), dims.end()); }
  /// From a vector of sizes.
  Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }

  /// Replaces the sizes with those of [first, last).
  template <class It> void assign(It first, It last) {
    n_ = 0;
    for (; first != last; ++first) push_back(*first);
  }
  /// Appends an axis of size d; ShapeError above kMaxDims.
  void push_back(int64_t d) {
    if (n_ == kMaxDims) throw ShapeError(fmt::format("shape: rank above the maximum of {}", kMaxDims));
    d_[n_++] = d;
  }
  void insert(int pos, int64_t d);  ///< inserts an axis of size d before axis pos
  void erase(int pos);              ///< removes axis pos
  int size() const { return n_; }   ///< the rank
  bool empty() const { return n_ == 0; }  ///< rank 0
  int64_t& operator[](int i) { return d_[i]; }  ///< size of axis i, 0 <= i < size() (unchecked)
  int64_t operator[](int i) const { return d_[i]; }  ///< size of axis i, 0 <= i < size() (unchecked)
  int64_t back() const { return d_[n_ - 1]; }  ///< the last axis's size (rank >= 1)
  const int64_t* begin() const { return d_; }  ///< the first size
  const int64_t* end() const { return d_ + n_; }  ///< past the last size
  int64_t* begin() { return d_; }  ///< the first size
  int64_t* end() { return d_ + n_; }  ///< past the last size
  std::vector<int64_t> vec() const { return {begin(), end()}; }  ///< the sizes as a vector
  /// The product of the sizes (1 for rank 0).
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < n_; ++i) n *= d_[i];
    return n;
  }
  /// Same rank and sizes.
  friend bool operator==(const Shape& a, const Shape& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }
  std::string str() const;  ///< "(2,3)"; "()" for a scalar

 private:
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

/// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);
/// NumPy broadcasting of two shapes; `op` names the caller in the ShapeError.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
/// Normalises a possibly negative axis into [0, rank); IndexError names op and rank.
int normalize_axis(int64_t axis, int rank, const char* op);

}  // namespace tg

/// Formats a Shape with fmt as its str(): fmt::format("{}", shape) is "(2,3)".
template <> struct fmt::formatter<tg::Shape> : fmt::formatter<std::string> {
  /// Writes s.str().
  auto format(const tg::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
