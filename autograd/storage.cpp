#include "autograd/storage.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include <fmt/format.h>
#include <sys/mman.h>

#include "autograd/dtype.h"
#include "autograd/error.h"
#include "autograd/fault.h"
#include "autograd/profiler.h"
#include "autograd/shape.h"

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

// A request takes a cached block of its own size class or, failing that, the
// smallest one at most this much larger, before asking the system: the
// blocks a backward frees (activations) then serve its temporaries of other
// sizes (bfloat16 copies, gradients), and the cache holds fewer blocks that
// only one size can use. Measured on the four lm_train workloads (Zen 4,
// peak RSS): 1.5 to 1.75 held the least in float32 and in bfloat16; 2 let
// small requests take the blocks that larger ones then had to allocate again
// (LSTM float32: +4 MiB).
constexpr double kMaxOversize = 1.5;

// Blocks of at least this size are mapped from the system directly, not
// taken from malloc: glibc serves large requests from its heap once a large
// block has been freed (its mmap threshold follows the largest freed), and
// the cache's blocks then sit between whatever else lives there, so that the
// heap keeps pages no block uses (the LSTM LM in bfloat16 at 2 threads,
// five runs, the cache's 32 MiB the same: peak RSS 67.7-72.4 MiB from
// malloc, 67.6-67.8 mapped).
// Under the sanitizers every block comes from malloc, whose bounds ASan checks.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kMapped = SIZE_MAX;
#else
constexpr size_t kMapped = size_t{256} << 10;
#endif

void* system_alloc(size_t bytes) {
  if (bytes < kMapped) return std::aligned_alloc(64, bytes);
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}
void system_free(void* p, size_t bytes) {
  if (bytes < kMapped)
    std::free(p);
  else
    munmap(p, bytes);
}

struct Cache {
  std::mutex mu;
  std::map<size_t, std::vector<void*>> free_blocks;  // by block size
  MemoryStats stats;

  // A block of at least `bytes` (its size in `bytes` on return), or nullptr
  // when the system refuses it even after the cache was given back (the
  // counters then say so: the caller throws). `refuse`: an injected failure
  // (autograd/fault.h), counted as a real one.
  void* get(size_t& bytes, bool refuse) {
    std::lock_guard lock(mu);
    if (refuse) {
      ++stats.ooms;
      return nullptr;
    }
    auto fits = [&](auto i) { return i != free_blocks.end() && i->first <= kMaxOversize * static_cast<double>(bytes); };
    auto it = free_blocks.lower_bound(bytes);
    while (fits(it) && it->second.empty()) ++it;
    void* p = nullptr;
    if (fits(it)) {
      bytes = it->first;
      p = it->second.back();
      it->second.pop_back();
      ++stats.cache_hits;
      stats.bytes_cached -= bytes;
    } else {
      p = system_alloc(bytes);
      if (!p) {
        // Give the cache back to the system and try once more before failing.
        ++stats.alloc_retries;
        release_locked();
        p = system_alloc(bytes);
      }
      if (!p) {
        ++stats.ooms;
        return nullptr;
      }
      ++stats.system_allocs;
    }
    ++stats.allocations;
    stats.bytes_in_use += bytes;
    stats.peak_bytes_in_use = std::max(stats.peak_bytes_in_use, stats.bytes_in_use);
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
      for (void* p : blocks) system_free(p, size);
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

// "1.5 GiB": bytes as a reader sizes them.
std::string format_bytes(size_t bytes) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{} bytes", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace

Storage::~Storage() {
  if (owned && data) cache().put(data, nbytes);
}

std::shared_ptr<Storage> new_storage(size_t nbytes, const Shape& shape, DType dtype) {
  auto s = std::make_shared<Storage>();
  size_t bytes = round_size(std::max<size_t>(nbytes, 1));
  s->data = cache().get(bytes, detail::allocation_fails());
  if (!s->data) {
    const MemoryStats now = memory_stats();
    const std::string op = current_op_name();
    throw OutOfMemoryError(
        fmt::format("out of memory: {} asked for a tensor of shape {} {} ({}); the allocator holds {} in use and "
                    "{} cached (its cache was given back and the allocation retried)",
                    op.empty() ? "an allocation outside any op" : op, shape, dtype_name(dtype), format_bytes(bytes),
                    format_bytes(now.bytes_in_use), format_bytes(now.bytes_cached)),
        bytes, now.bytes_in_use, now.bytes_cached);
  }
  s->nbytes = bytes;
  return s;
}

MemoryStats memory_stats() {
  std::lock_guard lock(cache().mu);
  return cache().stats;
}

void reset_peak_memory_stats() {
  std::lock_guard lock(cache().mu);
  cache().stats.peak_bytes_in_use = cache().stats.bytes_in_use;
}

std::string memory_summary() {
  const MemoryStats m = memory_stats();
  return fmt::format(
      "tensor memory: {} in use, {} cached, peak {} in use\n"
      "allocations: {} ({} from the cache, {} from the system; {} retried after emptying the cache, {} out of "
      "memory)\n",
      format_bytes(m.bytes_in_use), format_bytes(m.bytes_cached), format_bytes(m.peak_bytes_in_use), m.allocations,
      m.cache_hits, m.system_allocs, m.alloc_retries, m.ooms);
}

void empty_cache() {
  std::lock_guard lock(cache().mu);
  cache().release_locked();
}

}  // namespace tg
