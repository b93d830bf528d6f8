#pragma once
/// \file
/// All of tapegrad in one include: `#include <tapegrad/tapegrad.h>`. The finer
/// headers sit beside this one, named by folder: <tapegrad/autograd/tensor.h>,
/// <tapegrad/nn/linear.h>, <tapegrad/models/gpt.h>, <tapegrad/data/text.h>.
///
/// A user's build needs C++20 and fmt's headers (tensors and shapes format
/// with fmt); pkg-config's `tapegrad` and CMake's `tapegrad::tapegrad` give both.
#include <tapegrad/version.h>

// Relative to this file: the folders beside it, both in an installed tree and
// in the source tree (where include/tapegrad/ holds links to the folders).
#include "autograd/autograd.h"
#include "autograd/op.h"
#include "autograd/ops/rnn_ops.h"
#include "autograd/ops/samples.h"
#include "data/brown.h"
#include "data/corpus.h"
#include "data/lm_batches.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "models/generate.h"
#include "models/gpt.h"
#include "models/registry.h"
#include "models/rnn_lm.h"
#include "models/seq2seq.h"
#include "models/training_state.h"
#include "models/transformer.h"
#include "models/word2vec.h"
#include "models/word_eval.h"
#include "nn/nn.h"
