#include "autograd/onednn.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <dnnl.hpp>
#include <sys/mman.h>
#include <fmt/format.h>

#include "autograd/error.h"
#include "autograd/fault.h"

// oneDNN (Debian's build) threads with OpenMP. The library splits GEMMs over
// its own pool, so every thread that calls oneDNN sets its OpenMP team to one
// thread: declared here rather than through <omp.h>, which would need
// -fopenmp for the whole build.
extern "C" void omp_set_num_threads(int);

namespace tg::detail {
namespace {

// A primitive is fixed to its shapes, strides and scalars; making one costs
// ~100 us (far more than running a small GEMM), so they are kept by all of
// these. A training step meets a few dozen shapes; generation with a growing
// KV cache meets new ones at every token, so the caches start over past
// kMaxKept entries rather than grow without bound.
constexpr size_t kMaxKept = 1024;
struct Key {
  bool bf16, ta, tb, packed_b, bias;
  int64_t M, N, K, lda, ldb, ldc;
  uint32_t alpha, beta;  // bits
  bool operator==(const Key&) const = default;
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = k.bf16 | k.ta << 1 | k.tb << 2 | k.packed_b << 3 | k.bias << 4;
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc, int64_t{k.alpha} << 32 | k.beta})
      h = h * 0x9e3779b97f4a7c15ull + static_cast<size_t>(v);
    return h;
  }
};
struct Primitive {
  dnnl::matmul matmul;
  dnnl::memory::desc a, b, c, bias, scratch;  // bias (1, N), where the key has one
  std::string kernel;  // oneDNN's name for the implementation it chose
  // With packed_b: b is oneDNN's layout for B, b_plain B as the caller
  // stores it, pack the reorder between them (its scratchpad the thread's too).
  dnnl::memory::desc b_plain, pack_scratch;
  dnnl::reorder pack;
};

dnnl::engine& engine() {
  static dnnl::engine* e = new dnnl::engine(dnnl::engine::kind::cpu, 0);
  return *e;
}

// B packed in a packed_b primitive's layout, a copy each thread keeps with
// the primitive (ThreadState::Bound), for the B it last packed, packed again
// in place when B or its values change, at every optimizer step. The threads
// of a recurrence split by units each multiply by their own rows of W_hh, of
// one shape: sharing one copy a primitive, they took turns on it and repacked
// it at every step (the LSTM LM at batch 8, by units at 2 threads, trained at
// 25.6k tokens/s against 107k so, a third of its one-thread speed); by rows
// they all read W_hh, a copy each (0.5 MiB for the LSTM LM's), which also
// keeps the count of allocations a step the same whichever thread gets to a
// step first. Mapped from the system, outside malloc's heap and the tensors'
// allocator: from malloc, the LSTM LM's bfloat16 peak RSS at 2 threads was
// 71.5-74.6 MiB against 67.4-68.0 (five runs each).
struct PackedBuffer {
  explicit PackedBuffer(size_t n) : bytes(n) {
    if (allocation_fails()) throw_scratch_oom(n);
    data = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (data == MAP_FAILED) throw_scratch_oom(n);
    total.fetch_add(n, std::memory_order_relaxed);
  }
  ~PackedBuffer() {
    munmap(data, bytes);
    total.fetch_sub(bytes, std::memory_order_relaxed);
  }
  PackedBuffer(const PackedBuffer&) = delete;
  PackedBuffer& operator=(const PackedBuffer&) = delete;
  void* data;
  size_t bytes;
  static inline std::atomic<size_t> total{0};  // bytes of every thread's copies, for onednn_packed_bytes()
};

