// Readable printing: shape, dtype, grad flag, and values with NumPy-style
// nesting, truncated to the first and last 3 entries of long axes.
#include <cmath>

#include <fmt/format.h>

#include "autograd/tensor.h"

namespace tg {
namespace {

constexpr int64_t kEdge = 3;       // entries kept at each end of a long axis
constexpr int64_t kSummarize = 1000;  // summarise tensors with more elements

std::string value_str(const Tensor& t, int64_t off) {
  return TG_DISPATCH_ALL(t.dtype(), "print", [&]() -> std::string {
    scalar_t v = static_cast<scalar_t*>(t.storage()->data)[off];
    if constexpr (std::is_integral_v<scalar_t>)
      return fmt::format("{}", v);
    else
      return fmt::format("{:.4g}", static_cast<double>(v));
  });
}

void print_axis(const Tensor& t, int d, int64_t off, bool summarize, std::string& out, int indent) {
  const int64_t n = t.shape()[d];
  out += '[';
  for (int64_t i = 0; i < n; ++i) {
    if (summarize && n > 2 * kEdge && i == kEdge) {
      out += d + 1 == t.dim() ? "..., " : fmt::format("...,\n{:{}}", "", indent + 1);
      i = n - kEdge;
    }
    int64_t o = off + i * t.strides()[d];
    if (d + 1 == t.dim())
      out += value_str(t, o);
    else
      print_axis(t, d + 1, o, summarize, out, indent + 1);
    if (i + 1 < n) out += d + 1 == t.dim() ? ", " : fmt::format(",\n{:{}}", "", indent + 1);
  }
  out += ']';
}

}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::string values;
  if (dim() == 0)
    values = value_str(*this, offset());
  else if (numel() == 0)
    values = "[]";
  else
    print_axis(*this, 0, offset(), numel() > kSummarize, values, 7);
  return fmt::format("tensor({}, shape={}, dtype={}{})", values, shape(), dtype_name(dtype()),
                     requires_grad() ? ", requires_grad" : "");
}

}  // namespace tg
