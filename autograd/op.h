#pragma once
/// \file
/// The op table. Every differentiable op declares, in one OpDef next to its
/// forward and backward (in its op-family file under autograd/ops/):
/// name, arity, its forward signature, what it saves, its backward, and
/// sample inputs that the table-walking test gradchecks in float64.
/// Defining an OpDef registers it; op_table() lists them all.
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tape.h"

namespace tg {

/// Fills grad_in[k] (shape of input k) for every input with node.needs(k);
/// grad_out has the node's output shape. Runs with grad mode set to the
/// pass's create_graph: written with tensor ops, a backward is then recorded
/// and can itself be differentiated (double backward). A backward that runs
/// fused kernels gives its tensor-op form as OpSpec::recorded_backward: the
/// engine picks the form, and no backward asks for the mode.
using BackwardFn = void (*)(const Node& node, const Tensor& grad_out, std::span<Tensor> grad_in);
/// Forward over reverse (hvp): the gradients of the inputs and, in
/// grad_in_tangents[k], the tangent of grad_in[k] at the open forward-AD level,
/// by fused kernels in one pass, where the recorded backward's ops would be
/// followed one by one. Reads grad_out's tangent with tangent(grad_out)
/// (undefined: zero). Returns false where it does not apply (the engine then
/// runs the recorded backward); the engine attaches the tangents and keeps
/// only the gradients of the inputs the node needs, so the rule may fill all.
using BackwardTangentsFn = bool (*)(const Node& node, const Tensor& grad_out, std::span<Tensor> grad_in,
                                    std::span<Tensor> grad_in_tangents);
/// Forward mode: fills tangent_out[0] (output shape) and, for an op with side
/// outputs, tangent_out[k] (side output k's shape) with the tangent of each
/// output given the tangents of the inputs, tangent_in[k] for input k
/// (undefined: zero; an output's tangent may be left undefined when it is
/// zero). Reads what the op saved, like its backward. Runs with forward mode
/// off, and with grad mode on when the level records its tangents
/// (ForwardADGuard): written with tensor ops, the tangent is then recorded and
/// can be differentiated in reverse (reverse-over-forward). Applied to the
/// ops of a recorded backward, the rules give forward-over-reverse.
using TangentFn = void (*)(const Node& node, std::span<const Tensor> tangent_in, std::span<Tensor> tangent_out);
/// A linear primitive's transpose. For an op linear in one input v (out =
/// A v, A fixed by the node's other inputs): A^T u for a cotangent u of the
/// output's shape. The engine gives v this gradient itself, so the op's
/// backward fills only its other inputs' gradients; written with tensor ops,
/// it is recorded under create_graph like any backward.
using TransposeFn = Tensor (*)(const Node& node, const Tensor& u);
/// Which input an op is linear in, and its transpose (OpSpec::linear). The
/// op-table test checks <u, A v> = <A^T u, v> on the op's samples.
struct Linearity {
  int input = -1;                    ///< the input v the op is linear in; -1: none declared
  TransposeFn transpose = nullptr;   ///< v's gradient
};
/// Rebuilds the op's output, bit for bit, from what its node saved. An op with
/// a cheap one (layer_norm, gelu) lets a later op that saves this output keep a
/// reference to the node instead of the tensor (see Node::save), so e.g. a
/// LayerNorm followed by a Linear holds one activation, not two.
using RecomputeFn = Tensor (*)(const Node& node);
/// For an op whose input gradient is its output gradient written into part
/// of a zero tensor (slice, and select and narrow through it): adds
/// grad_out into that part of grad_in, a dense tensor of the input's shape.
/// When the input's gradient is already accumulating in a dense buffer that
/// nothing else holds (the second and later of several slices of one
/// tensor, like attention's q, k and v of one fused projection), a plain
/// backward pass adds into it instead of running backward, which would
/// allocate a zero tensor of the whole input per slice.
using AccumulateFn = void (*)(const Node& node, const Tensor& grad_out, Tensor& grad_in);

/// One gradcheck case: fn applied to inputs (float64; some may be int64 indices).
struct OpSample {
  std::string desc;                  ///< e.g. "broadcast (3,1)+(4)"
  std::vector<Tensor> inputs;        ///< the arguments, float64 leaves that require grad, or int64
  std::function<Tensor(const std::vector<Tensor>&)> fn;  ///< calls the op on inputs
};
/// Returns an op's gradcheck cases (OpDef::samples).
using SampleFn = std::vector<OpSample> (*)();

/// What an op declares, each part by name:
///
///     static const OpDef mul_op({.name = "mul", .arity = 2, .signature = "mul(a, b) -> a * b",
///                                .saves = saves_of<MulSaved>(), .backward = mul_backward,
///                                .tangent = mul_tangent, .samples = mul_samples});
///
/// name, arity, signature, saves and backward are required; the rest are
/// optional (null or false when omitted).
struct OpSpec {
  std::string_view name;       ///< as in error messages and the profiler
  int arity = 0;               ///< tensor inputs; -1 for a list (concat, stack)
  std::string_view signature;  ///< the forward, e.g. "mul(a, b) -> a * b, broadcasting"
  SavedLayout saves = {};      ///< what forward saves for backward: saves_of<its saved struct>()
  BackwardFn backward = nullptr;  ///< the gradients of the inputs
  /// Where the backward is recorded (grad mode on: create_graph, a tangent
  /// derived from the backward), the same gradients in tensor ops, so that
  /// they differentiate again; null: backward serves both. For an op whose
  /// backward is a fused kernel. The engine picks the form, not the op.
  BackwardFn recorded_backward = nullptr;
  /// Forward over reverse, fused (see BackwardTangentsFn); null: the engine
  /// follows the recorded backward's ops.
  BackwardTangentsFn backward_with_tangents = nullptr;
  /// Forward mode. Null: the engine derives the tangent from the backward
  /// (tangent_from_backward, two backward passes of the op; one, with
  /// self_adjoint), unless the op is once_differentiable, where forward mode
  /// through it is an AutogradError.
  TangentFn tangent = nullptr;
  /// True for an op of one input whose Jacobian is symmetric (elementwise
  /// ops, softmax, dropout): its tangent J t is J^T t, the backward run on
  /// the input's tangent, so it declares no tangent rule (PyTorch's
  /// auto_element_wise). The op-table test's jvpcheck checks the claim.
  bool self_adjoint = false;
  /// True for a tangent rule that runs raw kernels (the recurrences' fused
  /// linear recurrences): where tangents are recorded (a forward-AD level that
  /// differentiates them, reverse-over-forward), the engine derives the
  /// tangent from the backward instead.
  bool tangent_once_differentiable = false;
  /// Where tangents are recorded, the same tangent in tensor ops; null: tangent
  /// serves both (or, with tangent_once_differentiable, the derived one). For
  /// a tangent rule that runs a fused kernel where it can (mul, matmul).
  TangentFn recorded_tangent = nullptr;
  SampleFn samples = nullptr;     ///< the cases gradchecked for this op (null: none)
  RecomputeFn recompute = nullptr;  ///< null: the output cannot be rebuilt
  /// True for an op whose backward is raw kernels only: create_graph through
  /// it is an AutogradError naming the op (PyTorch's once_differentiable).
  /// Every op of the library's table is differentiable twice.
  bool once_differentiable = false;
  AccumulateFn accumulate = nullptr;  ///< null: backward always allocates its input gradients
  Linearity linear = {};              ///< a linear primitive's input and transpose (none by default)
};

/// A differentiable op: its OpSpec, registered. Define one as a static object
/// beside the op's forward, which passes it to record(); it registers itself
/// in op_table().
struct OpDef : OpSpec {
  /// Registers the op; a name already registered, or a spec without a name
  /// or a backward, is a ValueError.
  explicit OpDef(const OpSpec& spec);
  ~OpDef();  ///< unregisters
  OpDef(const OpDef&) = delete;
  OpDef& operator=(const OpDef&) = delete;
};

/// Runs the op's backward for node in the form the pass needs: fused with
/// tangents in forward over reverse, recorded in grad mode, plain otherwise;
/// and its transpose (OpSpec::linear) for the input it is linear in. Every
/// pass calls this.
void run_backward(const Node& node, const Tensor& grad_out, std::span<Tensor> grad_in);

/// A tangent rule for any op whose backward is written in tensor ops: with
/// the backward applied to a cotangent u (and, for side outputs, u_k) that
/// requires grad, J v = d/du <J^T u, v>. It costs two backward passes of the
/// op; an op on a hot path gives a rule of its own instead. An op that declares
/// no tangent rule gets this one.
void tangent_from_backward(const Node& node, std::span<const Tensor> tangent_in, std::span<Tensor> tangent_out);

/// Every registered op, sorted by name.
std::vector<const OpDef*> op_table();
/// The registered op of that name, or nullptr.
const OpDef* find_op(std::string_view name);

}  // namespace tg