struct Cache {
  std::mutex mutex;
  std::unordered_map<Key, std::shared_ptr<const Primitive>, KeyHash> primitives;
  std::string kernel[2];  // impl_info_str of the last f32 / bf16 primitive made
};
std::atomic<uint64_t> packs{0};  // Bs packed, for onednn_packs()

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: GEMMs may run during static destruction
  return *c;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::shared_ptr<const Primitive> make(const Key& k) {
  using dt = dnnl::memory::data_type;
  const dt in = k.bf16 ? dt::bf16 : dt::f32;
  // Row-major (rows, cols) with leading dimension ld; a transposed operand is
  // the same dims with the strides swapped.
  auto desc = [](int64_t rows, int64_t cols, int64_t ld, bool trans, dt type) {
    return dnnl::memory::desc({rows, cols}, type, trans ? dnnl::memory::dims{1, ld} : dnnl::memory::dims{ld, 1});
  };
  auto p = std::make_shared<Primitive>();
  p->a = desc(k.M, k.K, k.lda, k.ta, in);
  p->b = p->b_plain = desc(k.K, k.N, k.ldb, k.tb, in);
  p->c = desc(k.M, k.N, k.ldc, false, dt::f32);
  const dnnl::memory::desc b_any({k.K, k.N}, in, dnnl::memory::format_tag::any);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // per thread, below: a primitive runs on many at once
  if (k.alpha != 0x3f800000u) attr.set_output_scales(0, {from_bits(k.alpha)});
  if (k.beta != 0) {
    dnnl::post_ops ops;
    ops.append_sum(from_bits(k.beta));
    attr.set_post_ops(ops);
  }
  const dnnl::memory::desc& b = k.packed_b ? b_any : p->b;
  if (k.bias) p->bias = dnnl::memory::desc({1, k.N}, dt::f32, dnnl::memory::dims{k.N, 1});
  auto pd = dnnl::matmul::primitive_desc(
      k.bias ? dnnl::matmul::desc(p->a, b, p->bias, p->c) : dnnl::matmul::desc(p->a, b, p->c), attr, engine());
  p->scratch = pd.scratchpad_desc();
  p->matmul = dnnl::matmul(pd);
  p->kernel = pd.impl_info_str();
  if (k.packed_b) {
    p->b = pd.weights_desc();
    dnnl::primitive_attr pack_attr;
    pack_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    auto pack_pd = dnnl::reorder::primitive_desc(engine(), p->b_plain, engine(), p->b, pack_attr);
    p->pack_scratch = pack_pd.scratchpad_desc();
    p->pack = dnnl::reorder(pack_pd);
  }
  return p;
}

std::shared_ptr<const Primitive> primitive(const Key& k) {
  Cache& c = cache();
  // Made under the lock. oneDNN shares what it builds between threads through
  // a cache of its own, synchronised inside a library ThreadSanitizer cannot
  // see into; made one at a time here, the sharing is ordered by this mutex.
  // A primitive is made once per shape and thread, so no GEMM waits long.
  std::lock_guard lock(c.mutex);
  if (auto it = c.primitives.find(k); it != c.primitives.end()) return it->second;
  auto p = make(k);
  c.kernel[k.bf16] = p->kernel;
  if (c.primitives.size() >= kMaxKept) c.primitives.clear();  // the threads' Bound entries keep theirs alive
  return c.primitives.emplace(k, std::move(p)).first->second;
}

// What one calling thread keeps: its stream, its scratchpad, and for each
// primitive it ran, the primitive and its memory objects, so that a call
// takes no lock and makes no object (a per-step GEMM of a recurrence is
// ~20 us; the shared cache's lock and four memory objects cost ~2 of them).
struct ThreadState {
  struct Bound {
    std::shared_ptr<const Primitive> p;
    dnnl::memory a, b, c, s, bias;
    // A packed_b primitive's: what p->pack reads and its scratchpad, the B
    // (address and generation) of its last call, and this thread's copy of B
    // packed, with the B and generation it holds (0: none). The copy goes
    // with the thread.
    dnnl::memory b_plain, pack_s;
    const void* last_b = nullptr;
    uint64_t last_generation = 0;
    std::unique_ptr<PackedBuffer> packed;
    const void* packed_b = nullptr;
    uint64_t packed_generation = 0;
  };
  ThreadState() : stream(engine()) { omp_set_num_threads(1); }
  dnnl::stream stream;
  std::vector<std::byte> scratch;
  std::unordered_map<Key, Bound, KeyHash> bound;
};

// B (generation `generation`) packed for b's primitive, in this thread's copy.
void* packed_copy(ThreadState::Bound& b, const void* B, uint64_t generation, ThreadState& state) {
  if (b.packed_b != B || b.packed_generation != generation) {
    if (!b.packed) b.packed = std::make_unique<PackedBuffer>(b.p->b.get_size());
    detail::grow_scratch(state.scratch, b.p->pack_scratch.get_size());
    b.b_plain.set_data_handle(const_cast<void*>(B));
    b.pack_s.set_data_handle(state.scratch.data());
    b.b.set_data_handle(b.packed->data);
    b.p->pack.execute(state.stream, {{DNNL_ARG_FROM, b.b_plain}, {DNNL_ARG_TO, b.b}, {DNNL_ARG_SCRATCHPAD, b.pack_s}});
    state.stream.wait();
    b.packed_b = B, b.packed_generation = generation;
    packs.fetch_add(1, std::memory_order_relaxed);
  }
  return b.packed->data;
}

