#pragma once
/// \file
/// Forward mode: tangents, Jacobian-vector products, and the functional API
/// built on both modes (jvp, vjp, hvp, jacobian, hessian).
///
/// Under a ForwardADGuard a tensor may carry a tangent: make_dual(x, v) is x
/// with tangent v. Forward mode rides on the tape: a dual tensor requires
/// grad, every op on it is recorded as usual, and its node keeps its inputs'
/// tangents. The op's tangent rule (OpDef::tangent) gives the output's
/// tangent when it is first read: by the next op that takes the output, or
/// by tangent(). So the tangents follow the forward one op behind, and a rule
/// reads what the op saved for its backward.
///
///     tg::ForwardADGuard fw;
///     Tensor x = tg::make_dual(x0, v);
///     Tensor y = f(x);
///     Tensor jv = tg::tangent(y);   // J(x0) v
///
/// Tangent rules are written in tensor ops and (by default) run with grad mode
/// on, so a tangent can be differentiated in reverse; the tangent of a
/// gradient computed with create_graph is a Hessian-vector product (forward
/// over reverse: hvp()). One forward-AD level at a time per thread.
#include <functional>
#include <vector>

#include "tensor.h"

namespace tg {

/// Opens a forward-AD level on this thread for its lifetime (torch's
/// fwAD.dual_level). Tangents made inside it vanish with it. Opening a second
/// one while one is open is an AutogradError.
class ForwardADGuard {
 public:
  /// Opens the level. With differentiable_tangents the tangent rules are
  /// recorded (in grad mode), so tangents can be differentiated in reverse;
  /// without, they run under no_grad and keep no graph (what hvp needs).
  explicit ForwardADGuard(bool differentiable_tangents = true);
  ~ForwardADGuard();  ///< closes it
  ForwardADGuard(const ForwardADGuard&) = delete;
  ForwardADGuard& operator=(const ForwardADGuard&) = delete;
};

/// Whether a forward-AD level is open on this thread.
bool forward_ad_enabled();

/// primal with tangent `tangent` (same shape and dtype, floating). The result
/// shares primal's data and requires grad: a new leaf when primal does not
/// require grad; primal itself when it is a leaf that requires grad (a
/// parameter: the modules that hold it see the tangent, until the level
/// closes); else a view of it recorded on the tape (so gradients still reach
/// primal). AutogradError outside a ForwardADGuard.
Tensor make_dual(const Tensor& primal, const Tensor& tangent);
/// The tangent t carries at this level, or an undefined tensor when it is
/// zero (t made without one). Computes it if its op's rule has not run yet;
/// an op without a tangent rule is an AutogradError naming the op.
Tensor tangent(const Tensor& t);
/// A dual tensor's parts (torch's unpack_dual).
struct Dual {
  Tensor primal;   ///< t itself
  Tensor tangent;  ///< tangent(t): undefined when zero
};
/// t and its tangent.
Dual unpack_dual(const Tensor& t);

/// What grad_and_tangents() returns, one entry per input.
struct GradTangents {
  std::vector<Tensor> grads;     ///< the gradients, as grad() (undefined where the outputs do not reach)
  std::vector<Tensor> tangents;  ///< their tangents at the open level (undefined: zero)
};
/// Forward over reverse without a graph of the backward: the gradients of the
/// outputs with respect to the inputs (as grad() with create_graph, unused
/// inputs allowed) and their tangents at the open forward-AD level. The
/// backward's ops compute their tangents as they run and record nothing, so
/// its intermediates (and their tangents) are freed as the pass goes; the
/// gradients do not require grad. Without retain_graph the forward's graph
/// goes too, node by node as the pass leaves it (what each node saved and
/// the tangents it kept), as in a plain backward. With the inputs' tangents
/// v, the tangents are H v. AutogradError outside a ForwardADGuard.
GradTangents grad_and_tangents(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                               const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false);

/// A function of several tensors to several tensors.
using TensorListFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

/// Outputs of fn and their tangents (or gradients).
struct JvpResult {
  std::vector<Tensor> outputs;   ///< fn(primals), detached
  std::vector<Tensor> tangents;  ///< jvp: J v per output (zeros where none reached it)
};
/// Outputs of fn and the gradients of the primals.
struct VjpResult {
  std::vector<Tensor> outputs;  ///< fn(primals), detached
  std::vector<Tensor> grads;    ///< vjp: J^T u per primal (zeros where the outputs do not reach it)
};

/// Jacobian-vector product: fn(primals) and its directional derivative along
/// `tangents` (one per primal, its shape and dtype; undefined: none), in one
/// forward pass. With create_graph the outputs and tangents stay on the tape,
/// differentiable with respect to the primals and tangents that require grad
/// (reverse over forward); without, they are detached.
JvpResult jvp(const TensorListFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& tangents,
              bool create_graph = false);
/// Vector-Jacobian product: fn(primals) and the gradients of
/// sum_k <outputs[k], cotangents[k]> with respect to the primals, by one
/// backward pass; recorded with create_graph, as grad()'s.
VjpResult vjp(const TensorListFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& cotangents,
              bool create_graph = false);

/// What hvp() returns.
struct HvpResult {
  Tensor value;               ///< fn(primals), a scalar, detached
  std::vector<Tensor> grads;  ///< the gradient of fn per primal, detached
  std::vector<Tensor> hvp;    ///< H v per primal, H the Hessian of fn over all primals
};
/// Hessian-vector product of a scalar function, forward over reverse: the
/// tangent, along v, of its gradient (grad_and_tangents). Costs about three
/// gradients, like reverse over reverse, without recording the backward. A primal that is a parameter (a leaf requiring
/// grad) is differentiated as itself, so fn may reach it through a module and
/// ignore its argument; the others as fresh leaves.
HvpResult hvp(const TensorListFn& fn, const std::vector<Tensor>& primals, const std::vector<Tensor>& v);

/// How jacobian() builds the matrix.
enum class JacobianMode {
  forward,  ///< one jvp per input element: a column at a time (few inputs, many outputs)
  reverse,  ///< one vjp per output element: a row at a time (many inputs, few outputs)
};
/// Options of jacobian().
struct JacobianOptions {
  JacobianMode mode = JacobianMode::reverse;  ///< columns by forward mode or rows by reverse mode
};
/// The Jacobian of fn at inputs, for small problems: result[i][j] is
/// d outputs[i] / d inputs[j], of shape outputs[i].shape + inputs[j].shape.
std::vector<std::vector<Tensor>> jacobian(const TensorListFn& fn, const std::vector<Tensor>& inputs,
                                          const JacobianOptions& options = {});
/// The Hessian of a scalar fn at inputs, for small problems, one
/// forward-over-reverse hvp per input element: result[i][j] is
/// d^2 fn / d inputs[i] d inputs[j], of shape inputs[i].shape + inputs[j].shape.
std::vector<std::vector<Tensor>> hessian(const TensorListFn& fn, const std::vector<Tensor>& inputs);

}  // namespace tg
