#include "autograd/shape.h"

namespace tg {

void Shape::insert(int pos, int64_t d) {
  if (n_ == kMaxDims) throw ShapeError(fmt::format("shape: rank above the maximum of {}", kMaxDims));
  for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
  d_[pos] = d;
  ++n_;
}

void Shape::erase(int pos) {
  for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
  --n_;
}

std::string Shape::str() const { return fmt::format("({})", fmt::join(begin(), end(), ",")); }

Shape contiguous_strides(const Shape& shape) {
  Shape s = shape;
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  int n = std::max(a.size(), b.size());
  Shape out;
  for (int i = 0; i < n; ++i) {
    int ia = i - (n - a.size()), ib = i - (n - b.size());
    int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      throw ShapeError(fmt::format("{}: shapes {} and {} cannot be broadcast together", op, a, b));
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

int normalize_axis(int64_t axis, int rank, const char* op) {
  int64_t r = std::max(rank, 1);  // a scalar accepts axis 0 / -1 like NumPy's keepdims paths
  if (axis < -r || axis >= r)
    throw IndexError(fmt::format("{}: axis {} is out of range for a tensor of rank {}", op, axis, rank));
  return static_cast<int>(axis < 0 ? axis + r : axis);
}

}  // namespace tg
