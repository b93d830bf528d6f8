#pragma once
/// \file
/// gradcheck: compares the autograd gradients of any function of tensors with
/// central finite differences, in float64.
///
///     auto report = tg::gradcheck([](const std::vector<Tensor>& x) { return my_op(x[0], x[1]); },
///                                 {a, b});          // a, b: float64, requires_grad
///     if (!report.passed) fmt::print("{}", report.str());
///
/// Full mode builds the whole Jacobian: one backward per output element and
/// two forwards per input element. Fast mode (for large inputs) checks
/// u^T J v along random directions u (output) and v (input) instead.
#include <functional>
#include <string>
#include <vector>

#include "tensor.h"

namespace tg {

/// Options of gradcheck() and gradgradcheck().
struct GradcheckOptions {
  double eps = 1e-6;            ///< finite-difference step
  double atol = 1e-5;           ///< an element passes if |analytic - numeric| <= atol + rtol |numeric|
  double rtol = 1e-3;           ///< see atol
  bool fast = false;            ///< u^T J v along random directions
  int directions = 4;           ///< fast mode: random (u, v) pairs per input
  bool check_noncontiguous = true;  ///< re-run backward with non-contiguous copies of the inputs
  bool raise = false;           ///< throw GradcheckError with the report on failure
  /// Perturb and differentiate the given tensors themselves instead of fresh
  /// copies: for tensors the function reaches on its own, such as a module's
  /// parameters (see nn::gradcheck_module). Implies no non-contiguous re-run.
  bool in_place = false;
  uint64_t seed = 0;            ///< seeds the random directions, the non-contiguous copies and gradgradcheck's u
};

/// What gradcheck found for one input.
struct GradcheckInput {
  int index = 0;            ///< position in the inputs
  std::string name;         ///< optional, e.g. a parameter's dotted name
  Shape shape;              ///< the input's shape
  bool checked = false;     ///< false: no grad required (e.g. integer indices)
  bool passed = true;       ///< every element (or direction) within tolerance
  ///@{
  /// The largest absolute and relative differences between analytic and numeric.
  double max_abs_error = 0, max_rel_error = 0;
  ///@}
  std::vector<int64_t> worst_index;  ///< multi-index into the input (full mode)
  ///@{
  /// The two gradients at the worst element (or direction).
  double analytic = 0, numeric = 0;
  ///@}
  std::string note;         ///< e.g. "no gradient reached this input (numeric is zero too)"
};

/// The result of gradcheck() or gradgradcheck().
struct GradcheckReport {
  bool passed = true;                  ///< every checked input passed
  std::vector<GradcheckInput> inputs;  ///< one per input, in order
  std::string str() const;  ///< a table, one line per input
};

/// Thrown by gradcheck() with GradcheckOptions::raise when a check fails.
struct GradcheckError : std::runtime_error {
  GradcheckReport report;  ///< the failing report (what() holds its table)
  /// An error carrying r.
  explicit GradcheckError(GradcheckReport r);
};

/// A function of tensors to check: inputs -> one output tensor.
using TensorFn = std::function<Tensor(const std::vector<Tensor>&)>;
/// Compares the gradients of fn at `inputs` (float64; those that require grad
/// are checked) with central finite differences. Returns the report, or
/// throws GradcheckError on failure with options.raise.
GradcheckReport gradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

/// jvpcheck: gradcheck of forward mode. Compares J v computed by jvp() (the
/// ops' tangent rules) with the central difference of fn along v, for every
/// input that requires grad: v runs over the input's elements (the whole
/// Jacobian, a column per jvp), or over options.directions random
/// directions in fast mode. Reports like gradcheck ("analytic" is J v).
GradcheckReport jvpcheck(const TensorFn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& options = {});

/// gradgradcheck: gradcheck of the backward. The function (inputs, u) ->
/// gradients of fn(inputs) . u, computed with create_graph, is compared with
/// finite differences, so the second derivatives (and the first ones, with
/// respect to u) are checked; u is random (options.seed). Reports like
/// gradcheck, with one more input, "grad_output".
GradcheckReport gradgradcheck(const TensorFn& fn, const std::vector<Tensor>& inputs,
                              const GradcheckOptions& options = {});

}  // namespace tg
