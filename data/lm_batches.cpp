#include "data/lm_batches.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "data/error.h"

namespace tg::data {

namespace {

std::vector<int64_t> stream_from_tensor(const Tensor& ids) {
  if (!ids.defined()) throw ValueError("LMBatches: the token tensor is undefined");
  if (ids.dtype() != DType::i64)
    throw DTypeError(fmt::format("LMBatches: token ids must be int64, got {}", dtype_name(ids.dtype())));
  if (ids.dim() != 1) throw ShapeError(fmt::format("LMBatches: token ids must be 1-D (N,), got {}", describe({&ids, 1})));
  return ids.to_vector<int64_t>();
}

std::vector<int32_t> narrow_ids(const std::vector<int64_t>& ids) {
  std::vector<int32_t> out(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] > std::numeric_limits<int32_t>::max())
      throw IndexError(fmt::format("LMBatches: token id {} at position {} is outside [0, 2^31)", ids[i], i));
    out[i] = static_cast<int32_t>(ids[i]);
  }
  return out;
}

}  // namespace

LMBatches::LMBatches(const std::vector<int64_t>& ids, int64_t block) : LMBatches(narrow_ids(ids), block) {}

LMBatches::LMBatches(std::vector<int32_t> ids, int64_t block) : ids_(std::move(ids)), block_(block) {
  if (block_ < 1) throw ValueError(fmt::format("LMBatches: block (T) must be positive, got {}", block_));
  int32_t max_id = 0;
  for (size_t i = 0; i < ids_.size(); ++i) {
    if (ids_[i] < 0) throw IndexError(fmt::format("LMBatches: token id {} at position {} is negative", ids_[i], i));
    max_id = std::max(max_id, ids_[i]);
  }
  if (max_id <= std::numeric_limits<uint16_t>::max()) {
    narrow_.assign(ids_.begin(), ids_.end());
    std::vector<int32_t>().swap(ids_);  // frees the int32 copy
  }
  if (num_tokens() < block_ + 1)
    throw DataError(fmt::format("LMBatches: {} tokens are too few for block {} (need at least {}: T inputs and "
                                "the next token)", num_tokens(), block_, block_ + 1));
}

LMBatches::LMBatches(const Tensor& ids, int64_t block) : LMBatches(stream_from_tensor(ids), block) {}

LMBatch LMBatches::gather(const std::vector<int64_t>& offsets) const {
  const int64_t B = static_cast<int64_t>(offsets.size()), T = block_;
  std::vector<int64_t> in(B * T), out(B * T);
  auto copy_windows = [&](const auto* stream) {
    for (int64_t b = 0; b < B; ++b) {
      const auto* src = stream + offsets[b];
      std::copy(src, src + T, in.begin() + b * T);
      std::copy(src + 1, src + T + 1, out.begin() + b * T);
    }
  };
  if (narrow_.empty())
    copy_windows(ids_.data());
  else
    copy_windows(narrow_.data());
  return {from_vector(in, {B, T}), from_vector(out, {B, T})};
}

LMBatch LMBatches::sample(int64_t batch, Generator& gen) const {
  if (batch < 1) throw ValueError(fmt::format("LMBatches::sample: batch (B) must be positive, got {}", batch));
  std::vector<int64_t> offsets(batch);
  for (auto& o : offsets) o = gen.randint(0, num_tokens() - block_);
  return gather(offsets);
}

int64_t LMBatches::num_batches(int64_t batch) const {
  if (batch < 1) throw ValueError(fmt::format("LMBatches::num_batches: batch (B) must be positive, got {}", batch));
  return (num_windows() + batch - 1) / batch;
}

LMBatch LMBatches::sequential(int64_t index, int64_t batch) const {
  const int64_t n = num_batches(batch);
  if (index < 0 || index >= n)
    throw IndexError(fmt::format("LMBatches::sequential: batch {} is out of range for {} batches of {} windows of {} "
                                 "tokens", index, n, batch, block_));
  std::vector<int64_t> offsets;
  for (int64_t k = index * batch; k < std::min(num_windows(), (index + 1) * batch); ++k) offsets.push_back(k * block_);
  return gather(offsets);
}

LMBatch LMBatches::fixed(int64_t index, int64_t count, int64_t batch) const {
  if (count < 1 || batch < 1)
    throw ValueError(fmt::format("LMBatches::fixed: count and batch (B) must be positive, got {} and {}", count, batch));
  if (index < 0 || index >= count)
    throw IndexError(fmt::format("LMBatches::fixed: batch {} is out of range for {} batches", index, count));
  // Window k of K starts at round(k * last / (K-1)): the first at 0, the last
  // at the last valid offset, evenly spaced in between.
  const int64_t K = count * batch, last = num_tokens() - block_ - 1;
  std::vector<int64_t> offsets(batch);
  for (int64_t j = 0; j < batch; ++j) {
    int64_t k = index * batch + j;
    offsets[j] = K == 1 ? 0 : static_cast<int64_t>((static_cast<__int128>(k) * last * 2 + (K - 1)) / (2 * (K - 1)));
  }
  return gather(offsets);
}

}  // namespace tg::data
