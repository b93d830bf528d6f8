#pragma once
// Shape and strides: a fixed-capacity inline array, so creating a tensor never
// allocates for its shape. Rank is limited to kMaxDims.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "error.h"

namespace tg {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(std::span<const int64_t> dims) { assign(dims.begin(), dims.end()); }
  Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }

  template <class It> void assign(It first, It last) {
    n_ = 0;
    for (; first != last; ++first) push_back(*first);
  }
  void push_back(int64_t d) {
    if (n_ == kMaxDims) throw ShapeError(fmt::format("shape: rank above the maximum of {}", kMaxDims));
    d_[n_++] = d;
  }
  void insert(int pos, int64_t d);
  void erase(int pos);
  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t back() const { return d_[n_ - 1]; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < n_; ++i) n *= d_[i];
    return n;
  }
  friend bool operator==(const Shape& a, const Shape& b) {
    return a.n_ == b.n_ && std::equal(a.begin(), a.end(), b.begin());
  }
  std::string str() const;  // "(2,3)"; "()" for a scalar

 private:
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);
// NumPy broadcasting of two shapes; `op` names the caller in the ShapeError.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Normalises a possibly negative axis into [0, rank); IndexError names op and rank.
int normalize_axis(int64_t axis, int rank, const char* op);

}  // namespace tg

template <> struct fmt::formatter<tg::Shape> : fmt::formatter<std::string> {
  auto format(const tg::Shape& s, format_context& ctx) const {
    return fmt::formatter<std::string>::format(s.str(), ctx);
  }
};
