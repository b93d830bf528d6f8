#include "autograd/parallel.h"

#include <atomic>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "autograd/autocast.h"
#include "autograd/blas.h"
#include "autograd/error.h"

namespace tg {
namespace {

int initial_threads() {
  if (const char* e = std::getenv("TAPEGRAD_NUM_THREADS")) {
    int n = std::atoi(e);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

int& threads() {
  static int n = [] {
    blas_set_num_threads(1);  // gemm() splits GEMMs over the pool (blas.h)
    return initial_threads();
  }();
  return n;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// How long an idle worker (or the caller waiting for the workers) spins
// before sleeping: a few microseconds, enough to catch the next kernel of the
// same op without taking a core from OpenBLAS for long.
constexpr int kSpins = 2000;

thread_local bool in_pool_thread = false;

// Workers 1..W run chunk (index) of each job; the caller runs chunk 0. A job
// is published by bumping `generation`; every worker acknowledges every job
// (running its chunk or not), so the fields of one job are never read while
// the next is being written.
class Pool {
 public:
  bool run(int64_t chunks, void (*body)(void*, int64_t), void* ctx) {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || in_pool_thread) return false;
    resize(static_cast<int>(chunks) - 1);
    jobs_.fetch_add(1, std::memory_order_relaxed);
    body_ = body, ctx_ = ctx, chunks_ = chunks, error_ = nullptr;
    autocast_ = autocast_dtype();  // the workers' GEMMs compute in the caller's precision
    pending_.store(workers_, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    in_pool_thread = true;
    try {
      body(ctx, 0);
    } catch (...) {
      record(std::current_exception());
    }
    in_pool_thread = false;
    for (int i = 0; i < kSpins && pending_.load(std::memory_order_acquire) > 0; ++i) cpu_relax();
    for (int64_t p; (p = pending_.load(std::memory_order_acquire)) > 0;) pending_.wait(p, std::memory_order_acquire);
    if (error_) std::rethrow_exception(error_);
    return true;
  }

  int64_t jobs() const { return jobs_.load(std::memory_order_relaxed); }

 private:
  // Keeps at least `n` workers (never fewer than a job needs); they live until exit.
  void resize(int n) {
    for (; workers_ < n; ++workers_) {
      const uint64_t seen = generation_.load(std::memory_order_relaxed);
      std::thread([this, index = workers_ + 1, seen] { work(index, seen); }).detach();
    }
  }

  void work(int64_t index, uint64_t seen) {
    in_pool_thread = true;
    for (;;) {
      for (int i = 0; i < kSpins && generation_.load(std::memory_order_acquire) == seen; ++i) cpu_relax();
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (index < chunks_) {
        const DType precision = detail::exchange_autocast_dtype(autocast_);
        try {
          body_(ctx_, index);
        } catch (...) {
          record(std::current_exception());
        }
        detail::exchange_autocast_dtype(precision);
      }
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  void record(std::exception_ptr e) {
    std::lock_guard g(error_mutex_);
    if (!error_) error_ = e;
  }

  std::mutex mutex_;  // one job at a time
  std::atomic<int64_t> jobs_{0};  // run so far
  int workers_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int64_t> pending_{0};
  void (*body_)(void*, int64_t) = nullptr;
  void* ctx_ = nullptr;
  int64_t chunks_ = 0;
  DType autocast_ = DType::f32;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// The barrier between the steps of one run_steps job. A step is tens of
// microseconds and its parts are balanced, so a part that arrives first spins
// (as idle workers do) and sleeps only when another part lost its core.
// Each part says whether its step failed; every part learns whether any did,
// so that all stop after the same step. The last to arrive decides: `stop_`
// changes only when every part has arrived again, so each part has read it.
class StepBarrier {
 public:
  explicit StepBarrier(int64_t parts) : parts_(parts) {}

  bool arrive_and_wait(bool failed) {
    if (failed) failed_.store(true, std::memory_order_relaxed);
    const uint32_t phase = phase_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts_) {
      stop_.store(failed_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      failed_.store(false, std::memory_order_relaxed);
      arrived_.store(0, std::memory_order_relaxed);  // before the release below: the next step sees 0
      phase_.store(phase + 1, std::memory_order_release);
      phase_.notify_all();
      return stop_.load(std::memory_order_relaxed);
    }
    for (int i = 0; i < kSpins && phase_.load(std::memory_order_acquire) == phase; ++i) cpu_relax();
    while (phase_.load(std::memory_order_acquire) == phase) phase_.wait(phase, std::memory_order_acquire);
    return stop_.load(std::memory_order_relaxed);
  }

 private:
  const int64_t parts_;
  std::atomic<int64_t> arrived_{0};
  std::atomic<uint32_t> phase_{0};
  std::atomic<bool> failed_{false}, stop_{false};
};

// Never destroyed: its detached workers sleep until the process exits.
Pool& pool() {
  static Pool* p = new Pool;
  return *p;
}

}  // namespace

namespace detail {
bool run_chunks(int64_t chunks, void (*body)(void*, int64_t), void* ctx) { return pool().run(chunks, body, ctx); }
int64_t pool_jobs() { return pool().jobs(); }

bool run_steps(int64_t parts, int64_t steps, void (*body)(void*, int64_t, int64_t), void* ctx) {
  // run_chunks gives every chunk a thread of its own (chunk c on worker c),
  // all running at once, so no part waits at the barrier for a part queued
  // behind it. A part that throws still meets the others at this step's
  // barrier (they would wait there for it forever), which tells every part
  // to stop; run_chunks rethrows the exception.
  StepBarrier barrier(parts);
  auto part = [&](int64_t p) {
    std::exception_ptr error;
    for (int64_t s = 0; s < steps; ++s) {
      try {
        body(ctx, p, s);
      } catch (...) {
        error = std::current_exception();
      }
      if (barrier.arrive_and_wait(error != nullptr)) break;
    }
    if (error) std::rethrow_exception(error);
  };
  return run_chunks(parts, [](void* c, int64_t p) { (*static_cast<decltype(part)*>(c))(p); }, &part);
}
}  // namespace detail

void set_num_threads(int n) {
  if (n < 1) throw ValueError(fmt::format("set_num_threads: need at least 1 thread, got {}", n));
  threads() = n;
}

int num_threads() { return threads(); }

}  // namespace tg
