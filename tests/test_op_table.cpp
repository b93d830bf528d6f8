// Walks the op table and checks the first, second and third derivatives of
// every op over every one of its samples in float64. Ops registered later (in any op-family file) are picked up
// automatically: the table is the single source of truth. Which ops the table
// holds (so that this walk is not over an empty or shrunken table) is pinned
// name by name in test_op_names.cpp, for the static and the shared library.
#define BOOST_TEST_MODULE op_table
#include <boost/test/unit_test.hpp>

#include <cmath>
#include <set>
#include <span>
#include <string>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/samples.h"

using namespace tg;

BOOST_AUTO_TEST_CASE(every_op_has_samples) {
  std::set<std::string_view> names;
  for (const OpDef* op : op_table()) {
    BOOST_TEST_CONTEXT("op " << op->name) {
      BOOST_TEST(names.insert(op->name).second, "op name registered twice");
      BOOST_TEST(!op->signature.empty());
      BOOST_TEST(!op->saves.str().empty());
      BOOST_TEST(op->backward != nullptr);
      BOOST_TEST_REQUIRE(op->samples != nullptr, "op has no sample function");
      std::vector<OpSample> s = op->samples();
      BOOST_TEST(!s.empty(), "op has an empty sample list");
      for (const OpSample& sample : s) {
        BOOST_TEST(!sample.desc.empty());
        BOOST_TEST(static_cast<bool>(sample.fn), "sample '" << sample.desc << "' has no function");
      }
    }
  }
  BOOST_TEST(find_op("mul") != nullptr);
  BOOST_TEST(find_op("no_such_op") == nullptr);
}

BOOST_AUTO_TEST_CASE(every_sample_requires_float64_grad) {
  for (const OpDef* op : op_table()) {
    for (const OpSample& sample : op->samples()) {
      int differentiable = 0;
      for (const Tensor& t : sample.inputs) {
        if (!t.defined() || !t.requires_grad()) continue;
        ++differentiable;
        BOOST_TEST((t.dtype() == DType::f64), op->name << " / " << sample.desc << ": a differentiable input is "
                                                       << dtype_name(t.dtype()));
      }
      BOOST_TEST(differentiable > 0, op->name << " / " << sample.desc << ": no input requires grad");
    }
  }
}

// Whether the graph of `out` contains a node of `op` (walked without recursion).
bool records(const Tensor& out, const OpDef* op) {
  std::vector<const Node*> todo;
  if (out.defined() && out.impl()->grad_fn) todo.push_back(out.impl()->grad_fn.get());
  std::set<const Node*> seen;
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (!seen.insert(n).second) continue;
    if (n->op == op) return true;
    for (const Edge& e : n->edges)
      if (e.node) todo.push_back(e.node.get());
  }
  return false;
}

// The sample must record the op it belongs to, otherwise the op's backward is
// never exercised by its own samples.
BOOST_AUTO_TEST_CASE(every_sample_records_its_op) {
  for (const OpDef* op : op_table()) {
    for (const OpSample& sample : op->samples()) {
      Tensor out = sample.fn(sample.inputs);
      BOOST_TEST(records(out, op), op->name << " / " << sample.desc << ": the sample does not record '" << op->name << "'");
    }
  }
}

// A backward may take a fused kernel on the plain path and tensor ops when it
// is recorded (create_graph): both must give the same first derivatives.
std::string recorded_backward_differs(const OpSample& sample) {
  std::vector<Tensor> wrt;
  for (const Tensor& t : sample.inputs)
    if (t.defined() && t.requires_grad()) wrt.push_back(t);
  Tensor out = sample.fn(sample.inputs);
  Tensor u = samples::uniform(out.shape(), 99);
  std::vector<Tensor> plain = grad({out}, wrt, {u}, {.retain_graph = true, .allow_unused = true});
  std::vector<Tensor> recorded = grad({out}, wrt, {u}, {.create_graph = true, .allow_unused = true});
  for (size_t k = 0; k < wrt.size(); ++k) {
    if (plain[k].defined() != recorded[k].defined()) return fmt::format("input {}: gradient defined on one path only", k);
    if (!plain[k].defined()) continue;
    std::vector<double> a = plain[k].contiguous().to_vector<double>(), b = recorded[k].contiguous().to_vector<double>();
    for (size_t e = 0; e < a.size(); ++e)
      if (std::abs(a[e] - b[e]) > 1e-12 * (1 + std::abs(a[e])))
        return fmt::format("input {} element {}: plain backward {} but recorded backward {}", k, e, a[e], b[e]);
  }
  return {};
}

