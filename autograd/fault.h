#pragma once
// Fault injection, for tests: makes one chosen allocation, or one chosen I/O
// call of the library's file writer, fail as if the system had refused it, so a
// test can try every failure a step or a save can meet, one at a time (as
// SQLite's tests do) and check what each leaves behind.
//
// One switch of each kind may be on at a time (a second is an AutogradError).
// Off, each hook costs one relaxed atomic load.
#include <cstdint>
#include <new>
#include <string_view>
#include <vector>

namespace tg::detail {

// While it lives: counts the library's allocations (every request to the
// caching allocator, and every growth of a GEMM backend's scratch buffer)
// and makes the one numbered `fail_at` fail (0-based; -1: count only). The
// failing one raises OutOfMemoryError, as a refusal by the system would.
class AllocationFaults {
 public:
  explicit AllocationFaults(int64_t fail_at = -1);
  ~AllocationFaults();
  AllocationFaults(const AllocationFaults&) = delete;
  AllocationFaults& operator=(const AllocationFaults&) = delete;
  int64_t count() const;  // allocations so far
  bool fired() const;     // whether the chosen one has failed
};

// Called at each allocation: true when this one must fail.
bool allocation_fails();

// `v` resized to n elements, as the GEMM backends keep their per-thread
// scratch. A refusal (real or injected) raises OutOfMemoryError naming the op
// and the bytes, not a bare std::bad_alloc.
template <class T>
void grow_scratch(std::vector<T>& v, size_t n);
[[noreturn]] void throw_scratch_oom(size_t bytes);

// The I/O calls of the file writer (autograd/atomic_file.h: checkpoints, word2vec
// vectors, the GEMM cache).
enum class IoCall : uint8_t { open, write, fsync, close, rename };
inline constexpr IoCall kIoCalls[] = {IoCall::open, IoCall::write, IoCall::fsync, IoCall::close, IoCall::rename};
std::string_view io_call_name(IoCall call);

// While it lives: counts the writer's I/O calls of each kind and makes the
// `nth` (0-based) call of kind `call` fail with errno `error` (nth = -1:
// count only). A failed open, write, fsync or rename does not happen; a
// failed close still releases the descriptor (as close(2) does on error).
class IoFaults {
 public:
  IoFaults() : IoFaults(IoCall::open, -1, 0) {}
  IoFaults(IoCall call, int64_t nth, int error);
  ~IoFaults();
  IoFaults(const IoFaults&) = delete;
  IoFaults& operator=(const IoFaults&) = delete;
  int64_t count(IoCall call) const;  // calls of that kind so far
  bool fired() const;
};

// Called before each I/O call of the writer: the errno to fail it with, or 0.
int io_fault(IoCall call);

template <class T>
void grow_scratch(std::vector<T>& v, size_t n) {
  if (v.size() >= n) return;
  if (allocation_fails()) throw_scratch_oom(n * sizeof(T));
  try {
    v.resize(n);
  } catch (const std::bad_alloc&) {
    throw_scratch_oom(n * sizeof(T));
  }
}

}  // namespace tg::detail
