#pragma once
// (B,T) windows of a token stream for language models: the inputs are
// tokens [o, o+T) and the targets tokens [o+1, o+T+1), so targets[b][t] is the
// token that follows inputs[b][t].
#include <cstdint>
#include <vector>

#include "../autograd/generator.h"
#include "../autograd/tensor.h"

namespace tg::data {

struct LMBatch {
  Tensor inputs;   // (B,T) int64
  Tensor targets;  // (B,T) int64, inputs shifted left by one token
};

class LMBatches {
 public:
  // ids: the whole stream (N tokens, each in [0, 2^31)), N >= T + 1; block: T.
  // Stored as uint16 when every id is below 2^16 (a character or GPT-2-sized
  // vocabulary: a 5M-token corpus takes 10 MiB, not 40 as int64), else int32.
  LMBatches(const std::vector<int64_t>& ids, int64_t block);
  LMBatches(std::vector<int32_t> ids, int64_t block);
  // ids (N,) int64
  LMBatches(const Tensor& ids, int64_t block);

  int64_t block() const { return block_; }
  int64_t num_tokens() const { return static_cast<int64_t>(narrow_.empty() ? ids_.size() : narrow_.size()); }
  // Non-overlapping windows [k*T, (k+1)*T) that have a next token: (N-1)/T.
  int64_t num_windows() const { return (num_tokens() - 1) / block_; }

  // Training: B windows at uniformly random offsets in [0, N-T-1], drawn from
  // gen (B draws), so a saved generator state replays the same batches.
  LMBatch sample(int64_t batch, Generator& gen) const;

  // Evaluation, the whole stream in order: batch `index` of
  // num_batches(batch) holds the non-overlapping windows index*B ...
  // (the last batch may have fewer rows).
  int64_t num_batches(int64_t batch) const;
  LMBatch sequential(int64_t index, int64_t batch) const;

  // Evaluation on a fixed subset: batch `index` of `count` batches of B
  // windows each, the count*B windows spread evenly from the start to the end
  // of the stream. The same windows on every call, so validation losses are
  // comparable across steps, models and runs.
  LMBatch fixed(int64_t index, int64_t count, int64_t batch) const;

 private:
  LMBatch gather(const std::vector<int64_t>& offsets) const;
  std::vector<uint16_t> narrow_;  // the stream when every id < 2^16; ids_ is then empty
  std::vector<int32_t> ids_;
  int64_t block_;
};

}  // namespace tg::data