// A sample's first derivative as a sample of its own: (inputs, u) -> the
// gradients of fn(inputs) . u with respect to the inputs that require grad,
// taken with create_graph and flattened into one tensor (u is an input, as in
// gradgradcheck, so that the result depends on something even where the
// op's gradient is constant). Its second derivatives are the op's third: a
// backward pass through the recorded backward, itself recorded.
OpSample first_derivative(const OpSample& sample) {
  std::vector<size_t> wrt;
  for (size_t k = 0; k < sample.inputs.size(); ++k)
    if (sample.inputs[k].defined() && sample.inputs[k].requires_grad()) wrt.push_back(k);
  std::vector<Tensor> inputs = sample.inputs;
  inputs.push_back(samples::uniform(sample.fn(sample.inputs).shape(), 98));
  auto fn = [fn = sample.fn, wrt](const std::vector<Tensor>& in) {
    EnableGradGuard with_grad;  // finite differences evaluate it under no_grad, on inputs without grad
    std::vector<Tensor> x(in.begin(), in.end() - 1), xs;
    for (size_t k : wrt) {
      if (!x[k].requires_grad()) x[k] = x[k].detach().requires_grad_();
      xs.push_back(x[k]);
    }
    const std::vector<Tensor> g = grad({fn(x)}, xs, {in.back()}, {.create_graph = true, .allow_unused = true});
    std::vector<Tensor> flat;
    for (size_t k = 0; k < g.size(); ++k)
      flat.push_back(g[k].defined() ? reshape(g[k], {-1}) : zeros({xs[k].numel()}, xs[k].dtype()));
    return concat(flat, 0);
  };
  return {sample.desc, inputs, fn};
}

// Checks every sample of `op` to the given order of derivatives: 1 gradcheck,
// 2 gradgradcheck, 3 gradgradcheck of the first derivative; from order 2 on,
// the plain and the recorded backward must also agree. Returns the failures,
// each described.
std::vector<std::string> check_op(const OpDef& op, int order) {
  std::vector<std::string> failures;
  for (const OpSample& given : op.samples()) {
    try {
      const OpSample sample = order == 3 ? first_derivative(given) : given;
      GradcheckReport r = order == 1 ? gradcheck(sample.fn, sample.inputs) : gradgradcheck(sample.fn, sample.inputs);
      if (!r.passed) failures.push_back(fmt::format("{} / {}:\n{}", op.name, sample.desc, r.str()));
      if (order >= 2) {
        std::string diff = recorded_backward_differs(sample);
        if (!diff.empty()) failures.push_back(fmt::format("{} / {}: {}", op.name, sample.desc, diff));
      }
    } catch (const std::exception& e) {
      failures.push_back(fmt::format("{} / {}: threw {}", op.name, given.desc, e.what()));
    }
  }
  return failures;
}

void check_table(int order) {
  int ops = 0, passed = 0;
  for (const OpDef* op : op_table()) {
    std::vector<std::string> failures = check_op(*op, order);
    for (const std::string& f : failures) BOOST_ERROR(f);
    ++ops;
    passed += failures.empty();
  }
  const char* what[] = {"", "gradcheck", "gradgradcheck", "third derivatives (gradgradcheck of the gradient)"};
  BOOST_TEST_MESSAGE(what[order] << ": " << passed << " of " << ops << " ops pass every sample");
  BOOST_TEST(passed == ops);
}

