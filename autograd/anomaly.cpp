#include "autograd/anomaly.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "autograd/bfloat16.h"
#include "autograd/error.h"
#include "autograd/op.h"
#include "autograd/tape.h"
#include "autograd/tensor.h"

namespace tg {
namespace {

bool env_enabled() {
  const char* v = std::getenv("TAPEGRAD_DETECT_ANOMALY");
  return v && std::string_view(v) == "1";
}

// Guards alive, from any thread; the environment's setting is read once.
std::atomic<int> g_guards{0};
const bool g_env = env_enabled();

std::vector<std::string_view>& path_stack() {
  thread_local std::vector<std::string_view> stack;
  return stack;
}

template <class T>
NonFiniteCount count_values(const T* p, int64_t n) {
  NonFiniteCount c;
  for (int64_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(p[i]);
    c.nan += std::isnan(v);
    c.inf += std::isinf(v);
  }
  return c;
}

std::string describe_count(const NonFiniteCount& c) {
  if (c.nan && c.inf) return fmt::format("{} NaN and {} infinite", c.nan, c.inf);
  return c.nan ? fmt::format("{} NaN", c.nan) : fmt::format("{} infinite", c.inf);
}

std::string where(const std::string& path) { return path.empty() ? "at the top level" : "in " + path; }

}  // namespace

bool anomaly_enabled() { return g_env || g_guards.load(std::memory_order_relaxed) > 0; }

DetectAnomalyGuard::DetectAnomalyGuard() { g_guards.fetch_add(1, std::memory_order_relaxed); }
DetectAnomalyGuard::~DetectAnomalyGuard() { g_guards.fetch_sub(1, std::memory_order_relaxed); }

NonFiniteCount count_non_finite(const Tensor& t) {
  if (!t.defined() || t.dtype() == DType::i64) return {};
  const Tensor c = t.contiguous();
  switch (c.dtype()) {
    case DType::f32: return count_values(c.data<float>(), c.numel());
    case DType::f64: return count_values(c.data<double>(), c.numel());
    default: {
      const Tensor f = c.to(DType::f32);
      return count_values(f.data<float>(), f.numel());
    }
  }
}

ModulePathScope::ModulePathScope(std::string_view name) {
  if (!anomaly_enabled()) return;
  // A module's forward called through forward_with_hooks enters its name
  // twice (the same string): once is the path.
  if (!path_stack().empty() && path_stack().back().data() == name.data()) return;
  path_stack().push_back(name);
  entered_ = true;
}
ModulePathScope::~ModulePathScope() {
  if (entered_) path_stack().pop_back();
}

std::string module_path() {
  std::string path;
  for (std::string_view name : path_stack()) {
    if (name.empty()) continue;
    if (!path.empty()) path += '.';
    path += name;
  }
  return path;
}

namespace detail {

namespace {
thread_local bool t_infinity_asked = false;
}
InfinityAsked::InfinityAsked() : prev_(t_infinity_asked) { t_infinity_asked = true; }
InfinityAsked::~InfinityAsked() { t_infinity_asked = prev_; }

void check_forward(const OpDef& op, std::span<const Tensor* const> inputs, const Tensor& out) {
  NonFiniteCount bad = count_non_finite(out);
  if (t_infinity_asked) bad.inf = 0;
  if (!bad.any()) return;
  std::string lines;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& in = *inputs[k];
    if (!in.defined()) continue;
    const NonFiniteCount c = count_non_finite(in);
    lines += fmt::format("\n  input {}: {} {}, {}", k, in.shape(), dtype_name(in.dtype()),
                         c.any() ? "already non-finite (" + describe_count(c) + ")" : "finite");
  }
  throw AnomalyError(fmt::format("anomaly detected in forward: '{}' {} returned {} {} holding {} value(s){}",
                                 op.name, where(module_path()), out.shape(), dtype_name(out.dtype()),
                                 describe_count(bad), lines));
}

void check_backward(const Node& node, const NonFiniteCount& incoming, std::span<const Tensor> grad_in,
                    const char* api) {
  for (size_t k = 0; k < grad_in.size(); ++k) {
    const NonFiniteCount bad = count_non_finite(grad_in[k]);
    if (!bad.any()) continue;
    throw AnomalyError(fmt::format(
        "anomaly detected in {}: the backward of '{}' (recorded {}, output {} {}) returned a gradient for input {} "
        "of shape {} holding {} value(s); the gradient it received was {}",
        api, node.op->name, where(node.module_path), node.out_shape, dtype_name(node.out_dtype), k,
        node.edges[k].shape, describe_count(bad),
        incoming.any() ? "already non-finite (" + describe_count(incoming) + ")" : "finite"));
  }
}

}  // namespace detail
}  // namespace tg
