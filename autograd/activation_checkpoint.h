#pragma once
/// \file
/// Activation checkpointing (torch.utils.checkpoint, non-reentrant): trade
/// compute for memory where one chooses.
///
///     // y = block(x): the forward keeps x, not the block's activations;
///     // backward reruns the block to rebuild them, then backpropagates.
///     Tensor y = tg::checkpoint([&](const std::vector<Tensor>& in) { return block.forward(in[0]); }, {x});
///
/// The forward of fn runs with recording suspended: of everything it computes
/// only its output stays, as the output of one "checkpoint" node that saves
/// fn's inputs. The tensors requiring grad that fn reaches without taking them
/// as inputs (a module's parameters, a tensor it captured) are found as it
/// runs and become inputs of that node too, so their gradients reach their
/// .grad, grad(), hooks and data-parallel averaging as without checkpointing.
///
/// Backward reruns fn on the saved inputs under the precision (autocast) and
/// with the random state (the generators' seed and offset) of the forward, so
/// every dropout mask is the same bit for bit, records it, and backpropagates
/// the incoming gradient through it; what it rebuilt is freed with its
/// backward. With create_graph the rebuilt graph is attached to the saved
/// inputs, so gradients through a checkpoint differentiate again
/// (Hessian-vector products equal the plain ones).
#include <functional>
#include <vector>

#include "generator.h"
#include "tensor.h"

namespace tg {

/// Options of checkpoint().
struct CheckpointOptions {
  /// The generators fn draws from (dropout), restored before the rerun; empty
  /// means default_generator() alone.
  std::vector<Generator*> generators;
  /// The ops that save the output keep a reference to this checkpoint instead
  /// of the tensor, so its memory is freed once the forward drops it; the
  /// first of their backwards to read it gets it from this checkpoint's rerun,
  /// which the checkpoint's own backward then reuses (in a plain pass: one
  /// rerun serves both). For an output read only by checkpoints that run
  /// backward just before this one, like the row chunks of a transformer
  /// layer's MLP on its attention half's output: each layer then holds its
  /// input alone. Not for a chain of checkpoints each saving the last's
  /// output (a recurrence over chunks of steps): rebuilding one would rerun
  /// all those before it.
  bool output_by_reference = false;
};

/// fn(inputs), keeping only the inputs and the output for backward, which
/// reruns fn. fn must compute the same function every time it is called with
/// the same inputs and random state (it may draw from `options.generators`).
/// Under no_grad, or when nothing fn reads requires grad, it is fn(inputs).
Tensor checkpoint(std::function<Tensor(const std::vector<Tensor>&)> fn, const std::vector<Tensor>& inputs,
                  const CheckpointOptions& options = {});

}  // namespace tg
