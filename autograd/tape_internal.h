#pragma once
// What the backward pass (backward.cpp) takes from the recording side of the
// tape (tape.cpp). Internal to autograd/ (not installed).
#include <string>

#include "autograd/tape.h"

namespace tg::detail {

// grad(outputs, inputs) over a region of the graph that the inputs bound:
// the partial derivatives, following no edge out of an input. A backward that
// reruns its function on its saved inputs (checkpoint, lstm_recompute) takes
// this one: where an input depends on a tensor that the function also reads
// (h = tanh(x w) into a checkpoint that reads w), the path through h is the
// outer pass's to follow, and grad()'s total derivative would count it twice.
std::vector<Tensor> region_grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                                const std::vector<Tensor>& grad_outputs, const GradOptions& options);

// "'op' (output shape dtype)", how errors name a node.
std::string describe_node(const Node& n);

// grad_and_tangents(): while one is alive on this thread, the backward's ops
// compute tangents without being recorded (record() in tangents-only mode).
class TangentsOnly {
 public:
  TangentsOnly();
  ~TangentsOnly();
  TangentsOnly(const TangentsOnly&) = delete;
  TangentsOnly& operator=(const TangentsOnly&) = delete;
};

}  // namespace tg::detail
