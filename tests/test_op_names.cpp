// The exact set of ops in the op table. Every op family's OpDefs register
// themselves as the library loads; this program calls no op, so an op family
// that a link leaves out shows here, as does an op renamed or dropped. Built
// twice, against the static and against the shared library.
#define BOOST_TEST_MODULE op_names
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <iterator>
#include <set>
#include <string>
#include <string_view>

#include "autograd/op.h"

namespace {

// A new op is added here, with its samples in its family file.
const std::set<std::string_view> kOps = {
    "abs", "add", "add_scalar", "cast", "checkpoint", "clamp", "clone", "concat", "cross_entropy", "div", "dropout", "embedding",
    "erf", "exp", "expand", "flip", "gated_recurrence_grad", "gather", "gelu", "gelu_grad", "gru_recurrence", "index_add", "index_select", "layer_norm",
    "linear", "log", "log_sigmoid", "log_softmax", "logsumexp", "lstm_gate_slopes", "lstm_recurrence", "lstm_recurrence_grad", "masked_fill", "matmul", "max",
    "maximum", "min", "minimum", "mul", "mul_scalar", "neg", "pad", "permute", "pow", "pow_scalar", "rdiv", "relu",
    "reshape", "rnn_tanh_recurrence", "rsqrt", "rsub", "scaled_dot_product_attention", "scatter", "scatter_add",
    "sigmoid", "slice", "softmax", "softplus", "sqrt", "stack", "sub", "sum", "tanh", "tril", "triu", "var", "where",
};

std::string join(const std::set<std::string_view>& names) {
  std::string out;
  for (std::string_view n : names) out += std::string(out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_CASE(op_table_holds_exactly_the_library_ops) {
  std::set<std::string_view> registered;
  for (const tg::OpDef* op : tg::op_table()) registered.insert(op->name);
  std::set<std::string_view> missing, unexpected;
  std::ranges::set_difference(kOps, registered, std::inserter(missing, missing.end()));
  std::ranges::set_difference(registered, kOps, std::inserter(unexpected, unexpected.end()));
  BOOST_TEST(missing.empty(), "ops missing from op_table(): " << join(missing));
  BOOST_TEST(unexpected.empty(), "ops in op_table() but not in this test's list: " << join(unexpected));
  BOOST_TEST(registered.size() == kOps.size());
}
