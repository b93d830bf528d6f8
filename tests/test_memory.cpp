// The caching allocator when memory runs out: a refused allocation is an
// OutOfMemoryError that names the op, shape, dtype and bytes, and the process
// trains on afterwards; memory_stats() counts what happened.
#define BOOST_TEST_MODULE memory
#include <sys/resource.h>

#include <fstream>

#include <boost/test/unit_test.hpp>

#include "autograd/autograd.h"
#include "nn/linear.h"
#include "nn/module.h"
#include "tests/testing.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TG_SANITIZED 1
// A request no machine can serve must come back as nullptr, as from the plain
// allocator, not end the process: that is the path under test.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
extern "C" const char* __tsan_default_options() { return "allocator_may_return_null=1"; }
#else
#define TG_SANITIZED 0
#endif

using namespace tg;

namespace {

// The process's address space now, in bytes (/proc/self/statm: pages).
size_t address_space_bytes() {
  std::ifstream f("/proc/self/statm");
  size_t pages = 0;
  f >> pages;
  return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// Caps the address space at `headroom` bytes above what is mapped now, for
// its lifetime (ulimit -v inside the test).
class AddressSpaceLimit {
 public:
  explicit AddressSpaceLimit(size_t headroom) {
    getrlimit(RLIMIT_AS, &saved_);
    rlimit cap = saved_;
    cap.rlim_cur = address_space_bytes() + headroom;
    BOOST_REQUIRE(setrlimit(RLIMIT_AS, &cap) == 0);
  }
  ~AddressSpaceLimit() { setrlimit(RLIMIT_AS, &saved_); }
  AddressSpaceLimit(const AddressSpaceLimit&) = delete;
  AddressSpaceLimit& operator=(const AddressSpaceLimit&) = delete;

 private:
  rlimit saved_{};
};

// x (B, 16) through six Linear(16, 16) + tanh; the loss is the mean.
struct Mlp {
  std::vector<std::shared_ptr<nn::Linear>> layers;
  Mlp() {
    for (int i = 0; i < 6; ++i) layers.push_back(std::make_shared<nn::Linear>(nn::LinearOptions{.in = 16, .out = 16}));
  }
  Tensor loss(const Tensor& x) {
    Tensor h = x;
    for (auto& l : layers) h = tanh((*l)(h));
    return mean(h);
  }
  void sgd_step() {
    NoGradGuard ng;
    for (auto& l : layers)
      for (Tensor p : l->parameters()) {
        p.add_(p.grad(), -0.5);
        p.zero_grad();
      }
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(memory_stats_count_allocations_and_peak) {
  empty_cache();
  reset_peak_memory_stats();
  const MemoryStats before = memory_stats();
  {
    Tensor a = zeros({256, 256});  // 256 KiB
    Tensor b = zeros({256, 256});
    const MemoryStats during = memory_stats();
    BOOST_TEST(during.allocations == before.allocations + 2);
    BOOST_TEST(during.bytes_in_use == before.bytes_in_use + 2 * 256 * 256 * 4);
    BOOST_TEST(during.peak_bytes_in_use == during.bytes_in_use);
  }
  const MemoryStats after = memory_stats();
  BOOST_TEST(after.bytes_in_use == before.bytes_in_use);
  BOOST_TEST(after.bytes_cached == before.bytes_cached + 2 * 256 * 256 * 4);
  BOOST_TEST(after.peak_bytes_in_use == before.bytes_in_use + 2 * 256 * 256 * 4);
  const std::string summary = memory_summary();
  BOOST_TEST(summary.find("in use") != std::string::npos);
  BOOST_TEST(summary.find("out of memory") != std::string::npos);
}

// A request with no cached block of its size class takes the smallest cached
// block up to 1.5 times its size (what a backward frees serves its
// temporaries of other sizes); a smaller request goes to the system.
BOOST_AUTO_TEST_CASE(a_request_takes_a_cached_block_up_to_half_as_large_again) {
  empty_cache();
  { Tensor big = empty({1 << 18}); }  // 1 MiB, now cached
  const MemoryStats before = memory_stats();
  {
    Tensor near = empty({3 << 16});  // 768 KiB: takes the 1 MiB block
    const MemoryStats during = memory_stats();
    BOOST_TEST(during.system_allocs == before.system_allocs);
    BOOST_TEST(during.cache_hits == before.cache_hits + 1);
    BOOST_TEST(during.bytes_in_use == before.bytes_in_use + (1 << 20));  // the block's size, given back whole
  }
  BOOST_TEST(memory_stats().bytes_cached == before.bytes_cached);
  {
    Tensor small = empty({1 << 16});  // 256 KiB: a quarter of the block, from the system
    BOOST_TEST(memory_stats().system_allocs == before.system_allocs + 1);
  }
}

// Attention's node keeps the (B,H,Tq,Tk) probabilities for backward only
// while they take no more memory than q, k, v and the output together: at 16
// keys (head size 8) it holds them, at 256 it holds nothing beyond the
// leaves it saves by reference, and backward rebuilds them; both
// differentiate to the same gradients as the recorded (create_graph) backward.
BOOST_AUTO_TEST_CASE(attention_keeps_its_probabilities_only_while_they_are_small) {
  const int64_t B = 1, H = 2, D = 8;
  for (const int64_t T : {16, 256}) {
    Tensor q = randn({B, H, T, D}).requires_grad_(), k = randn({B, H, T, D}).requires_grad_(),
           v = randn({B, H, T, D}).requires_grad_();
    empty_cache();
    const size_t before = memory_stats().bytes_in_use;
    Tensor out = scaled_dot_product_attention(q, k, v, /*causal=*/true);
    const size_t held = memory_stats().bytes_in_use - before - out.storage()->nbytes;
    const size_t probabilities = B * H * T * T * sizeof(float);
    if (T == 16)
      BOOST_TEST(held >= probabilities);
    else
      BOOST_TEST(held == 0u);
    const Tensor loss = sum(mul(out, out));
    const std::vector<Tensor> plain = grad({loss}, {q, k, v}, {}, {.retain_graph = true});
    const std::vector<Tensor> recorded = grad({loss}, {q, k, v}, {}, {.create_graph = true});
    for (int i = 0; i < 3; ++i)
      BOOST_TEST(testing::max_abs_diff(plain[i], recorded[i]) <= 1e-5, "T " << T << " input " << i);
  }
}

// Slices of one tensor (attention's q, k and v of one projection) send their
// gradients into one buffer of the whole: the first slice's backward makes
// it, the others add into it (OpDef::accumulate), so backward through three
// slices allocates no more than through one, and peaks no higher.
BOOST_AUTO_TEST_CASE(slices_of_one_tensor_accumulate_into_one_gradient_buffer) {
  const int64_t N = 1 << 16;
  Tensor x = rand({3, N}).requires_grad_();
  const Tensor seed = full({N}, 1.0);
  auto backward_through = [&](int64_t slices) {
    x.zero_grad();
    Tensor y = mul(x, 2.0);  // a node: its gradient accumulates in the pass, not in a leaf's .grad
    std::vector<Tensor> rows, seeds;
    for (int64_t i = 0; i < slices; ++i) rows.push_back(select(y, 0, i)), seeds.push_back(seed);
    reset_peak_memory_stats();
    const MemoryStats before = memory_stats();
    backward(rows, seeds);
    const MemoryStats after = memory_stats();
    return std::pair{after.allocations - before.allocations, after.peak_bytes_in_use - before.bytes_in_use};
  };
  backward_through(1);  // x.grad exists from here on, as in the calls measured
  const auto [one_allocs, one_peak] = backward_through(1);
  const auto [three_allocs, three_peak] = backward_through(3);
  BOOST_TEST(three_allocs == one_allocs);
  BOOST_TEST(three_peak == one_peak);
  BOOST_TEST(testing::max_abs_diff(x.grad(), full({3, N}, 2.0)) == 0.0);
  // The general path, which anomaly detection takes, gives the same gradient.
  {
    DetectAnomalyGuard anomaly;
    backward_through(3);
  }
  BOOST_TEST(testing::max_abs_diff(x.grad(), full({3, N}, 2.0)) == 0.0);
}

// 2^50 bytes (1 PiB): refused everywhere, with or without a limit.
BOOST_AUTO_TEST_CASE(impossible_request_is_a_typed_error_naming_op_shape_and_bytes) {
  Tensor keep = zeros({1024});  // something in use, so the message has a figure to give
  { Tensor cached = zeros({4096}); }
  const MemoryStats before = memory_stats();
  try {
    (void)zeros({int64_t{1} << 24, int64_t{1} << 24});
    BOOST_ERROR("no exception thrown");
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    BOOST_TEST_MESSAGE(msg);
    BOOST_TEST(msg.find("(16777216,16777216) float32") != std::string::npos, msg);
    BOOST_TEST(msg.find("1024.0 TiB") != std::string::npos, msg);
    BOOST_TEST(e.bytes == size_t{1} << 50);
    BOOST_TEST(e.bytes_cached == 0u);  // the cache was given back before the retry
    BOOST_TEST(e.bytes_in_use >= keep.numel() * 4u);
  }
  const MemoryStats after = memory_stats();
  BOOST_TEST(after.ooms >= before.ooms + 1);
  BOOST_TEST(after.alloc_retries >= before.alloc_retries + 1);
  BOOST_TEST(after.bytes_in_use == before.bytes_in_use);
  // Caught as a std::bad_alloc too.
  BOOST_CHECK_THROW((void)zeros({int64_t{1} << 24, int64_t{1} << 24}), std::bad_alloc);
}

BOOST_AUTO_TEST_CASE(out_of_memory_names_the_op_that_asked) {
  Tensor a = ones({1 << 20, 1}, DType::f32), b = ones({1, 1 << 20}, DType::f32);  // the product: 4 TiB
  try {
    (void)mul(a, b);
    BOOST_ERROR("no exception thrown");
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    BOOST_TEST(msg.find("'mul' asked for a tensor of shape (1048576,1048576) float32 (4.0 TiB)") != std::string::npos,
               msg);
  }
}

// Under ulimit -v: a batch too large fails part-way through its forward, the
// graph built so far is freed, and a smaller batch then trains.
BOOST_AUTO_TEST_CASE(after_out_of_memory_a_smaller_batch_trains) {
  if (TG_SANITIZED) {
    BOOST_TEST_MESSAGE("skipped under the sanitizers: their shadow memory does not fit under RLIMIT_AS");
    return;
  }
  // Two kernel threads, so that the large batch's GEMMs and elementwise
  // kernels run on the pool under the limit too: a failure there must reach
  // this thread, not leave it waiting for a worker.
  const int threads = num_threads();
  set_num_threads(2);
  manual_seed(3);
  Mlp model;
  const Tensor small = randn({256, 16});
  const double loss0 = model.loss(small).item();
  {
    // OpenBLAS retries forever when it cannot map a thread's 128 MiB GEMM
    // buffer, so both threads map theirs before the limit: a 65536-row batch
    // runs every GEMM on both at once.
    model.loss(randn({1 << 16, 16})).backward();
    for (auto& l : model.layers)
      for (Tensor p : l->parameters()) p.zero_grad();
  }
  empty_cache();
  const int64_t nodes = live_nodes();
  const size_t in_use = memory_stats().bytes_in_use;
  bool failed = false;
  {
    // Each activation of the large batch is 64 MiB; 320 MiB of headroom fit a
    // few of the twelve the forward holds, not all.
    AddressSpaceLimit limit(size_t{320} << 20);
    try {
      Tensor loss = model.loss(randn({1 << 20, 16}));
      loss.backward();
    } catch (const OutOfMemoryError& e) {
      failed = true;
      BOOST_TEST_MESSAGE(e.what());
      BOOST_TEST(e.bytes == size_t{64} << 20);
      BOOST_TEST(std::string(e.what()).find("(1048576,16) float32") != std::string::npos, e.what());
    }
    BOOST_TEST(failed);
    BOOST_TEST(live_nodes() == nodes);  // the graph that was being built is gone
    BOOST_TEST(memory_stats().bytes_in_use == in_use);
    // Still under the limit: a small batch trains.
    for (int step = 0; step < 20; ++step) {
      Tensor loss = model.loss(small);
      loss.backward();
      model.sgd_step();
    }
  }
  BOOST_TEST(model.loss(small).item() < loss0);
  set_num_threads(threads);
}
