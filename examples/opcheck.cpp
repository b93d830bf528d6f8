// opcheck: the command-line gradcheck tool.
//
//   opcheck --list                     every op: name, arity, signature, what it saves, samples
//   opcheck                            gradcheck every op over all its samples (float64)
//   opcheck mul gelu                   only these ops
//   opcheck --order first,second,forward
//                                      first derivatives (gradcheck), second ones
//                                      (gradgradcheck) and tangents (jvpcheck)
//
// Prints one row per sample and order (op, sample, order, input shapes, max
// abs/rel error, pass/fail) and exits with status 1 if any check fails.
#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/op.h"

using namespace tg;

namespace {

std::string shapes_of(const std::vector<Tensor>& inputs) {
  std::vector<std::string> parts;
  for (const Tensor& t : inputs) parts.push_back(t.defined() ? t.shape().str() : "-");
  return fmt::format("{}", fmt::join(parts, " "));
}

void list_ops() {
  fmt::print("{:<22} {:>5} {:>7}  {:<58} {}\n", "op", "arity", "samples", "signature", "saves");
  for (const OpDef* op : op_table()) {
    size_t n = op->samples ? op->samples().size() : 0;
    fmt::print("{:<22} {:>5} {:>7}  {:<58} {}\n", op->name, op->arity < 0 ? std::string("list") : std::to_string(op->arity),
               n, op->signature, op->saves.str());
  }
}

// The checks of one order of derivatives.
using Check = GradcheckReport (*)(const TensorFn&, const std::vector<Tensor>&, const GradcheckOptions&);
struct Order {
  std::string name;
  Check check;
};
const std::vector<Order> kOrders = {{"first", gradcheck}, {"second", gradgradcheck}, {"forward", jvpcheck}};

// Checks every sample of `op` to `order`; returns the number of failures.
int check_op(const OpDef& op, const Order& order, const GradcheckOptions& options, bool verbose) {
  int failures = 0;
  std::vector<OpSample> samples = op.samples ? op.samples() : std::vector<OpSample>{};
  if (samples.empty()) {
    fmt::print("{:<22} {:<36} {:<8} {:<24} {:>10} {:>10}  FAIL (no samples)\n", op.name, "-", order.name, "-", "-", "-");
    return 1;
  }
  for (const OpSample& s : samples) {
    std::string result;
    double abs_err = 0, rel_err = 0;
    GradcheckReport report;
    try {
      report = order.check(s.fn, s.inputs, options);
      for (const GradcheckInput& in : report.inputs) {
        abs_err = std::max(abs_err, in.max_abs_error);
        rel_err = std::max(rel_err, in.max_rel_error);
      }
      result = report.passed ? "pass" : "FAIL";
    } catch (const std::exception& e) {
      result = fmt::format("FAIL (threw: {})", e.what());
      report.passed = false;
    }
    failures += !report.passed;
    fmt::print("{:<22} {:<36} {:<8} {:<24} {:>10.2e} {:>10.2e}  {}\n", op.name, s.desc, order.name, shapes_of(s.inputs),
               abs_err, rel_err, result);
    if (!report.passed && verbose && !report.inputs.empty()) fmt::print("{}\n", report.str());
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"opcheck: list the op table, or check its ops' derivatives in float64"};
  std::vector<std::string> names, order_names{"first"};
  bool list = false, verbose = false;
  GradcheckOptions options;
  app.add_option("ops", names, "Ops to check (default: all)");
  app.add_flag("--list,-l", list, "List the ops and exit");
  app.add_flag("--verbose,-v", verbose, "Print the full gradcheck report of failing samples");
  app.add_option("--order", order_names,
                 "Derivatives to check: first (gradcheck), second (gradgradcheck), forward (jvpcheck)")
      ->delimiter(',')
      ->check(CLI::IsMember({"first", "second", "forward"}))
      ->capture_default_str();
  app.add_option("--eps", options.eps, "Finite-difference step")->capture_default_str();
  app.add_option("--atol", options.atol, "Absolute tolerance")->capture_default_str();
  app.add_option("--rtol", options.rtol, "Relative tolerance")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (list) {
    list_ops();
    return 0;
  }
  std::vector<const OpDef*> ops;
  if (names.empty()) {
    ops = op_table();
  } else {
    for (const std::string& n : names) {
      const OpDef* op = find_op(n);
      if (!op) {
        fmt::print(stderr, "opcheck: unknown op '{}' (see opcheck --list)\n", n);
        return 2;
      }
      ops.push_back(op);
    }
  }
  auto t0 = std::chrono::steady_clock::now();
  fmt::print("{:<22} {:<36} {:<8} {:<24} {:>10} {:>10}  {}\n", "op", "sample", "order", "shapes", "max abs", "max rel",
             "result");
  int failures = 0, samples = 0;
  for (const OpDef* op : ops) {
    for (const Order& order : kOrders)
      if (std::find(order_names.begin(), order_names.end(), order.name) != order_names.end())
        failures += check_op(*op, order, options, verbose);
    samples += op->samples ? static_cast<int>(op->samples().size()) : 0;
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("\n{} ops, {} samples, {} failed ({:.2f} s)\n", ops.size(), samples, failures, secs);
  return failures ? 1 : 0;
}
