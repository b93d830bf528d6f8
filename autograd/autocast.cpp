#include "autograd/autocast.h"

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "autograd/error.h"
#include "autograd/parallel.h"
#include "autograd/tensor.h"

namespace tg {
namespace {

thread_local DType current = DType::f32;

// The bfloat16 copies of kept storages, by the address of their float32
// data. An entry holds its storage weakly: a freed storage's memory can come
// back from the allocator as another tensor, so an expired entry never answers.
struct Copy {
  std::weak_ptr<Storage> storage;
  const float* end = nullptr;
  uint64_t version = ~uint64_t{0};  // of the storage when rounded; ~0: not yet
  std::vector<bfloat16> values;     // nbytes / 4 of them
  uint64_t generation = 0;          // names these values (next_generation) since they were rounded
  bool scoped = false;              // a RoundOnce's: dropped at its scope's end unless kept meanwhile
};

// A number no rounding of any copy had before: (copy address, generation)
// names one content, for those that keep something made from a copy.
uint64_t next_generation() {
  static std::atomic<uint64_t> counter{0};
  return ++counter;
}

struct Cache {
  std::mutex mutex;
  std::map<const float*, Copy> copies;  // by start address
  size_t pruned_at = 0;                 // size after the last sweep of expired entries
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: GEMMs may run during static destruction
  return *c;
}

void round_into(const float* src, bfloat16* dst, int64_t n) {
  parallel_for(n, int64_t{1} << 15, [&](int64_t b, int64_t e) { float_to_bf16(src + b, dst + b, e - b); });
}

}  // namespace

DType autocast_dtype() { return current; }

AutocastGuard::AutocastGuard(DType dtype) : prev_(current) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw DTypeError(fmt::format("AutocastGuard: GEMMs compute in float32 or bfloat16, not {}", dtype_name(dtype)));
  current = dtype;
}
AutocastGuard::~AutocastGuard() { current = prev_; }

namespace detail {

DType exchange_autocast_dtype(DType dtype) {
  DType prev = current;
  current = dtype;
  return prev;
}

void autocast_keep(const Tensor& leaf) {
  if (leaf.dtype() != DType::f32) return;
  const std::shared_ptr<Storage>& s = leaf.storage();
  const auto* begin = static_cast<const float*>(s->data);
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.copies.find(begin);
  if (it != c.copies.end() && it->second.storage.lock() == s) {
    it->second.scoped = false;  // a RoundOnce's copy is kept from now on
    return;
  }
  // Sweep expired entries once the map has doubled since the last sweep.
  if (c.copies.size() >= 2 * c.pruned_at + 16) {
    std::erase_if(c.copies, [](const auto& kv) { return kv.second.storage.expired(); });
    c.pruned_at = c.copies.size();
    it = c.copies.find(begin);
  }
  Copy& copy = it != c.copies.end() ? it->second : c.copies[begin];
  copy = Copy{s, begin + s->nbytes / sizeof(float), ~uint64_t{0}, {}};
}

const bfloat16* autocast_cached(const float* p, uint64_t* generation) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  auto it = c.copies.upper_bound(p);
  if (it == c.copies.begin()) return nullptr;
  --it;
  Copy& copy = it->second;
  if (p >= copy.end) return nullptr;
  std::shared_ptr<Storage> s = copy.storage.lock();
  if (!s || s->data != it->first) return nullptr;
  if (copy.version != s->version) {
    const int64_t n = copy.end - it->first;
    copy.values.resize(n);
    round_into(it->first, copy.values.data(), n);
    copy.version = s->version;
    copy.generation = next_generation();
  }
  if (generation) *generation = copy.generation;
  return copy.values.data() + (p - it->first);
}

RoundOnce::RoundOnce(const Tensor& t) {
  if (!autocast_enabled() || !t.defined() || t.dtype() != DType::f32 || t.numel() == 0) return;
  const std::shared_ptr<Storage>& s = t.storage();
  const auto* begin = static_cast<const float*>(s->data);
  const int64_t n = static_cast<int64_t>(s->nbytes / sizeof(float));
  Cache& c = cache();
  {
    std::lock_guard lock(c.mutex);
    if (auto it = c.copies.find(begin); it != c.copies.end() && it->second.storage.lock() == s) return;  // kept
  }
  Copy copy{s, begin + n, s->version, std::vector<bfloat16>(n), next_generation(), true};
  round_into(begin, copy.values.data(), n);  // outside the lock
  std::lock_guard lock(c.mutex);
  c.copies.insert_or_assign(begin, std::move(copy));
  added_ = begin;
}

RoundOnce::~RoundOnce() {
  if (!added_) return;
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  if (auto it = c.copies.find(added_); it != c.copies.end() && it->second.scoped) c.copies.erase(it);
}

}  // namespace detail
}  // namespace tg
