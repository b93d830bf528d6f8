#pragma once
/// \file
/// Everything in autograd/: tensors, the tape, the ops (one header per op
/// family), gradcheck, forward mode and the functional API, activation
/// checkpointing and anomaly detection.
#include "activation_checkpoint.h"
#include "anomaly.h"
#include "autocast.h"
#include "forward_ad.h"
#include "gradcheck.h"
#include "ops/attention.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "ops/index.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/reduce.h"
#include "ops/rnn_ops.h"
#include "ops/shape.h"
#include "ops/softmax.h"
#include "ops/view.h"
#include "parallel.h"
#include "profiler.h"
#include "tape.h"
#include "tensor.h"
