#pragma once
// Sampling text from any LanguageModel: greedy, temperature and top-k.
// Decoding is incremental (forward_step: the RNN's state, the transformer's
// key/value cache), so each new token costs one step, not a full re-run.
#include <cstdint>
#include <vector>

#include "../autograd/generator.h"
#include "language_model.h"

namespace tg::models {

struct SamplingOptions {
  int64_t max_new_tokens = 200;
  bool greedy = false;       // argmax; ignores temperature and top_k
  double temperature = 1.0;  // > 0; below 1 sharpens, above 1 flattens
  int64_t top_k = 0;         // 0: the whole vocabulary
};

// Picks the next token from one row of logits (V values).
int64_t sample_token(const std::vector<double>& logits, const SamplingOptions& options, Generator& gen);

// Continues prompt (non-empty ids) by max_new_tokens; returns only the new ids.
// Runs without recording a tape and leaves the model in eval mode. When a
// transformer's context fills up, it restarts from the last half block.
std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options, Generator& gen);

}  // namespace tg::models