// What an op saves is declared by its OpDef (saves_of<its struct>()) and
// saved by its forward in one call: every node of every sample's graph holds
// one slot per field its op declares (a list field: any number), so an op
// declaring a field its forward leaves unsaved, or saving without declaring,
// fails here.
BOOST_AUTO_TEST_CASE(every_node_saves_what_its_op_declares) {
  for (const OpDef* op : op_table()) {
    for (const OpSample& sample : op->samples()) {
      Tensor out = sample.fn(sample.inputs);
      std::vector<const Node*> todo;
      if (out.impl()->grad_fn) todo.push_back(out.impl()->grad_fn.get());
      std::set<const Node*> seen;
      while (!todo.empty()) {
        const Node* n = todo.back();
        todo.pop_back();
        if (!seen.insert(n).second) continue;
        for (const Edge& e : n->edges)
          if (e.node) todo.push_back(e.node.get());
        const SavedLayout& layout = n->op->saves;
        const bool list = !layout.fields.empty() && layout.fields.back().kind == SavedKind::list;
        const size_t slots = n->saved.size(), declared = layout.fields.size();
        BOOST_TEST((list ? slots + 1 >= declared : slots == declared),
                   op->name << " / " << sample.desc << ": a node of '" << n->op->name << "' saved " << slots
                            << " tensors, its OpDef declares " << layout.str());
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(saves_describes_the_saved_struct) {
  BOOST_TEST(find_op("layer_norm")->saves.str() == "x, weight, mean (side output), rstd (side output), bias");
  BOOST_TEST(find_op("reshape")->saves.str() == "nothing");
  BOOST_TEST(find_op("matmul")->saves.str() == "a (bfloat16 under autocast), b (bfloat16 under autocast)");
}

BOOST_AUTO_TEST_CASE(gradcheck_every_op_float64) { check_table(1); }

BOOST_AUTO_TEST_CASE(gradgradcheck_every_op_float64) { check_table(2); }

BOOST_AUTO_TEST_CASE(third_derivatives_of_every_op_float64) { check_table(3); }

// A linear primitive's transpose (OpSpec::linear) against the op itself:
// <u, A v> = <A^T u, v> on each sample, A v being the sample's output.
std::string transpose_mismatch(const OpDef& op, const OpSample& sample) {
  const Tensor out = sample.fn(sample.inputs);
  const Node* n = out.impl()->grad_fn.get();
  if (!n || n->op != &op) return "the sample's output is not the op's";
  NoGradGuard no_grad;
  const Tensor u = samples::uniform(out.shape(), 97);
  const Tensor at_u = op.linear.transpose(*n, u);
  const double lhs = sum(mul(u, out)).item<double>();
  const double rhs = sum(mul(at_u, sample.inputs[op.linear.input])).item<double>();
  if (std::abs(lhs - rhs) > 1e-12 * (1 + std::abs(lhs)))
    return fmt::format("<u, A v> = {} but <A^T u, v> = {}", lhs, rhs);
  return {};
}

BOOST_AUTO_TEST_CASE(every_linear_primitive_agrees_with_its_transpose) {
  int linear = 0;
  for (const OpDef* op : op_table()) {
    if (!op->linear.transpose) continue;
    ++linear;
    for (const OpSample& sample : op->samples())
      if (std::string m = transpose_mismatch(*op, sample); !m.empty()) BOOST_ERROR(op->name << " / " << sample.desc << ": " << m);
  }
  BOOST_TEST(linear >= 1, "no op declares a transpose");
}

// 2v declared with the transpose 3u: the check above must catch it.
const OpDef* g_twice = nullptr;
Tensor twice(const Tensor& v) {
  Tensor out;
  {
    NoGradGuard ng;
    out = mul(v, 2.0);
  }
  record(*g_twice, out, v);
  return out;
}
void no_other_inputs(const Node&, const Tensor&, std::span<Tensor>) {}
Tensor wrong_transpose(const Node&, const Tensor& u) { return mul(u, 3.0); }

BOOST_AUTO_TEST_CASE(transpose_check_fails_for_a_wrong_transpose) {
  OpDef op({.name = "test_wrong_transpose", .arity = 1, .signature = "2v, transpose 3u", .saves = saves_of<NoSaved>(),
            .backward = no_other_inputs, .linear = {.input = 0, .transpose = wrong_transpose}});
  g_twice = &op;
  const OpSample sample{"(3)", {samples::uniform({3}, 5)}, [](auto& x) { return twice(x[0]); }};
  const std::string m = transpose_mismatch(op, sample);
  BOOST_TEST(m.find("<u, A v>") != std::string::npos, m);
  // The engine takes the gradient of v from the transpose: gradcheck fails too.
  BOOST_TEST(!gradcheck(sample.fn, sample.inputs).passed);
}

// The walk above must be able to fail: an op whose backward is a raw kernel
// (right first derivatives, no recorded backward) fails its gradgradcheck.
struct RawSquareSaved {
  Tensor x;
  static constexpr std::tuple fields{saved_field("x", &RawSquareSaved::x)};
};
void raw_square_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  Tensor x = n.saved_tensor(&RawSquareSaved::x).contiguous(), gc = g.contiguous();
  Tensor out = empty(x.shape(), DType::f64);
  for (int64_t k = 0; k < x.numel(); ++k) out.data<double>()[k] = 2 * x.data<double>()[k] * gc.data<double>()[k];
  gin[0] = out;
}

BOOST_AUTO_TEST_CASE(gradgradcheck_walk_fails_for_a_once_differentiable_op) {
  static const OpDef* square_op = nullptr;
  OpDef op({
      .name = "test_raw_square",
      .arity = 1,
      .signature = "x * x, backward by a raw loop",
      .saves = saves_of<RawSquareSaved>(),
      .backward = raw_square_backward,
      .samples = [] {
        Tensor x = from_vector(std::vector<double>{0.5, -1.5, 2.0}, {3});
        x.requires_grad_();
        return std::vector<OpSample>{{"(3)", {x}, [](const std::vector<Tensor>& in) {
                                        Tensor out;
                                        {
                                          NoGradGuard ng;
                                          out = in[0] * in[0];
                                        }
                                        if (Node* n = record(*square_op, out, in[0])) n->save(RawSquareSaved{.x = in[0]});
                                        return out;
                                      }}};
      },
  });
  square_op = &op;
  BOOST_TEST(check_op(op, 1).empty());          // first derivatives are right
  std::vector<std::string> f = check_op(op, 2);  // second ones are not there
  BOOST_TEST_REQUIRE(f.size() == 1u);
  BOOST_TEST(f[0].find("test_raw_square") != std::string::npos);
  BOOST_TEST_MESSAGE(f[0]);
}
