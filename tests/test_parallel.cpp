// parallel_for on the library's thread pool: every index exactly once, at
// any thread count, nested, from several threads at once, and exceptions
// reach the caller. parallel_steps: every (part, step) once, each step whole
// before the next, on the pool or inline, and exceptions reach the caller.
#define BOOST_TEST_MODULE parallel
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "autograd/parallel.h"

using namespace tg;

namespace {

// Runs parallel_for over n items and returns how often each index was visited.
std::vector<int> visits(int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> seen(n);
  parallel_for(n, grain, [&](int64_t b, int64_t e) {
    if (!(0 <= b && b < e && e <= n)) throw std::logic_error("chunk out of range");  // no Boost asserts off the main thread
    for (int64_t i = b; i < e; ++i) seen[i].fetch_add(1);
  });
  std::vector<int> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = seen[i].load();
  return out;
}

// Runs parallel_steps and returns how often each (part, step) ran, with
// `early` set when a part began a step before every part had finished the
// one before, and `threads` the distinct threads that ran parts.
struct StepsRun {
  std::vector<int> calls;
  bool early = false;
  size_t threads = 0;
};
StepsRun run_steps(int64_t parts, int64_t steps) {
  std::vector<std::atomic<int>> calls(parts * steps);
  std::vector<std::thread::id> ids(parts);
  std::atomic<int64_t> finished{0};
  std::atomic<bool> early{false};
  parallel_steps(parts, steps, [&](int64_t p, int64_t s) {
    if (finished.load() < parts * s) early = true;
    ids[p] = std::this_thread::get_id();  // each part writes only its own entry
    calls[p * steps + s].fetch_add(1);
    finished.fetch_add(1);
  });
  StepsRun out;
  for (auto& c : calls) out.calls.push_back(c.load());
  out.early = early.load();
  out.threads = std::set<std::thread::id>(ids.begin(), ids.end()).size();
  return out;
}

struct Threads {
  int saved = num_threads();
  ~Threads() { set_num_threads(saved); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(covers_every_index_once_at_any_thread_count) {
  Threads restore;
  for (int t : {1, 2, 3, 5, 8}) {
    set_num_threads(t);
    for (int64_t n : {0, 1, 7, 100, 1001, 100000}) {
      std::vector<int> v = visits(n, 10);
      for (int64_t i = 0; i < n; ++i) BOOST_REQUIRE_MESSAGE(v[i] == 1, "threads " << t << " n " << n << " index " << i);
    }
  }
}

BOOST_AUTO_TEST_CASE(splits_work_across_threads) {
  Threads restore;
  set_num_threads(4);
  std::atomic<int> chunks{0};
  std::vector<std::thread::id> ids(4);
  parallel_for(4000, 10, [&](int64_t b, int64_t) { ids[chunks++] = std::this_thread::get_id(); (void)b; });
  BOOST_TEST(chunks.load() == 4);
  BOOST_TEST((ids[0] != ids[1] || ids[1] != ids[2] || ids[2] != ids[3]));
}

BOOST_AUTO_TEST_CASE(nested_calls_run_inline) {
  Threads restore;
  set_num_threads(3);
  std::atomic<int64_t> total{0};
  parallel_for(300, 10, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) parallel_for(50, 5, [&](int64_t b2, int64_t e2) { total += e2 - b2; });
  });
  BOOST_TEST(total.load() == 300 * 50);
}

BOOST_AUTO_TEST_CASE(concurrent_callers_each_get_every_index) {
  Threads restore;
  set_num_threads(2);
  std::vector<std::thread> callers;
  std::atomic<int> bad{0};
  for (int k = 0; k < 4; ++k)
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep)
        for (int c : visits(5000, 100)) bad += c != 1;
    });
  for (auto& t : callers) t.join();
  BOOST_TEST(bad.load() == 0);
}

BOOST_AUTO_TEST_CASE(an_exception_in_any_chunk_reaches_the_caller) {
  Threads restore;
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    // An index in each chunk (the caller's is the first), and in all at once.
    for (int64_t throwing_index : {int64_t{0}, int64_t{2600}, int64_t{5100}, int64_t{7600}, int64_t{9999}, int64_t{-1}}) {
      BOOST_CHECK_THROW(parallel_for(10000, 100,
                                     [&](int64_t b, int64_t e) {
                                       if (throwing_index < 0 || (b <= throwing_index && throwing_index < e))
                                         throw std::runtime_error("chunk");
                                     }),
                        std::runtime_error);
      // The pool still works afterwards.
      for (int c : visits(10000, 100)) BOOST_REQUIRE(c == 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(parallel_steps_finishes_each_step_before_the_next) {
  for (int64_t parts : {1, 2, 3, 4}) {
    const StepsRun r = run_steps(parts, 500);
    BOOST_TEST((r.calls == std::vector<int>(parts * 500, 1)), parts << " parts");
    BOOST_TEST(!r.early, parts << " parts: a step began before the one before it ended");
    BOOST_TEST(r.threads == static_cast<size_t>(parts), parts << " parts ran on " << r.threads << " threads");
  }
}

// From a pool thread (the pool is busy) the parts run one after another on
// that thread, step by step, with the same calls.
BOOST_AUTO_TEST_CASE(parallel_steps_runs_inline_inside_the_pool) {
  Threads restore;
  set_num_threads(2);
  std::vector<StepsRun> inner(2);
  parallel_for(2, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) inner[i] = run_steps(3, 50);
  });
  for (const StepsRun& r : inner) {
    BOOST_TEST((r.calls == std::vector<int>(150, 1)));
    BOOST_TEST(!r.early);
    BOOST_TEST(r.threads == 1u);
  }
}

// A throw in any part at any step: the caller gets it, no part starts a later
// step, and the pool works afterwards. At 2 and 4 kernel threads, on the pool
// and inline inside it.
BOOST_AUTO_TEST_CASE(parallel_steps_passes_an_exception_in_any_part_to_the_caller) {
  Threads restore;
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    for (int64_t parts : {2, 3, 4})
      for (int64_t bad_part = 0; bad_part < parts; ++bad_part)
        for (int64_t bad_step : {int64_t{0}, int64_t{7}, int64_t{49}}) {
          std::vector<std::atomic<int>> calls(parts * 50);
          auto f = [&](int64_t p, int64_t s) {
            calls[p * 50 + s].fetch_add(1);
            if (p == bad_part && s == bad_step) throw std::runtime_error("part");
          };
          BOOST_CHECK_THROW(parallel_steps(parts, 50, f), std::runtime_error);
          int later = 0;
          for (int64_t p = 0; p < parts; ++p)
            for (int64_t s = bad_step + 1; s < 50; ++s) later += calls[p * 50 + s].load();
          BOOST_TEST(later == 0, parts << " parts, throw at part " << bad_part << " step " << bad_step);
          const StepsRun r = run_steps(parts, 20);
          BOOST_TEST((r.calls == std::vector<int>(parts * 20, 1)));
        }
    // Inline, from inside the pool.
    std::atomic<int> caught{0};
    parallel_for(2, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) try {
          parallel_steps(3, 10, [&](int64_t p, int64_t s) {
            if (p == 1 && s == 4) throw std::runtime_error("inline part");
          });
        } catch (const std::runtime_error&) {
          caught.fetch_add(1);
        }
    });
    BOOST_TEST(caught.load() == 2);
    for (int c : visits(10000, 100)) BOOST_REQUIRE(c == 1);
  }
}

BOOST_AUTO_TEST_CASE(rejects_zero_threads) { BOOST_CHECK_THROW(set_num_threads(0), std::exception); }
