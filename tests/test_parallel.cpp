// parallel_for on the library's thread pool: every index exactly once, at
// any thread count, nested, from several threads at once, and exceptions
// reach the caller.
#define BOOST_TEST_MODULE parallel
#include <boost/test/unit_test.hpp>

#include <atomic>
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
  set_num_threads(2);
  for (int64_t throwing_index : {0, 9999}) {
    BOOST_CHECK_THROW(parallel_for(10000, 100,
                                   [&](int64_t b, int64_t e) {
                                     if (b <= throwing_index && throwing_index < e) throw std::runtime_error("chunk");
                                   }),
                      std::runtime_error);
    // The pool still works afterwards.
    for (int c : visits(10000, 100)) BOOST_REQUIRE(c == 1);
  }
}

BOOST_AUTO_TEST_CASE(rejects_zero_threads) { BOOST_CHECK_THROW(set_num_threads(0), std::exception); }
