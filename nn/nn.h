#pragma once
/// \file
/// Everything in nn/: modules, layers, losses, optimizers, checkpoints.
#include "attention.h"
#include "checkpoint.h"
#include "dropout.h"
#include "embedding.h"
#include "feedforward.h"
#include "gradcheck_module.h"
#include "init.h"
#include "layer_norm.h"
#include "linear.h"
#include "loss.h"
#include "module.h"
#include "optim.h"
#include "positional.h"
#include "rnn.h"
#include "transformer.h"
