#pragma once
// What the backward pass (backward.cpp) takes from the recording side of the
// tape (tape.cpp). Internal to autograd/ (not installed).
#include <string>

#include "autograd/tape.h"

namespace tg::detail {

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
