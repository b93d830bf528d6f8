#include "autograd/storage.h"

#include <cstdlib>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

namespace tg {
namespace {

// Size classes: exact sizes up to 4 KiB rounded to 64 bytes; above that, to
// the next multiple of 1/8 of a power of two, so a block is at most ~12% larger
// than asked and same-shaped tensors of consecutive steps hit the same bin.
size_t round_size(size_t n) {
  if (n <= 4096) return (n + 63) & ~size_t{63};
  size_t p = size_t{1} << (63 - __builtin_clzll(n));  // largest power of 2 <= n
  size_t step = p / 8;
  return (n + step - 1) / step * step;
}

struct Cache {
  std::mutex mu;
  std::unordered_map<size_t, std::vector<void*>> free_blocks;
  AllocatorStats stats;

  void* get(size_t bytes) {
    std::lock_guard lock(mu);
    ++stats.allocations;
    stats.bytes_in_use += bytes;
    stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
    auto it = free_blocks.find(bytes);
    if (it != free_blocks.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      ++stats.cache_hits;
      stats.bytes_cached -= bytes;
      return p;
    }
    ++stats.system_allocs;
    void* p = std::aligned_alloc(64, bytes);
    if (!p) {
      // Give the cache back to the system and try once more before failing.
      release_locked();
      p = std::aligned_alloc(64, bytes);
      if (!p) throw std::bad_alloc();
    }
    return p;
  }
  void put(void* p, size_t bytes) {
    std::lock_guard lock(mu);
    stats.bytes_in_use -= bytes;
    stats.bytes_cached += bytes;
    free_blocks[bytes].push_back(p);
  }
  void release_locked() {
    for (auto& [size, blocks] : free_blocks) {
      for (void* p : blocks) std::free(p);
      blocks.clear();
    }
    stats.bytes_cached = 0;
  }
};

Cache& cache() {
  // Leaked on purpose: tensors in static objects may be destroyed after it.
  static Cache* c = new Cache();
  return *c;
}

}  // namespace

Storage::~Storage() {
  if (owned && data) cache().put(data, nbytes);
}

std::shared_ptr<Storage> new_storage(size_t nbytes) {
  auto s = std::make_shared<Storage>();
  s->nbytes = round_size(std::max<size_t>(nbytes, 1));
  s->data = cache().get(s->nbytes);
  return s;
}

AllocatorStats allocator_stats() {
  std::lock_guard lock(cache().mu);
  return cache().stats;
}

void reset_peak_memory_stats() {
  std::lock_guard lock(cache().mu);
  cache().stats.peak_bytes_in_use = cache().stats.bytes_in_use;
}

void empty_cache() {
  std::lock_guard lock(cache().mu);
  cache().release_locked();
}

}  // namespace tg
