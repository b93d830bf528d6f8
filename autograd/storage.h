#pragma once
/// \file
/// Storage: one reference-counted buffer shared by a tensor and its views.
/// Buffers come from a caching allocator so a steady-state training step reuses
/// the memory of the previous step instead of calling malloc/free per op.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tg {

/// A tensor's memory, shared by its views.
struct Storage {
  void* data = nullptr;  ///< the buffer
  size_t nbytes = 0;     ///< its size
  /// Bumped by every in-place write; a node that saved a tensor remembers the
  /// version it saw, and backward refuses to use it if the version moved on.
  uint64_t version = 0;
  bool owned = true;  ///< false for memory we do not free (external buffers)

  Storage() = default;
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  ~Storage();
};

class Shape;
enum class DType : uint8_t;

/// Uninitialised storage of nbytes (64-byte aligned) for a tensor of `shape`
/// and `dtype`. When the system refuses it even after the cache was given
/// back: OutOfMemoryError naming the op being run (the innermost
/// ProfileScope), the shape, the dtype and the bytes.
std::shared_ptr<Storage> new_storage(size_t nbytes, const Shape& shape, DType dtype);

/// Counters of the caching allocator (memory_stats()), as
/// torch.cuda.memory_stats reports them for its allocator.
struct MemoryStats {
  uint64_t allocations = 0;    ///< requests served
  uint64_t cache_hits = 0;     ///< served from the cache, no malloc
  uint64_t system_allocs = 0;  ///< real allocations (aligned_alloc)
  uint64_t alloc_retries = 0;  ///< system allocations that failed once and were retried after empty_cache
  uint64_t ooms = 0;           ///< OutOfMemoryErrors thrown
  size_t bytes_in_use = 0;     ///< held by live storages
  size_t bytes_cached = 0;     ///< freed blocks kept for reuse
  size_t peak_bytes_in_use = 0;  ///< the most bytes_in_use since the start or reset_peak_memory_stats()
};
/// The allocator's counters now.
MemoryStats memory_stats();
/// memory_stats() as a few readable lines (torch.cuda.memory_summary).
std::string memory_summary();
/// Restarts peak_bytes_in_use from the bytes in use now (to measure one phase).
void reset_peak_memory_stats();
/// Frees every cached (unused) block back to the system.
void empty_cache();

}  // namespace tg