template <class In>
void run(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const In* A, int64_t lda, const In* B,
         int64_t ldb, float beta, float* C, int64_t ldc, const float* bias, uint64_t b_generation = 0) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // oneDNN refuses empty reductions; C = beta * C (+ bias)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j)
        C[i * ldc + j] = (beta == 0 ? 0.f : beta * C[i * ldc + j]) + (bias ? bias[j] : 0.f);
    return;
  }
  uint32_t a_bits, b_bits;
  std::memcpy(&a_bits, &alpha, 4);
  std::memcpy(&b_bits, &beta, 4);
  Key key{std::is_same_v<In, bfloat16>, ta, tb, false, bias != nullptr, M, N, K, lda, ldb, ldc, a_bits,
          beta == 0 ? 0u : b_bits};
  thread_local ThreadState state;
  auto bind = [&](const Key& k) -> ThreadState::Bound& {
    auto it = state.bound.find(k);
    if (it != state.bound.end()) return it->second;
    std::shared_ptr<const Primitive> p;
    try {
      p = primitive(k);
    } catch (const dnnl::error& e) {
      throw ValueError(fmt::format("gemm: oneDNN has no matmul for {}x{}x{} (lda {}, ldb {}, ldc {}): {}", M, N, K,
                                   lda, ldb, ldc, e.what()));
    }
    const dnnl::engine& eng = engine();
    ThreadState::Bound b{p, dnnl::memory(p->a, eng, DNNL_MEMORY_NONE), dnnl::memory(p->b, eng, DNNL_MEMORY_NONE),
                         dnnl::memory(p->c, eng, DNNL_MEMORY_NONE), dnnl::memory(p->scratch, eng, DNNL_MEMORY_NONE),
                         dnnl::memory(p->bias, eng, DNNL_MEMORY_NONE), dnnl::memory(p->b_plain, eng, DNNL_MEMORY_NONE),
                         dnnl::memory(p->pack_scratch, eng, DNNL_MEMORY_NONE)};
    if (state.bound.size() >= kMaxKept) state.bound.clear();
    return state.bound.emplace(k, std::move(b)).first->second;
  };
  // B packed once and kept: only from the second call in a row with the same
  // B, so calls that take turns between Bs of one shape (a model's layers,
  // one row at a time) never pack more than oneDNN would.
  ThreadState::Bound* packed = nullptr;
  void* packed_b = nullptr;
  if (b_generation != 0 && M <= kPackedRows) {
    Key pk = key;
    pk.packed_b = true;
    ThreadState::Bound& p = bind(pk);
    if (p.last_b == B && p.last_generation == b_generation) {
      packed = &p;
      packed_b = packed_copy(p, B, b_generation, state);
    } else {
      p.last_b = B, p.last_generation = b_generation;
    }
  }
  ThreadState::Bound& b = packed ? *packed : bind(key);
  detail::grow_scratch(state.scratch, b.p->scratch.get_size());
  b.a.set_data_handle(const_cast<In*>(A));
  if (packed) {
    b.b.set_data_handle(packed_b);
  } else {
    b.b.set_data_handle(const_cast<In*>(B));
  }
  b.c.set_data_handle(C);
  b.s.set_data_handle(state.scratch.data());
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, b.a}, {DNNL_ARG_WEIGHTS, b.b}, {DNNL_ARG_DST, b.c}, {DNNL_ARG_SCRATCHPAD, b.s}};
  if (bias) {
    b.bias.set_data_handle(const_cast<float*>(bias));
    args.emplace(DNNL_ARG_BIAS, b.bias);
  }
  b.p->matmul.execute(state.stream, args);
  state.stream.wait();
}

}  // namespace

void onednn_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
                 const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias,
                 uint64_t b_generation) {
  run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, b_generation);
}
void onednn_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  run(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
}

size_t onednn_packed_bytes() { return PackedBuffer::total.load(std::memory_order_relaxed); }

uint64_t onednn_packs() { return packs.load(std::memory_order_relaxed); }

bool onednn_has_bf16() {
  static const bool has = [] {
    try {
      primitive(Key{.bf16 = true, .M = 16, .N = 16, .K = 16, .lda = 16, .ldb = 16, .ldc = 16, .alpha = 0x3f800000u});
      return true;
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return has;
}

std::string onednn_isa() {
  using isa = dnnl::cpu_isa;
  switch (dnnl::get_effective_cpu_isa()) {
    case isa::sse41: return "sse41";
    case isa::avx: return "avx";
    case isa::avx2: return "avx2";
    case isa::avx512_mic: return "avx512_mic";
    case isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case isa::avx512_core: return "avx512_core";
    case isa::avx512_core_vnni: return "avx512_core_vnni";
    case isa::avx512_core_bf16: return "avx512_core_bf16";
    case isa::avx512_core_amx: return "avx512_core_amx";
    case isa::avx2_vnni: return "avx2_vnni";
    default: return "other";
  }
}

std::string onednn_kernel(bool bf16) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  return c.kernel[bf16];
}

}  // namespace tg::detail
