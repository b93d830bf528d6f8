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
/// and can itself be differentiated (double backward). A fused kernel is
/// fine on the plain path; under grad_enabled() take a differentiable form.
using BackwardFn = void (*)(const Node& node, const Tensor& grad_out, std::span<Tensor> grad_in);
/// Rebuilds the op's output, bit for bit, from what its node saved. An op with
/// a cheap one (layer_norm, gelu) lets a later op that saves this output keep a
/// reference to the node instead of the tensor (see Node::save), so e.g. a
/// LayerNorm followed by a Linear holds one activation, not two.
using RecomputeFn = Tensor (*)(const Node& node);

/// One gradcheck case: fn applied to inputs (float64; some may be int64 indices).
struct OpSample {
  std::string desc;                  ///< e.g. "broadcast (3,1)+(4)"
  std::vector<Tensor> inputs;        ///< the arguments, float64 leaves that require grad, or int64
  std::function<Tensor(const std::vector<Tensor>&)> fn;  ///< calls the op on inputs
};
/// Returns an op's gradcheck cases (OpDef::samples).
using SampleFn = std::vector<OpSample> (*)();

/// A differentiable op: its name, forward signature, backward and gradcheck
/// samples. Define one as a static object beside the op's forward, which
/// passes it to record(); it registers itself in op_table().
struct OpDef {
  std::string_view name;       ///< as in error messages and the profiler
  int arity;                   ///< tensor inputs; -1 for a list (concat, stack)
  std::string_view signature;  ///< the forward, e.g. "mul(a, b) -> a * b, broadcasting"
  std::string_view saves;      ///< what forward saves for backward
  BackwardFn backward;         ///< the gradients of the inputs
  SampleFn samples;            ///< the cases gradchecked for this op (null: none)
  RecomputeFn recompute;       ///< null: the output cannot be rebuilt
  /// True for an op whose backward is raw kernels only: create_graph through
  /// it is an AutogradError naming the op (PyTorch's once_differentiable).
  /// Every op of the library's table is differentiable twice.
  bool once_differentiable;

  /// Registers the op; a name already registered is a ValueError.
  OpDef(std::string_view name, int arity, std::string_view signature, std::string_view saves,
        BackwardFn backward, SampleFn samples, RecomputeFn recompute = nullptr, bool once_differentiable = false);
  ~OpDef();  ///< unregisters
  OpDef(const OpDef&) = delete;
  OpDef& operator=(const OpDef&) = delete;
};

/// Every registered op, sorted by name.
std::vector<const OpDef*> op_table();
/// The registered op of that name, or nullptr.
const OpDef* find_op(std::string_view name);

}  // namespace tg
