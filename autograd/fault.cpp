#include "autograd/fault.h"

#include <array>
#include <atomic>
#include <new>

#include <fmt/format.h>

#include "autograd/error.h"
#include "autograd/profiler.h"
#include "autograd/storage.h"

namespace tg::detail {
namespace {

// The allocation switch. `armed` is the only field read when it is off.
struct AllocationSwitch {
  std::atomic<bool> armed{false};
  std::atomic<int64_t> count{0}, fail_at{-1};
  std::atomic<bool> fired{false};
};
AllocationSwitch& alloc_switch() {
  static AllocationSwitch* s = new AllocationSwitch;  // never destroyed: allocations may run during static destruction
  return *s;
}

struct IoSwitch {
  std::atomic<bool> armed{false};
  std::array<std::atomic<int64_t>, std::size(kIoCalls)> count{};
  IoCall call = IoCall::open;
  int64_t nth = -1;
  int error = 0;
  std::atomic<bool> fired{false};
};
IoSwitch& io_switch() {
  static IoSwitch s;
  return s;
}

}  // namespace

AllocationFaults::AllocationFaults(int64_t fail_at) {
  AllocationSwitch& s = alloc_switch();
  if (s.armed.load()) throw AutogradError("AllocationFaults: another allocation fault switch is on");
  s.count = 0;
  s.fail_at = fail_at;
  s.fired = false;
  s.armed = true;
}
AllocationFaults::~AllocationFaults() { alloc_switch().armed = false; }
int64_t AllocationFaults::count() const { return alloc_switch().count.load(); }
bool AllocationFaults::fired() const { return alloc_switch().fired.load(); }

bool allocation_fails() {
  AllocationSwitch& s = alloc_switch();
  if (!s.armed.load(std::memory_order_relaxed)) return false;
  if (s.count.fetch_add(1) != s.fail_at.load()) return false;
  s.fired = true;
  return true;
}

void throw_scratch_oom(size_t bytes) {
  const MemoryStats now = memory_stats();
  const std::string op = current_op_name();
  throw OutOfMemoryError(fmt::format("out of memory: {} asked for {} bytes of GEMM scratch", op.empty() ? "a GEMM outside any op" : op, bytes),
                         bytes, now.bytes_in_use, now.bytes_cached);
}

std::string_view io_call_name(IoCall call) {
  switch (call) {
    case IoCall::open: return "open";
    case IoCall::write: return "write";
    case IoCall::fsync: return "fsync";
    case IoCall::close: return "close";
    case IoCall::rename: return "rename";
  }
  return "?";
}

IoFaults::IoFaults(IoCall call, int64_t nth, int error) {
  IoSwitch& s = io_switch();
  if (s.armed.load()) throw AutogradError("IoFaults: another I/O fault switch is on");
  for (auto& c : s.count) c = 0;
  s.call = call, s.nth = nth, s.error = error;
  s.fired = false;
  s.armed = true;
}
IoFaults::~IoFaults() { io_switch().armed = false; }
int64_t IoFaults::count(IoCall call) const { return io_switch().count[static_cast<size_t>(call)].load(); }
bool IoFaults::fired() const { return io_switch().fired.load(); }

int io_fault(IoCall call) {
  IoSwitch& s = io_switch();
  if (!s.armed.load(std::memory_order_relaxed)) return 0;
  const int64_t k = s.count[static_cast<size_t>(call)].fetch_add(1);
  if (call != s.call || k != s.nth) return 0;
  s.fired = true;
  return s.error;
}

}  // namespace tg::detail
