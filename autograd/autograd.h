#pragma once
// Everything in autograd/: tensors, the tape, the ops, gradcheck.
#include "autograd/gradcheck.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/index.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/nn_ops.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/shape.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"
#include "autograd/tape.h"
#include "autograd/tensor.h"
