#include "autograd/blas.h"

#include <cblas.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "autograd/atomic_file.h"
#include "autograd/autocast.h"
#include "autograd/bf16_kernel.h"
#include "autograd/error.h"
#include "autograd/fault.h"
#include "autograd/onednn.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"
#include "autograd/shape.h"
#include "autograd/storage.h"

namespace tg {
namespace {

blasint to_blasint(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw ShapeError(fmt::format("gemm: {} = {} does not fit OpenBLAS's integer", what, v));
  return static_cast<blasint>(v);
}

// Every GEMM reports its work to the op being profiled (matmul, linear,
// attention, the fused recurrences alike), so GFLOP/s and MFU count them all.
void count_flops(int64_t M, int64_t N, int64_t K) {
  if (profiler_enabled()) profiler_add_flops(2.0 * static_cast<double>(M) * N * K);
}

thread_local bool serial = false;  // a SerialGemm lives on this thread

// Where the backend cannot add the bias itself (OpenBLAS; oneDNN with alpha
// other than 1): C = beta * C + bias first, so the GEMM then adds its
// product with beta = 1 (which it returns).
template <class S>
S start_from_bias(int64_t M, int64_t N, S beta, const S* bias, S* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    S* c = C + i * ldc;
    if (beta == S(0)) {
      std::copy(bias, bias + N, c);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < N; ++j) c[j] = beta * c[j] + bias[j];
    }
  }
  return S(1);
}

void openblas_sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                    const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blasint(M, "M"),
              to_blasint(N, "N"), to_blasint(K, "K"), alpha, A, to_blasint(lda, "lda"), B, to_blasint(ldb, "ldb"),
              beta, C, to_blasint(ldc, "ldc"));
}

// Which float32 backend is faster depends on the CPU and on the shape. On a
// Zen 5 with AVX-512, OpenBLAS 0.3.21 runs its AVX2 kernels at half the speed
// of oneDNN's; on a CPU OpenBLAS does not know it falls back to SSE3
// ("Prescott"), 4x slower; elsewhere the two are even. Within a CPU what
// decides is how much of a call is fixed cost and packing rather than the
// inner kernel, which these classes of the shape a backend is given (one
// part of a split GEMM) separate:
//   tiny     M*N*K < 2^18 (below split_gemm's threshold): per-call overhead,
//            e.g. GPT-S's attention products, 64x64x32 a head;
//   narrow   C with at most 64 rows or columns: an operand packed for few
//            products, e.g. a recurrence's per-step product, 32x1024x256;
//   short_k  K <= 64: short sums between writes of C, e.g. a recurrence's
//            input projection (2048x1024x64) or GPT-M's attention (128x128x64);
//   large    the rest, where the inner kernel decides: the GPTs' projections
//            and MLPs (2048x768x256) and weight gradients (768x256x2048).
// Each class is timed at the representative shape below (no transposes).
struct ShapeClass {
  const char* name;
  int64_t M, N, K;
  // What is timed against oneDNN: OpenBLAS (float32 classes), or tapegrad's
  // own kernel (bfloat16's small class). It keeps the class unless oneDNN
  // measures clearly faster.
  detail::GemmBackend rival = detail::GemmBackend::openblas;
  std::once_flag measured{};
  detail::GemmBackend backend = rival;
  double gflops[2] = {0, 0};  // the rival's, oneDNN's
  bool cached = false;        // read from the machine's cache, not timed by this process
};
ShapeClass shape_classes[] = {{"tiny", 64, 64, 32}, {"narrow", 32, 1024, 256}, {"short_k", 256, 512, 64},
                               {"large", 256, 256, 256}};
// bfloat16 products small enough for tapegrad's kernel (detail::small_bf16_gemm_fits):
// attention's per-head blocks, where oneDNN's fixed cost per call is a
// third of a 64x64x64 product. Larger ones always run on oneDNN.
ShapeClass bf16_small{"bf16_small", 64, 64, 64, detail::GemmBackend::tapegrad};

ShapeClass& shape_class(int64_t M, int64_t N, int64_t K) {
  if (M * N * K < (int64_t{1} << 18)) return shape_classes[0];
  if (std::min(M, N) <= 64) return shape_classes[1];
  if (K <= 64) return shape_classes[2];
  return shape_classes[3];
}

// The backend for c from both backends' GFLOP/s.
detail::GemmBackend faster_of(const ShapeClass& c) {
  return c.gflops[1] > detail::kOnednnClearWin * c.gflops[0] ? detail::GemmBackend::onednn : c.rival;
}

const char* backend_name(detail::GemmBackend be) {
  switch (be) {
    case detail::GemmBackend::openblas: return "openblas";
    case detail::GemmBackend::onednn: return "onednn";
    case detail::GemmBackend::tapegrad: return "tapegrad";
  }
  return "?";
}

// Times both backends at c's shape on the calling thread, best of 3
// alternating repetitions of at least 2^22 multiply-adds each (one call, or
// 32 of the tiny class), after a call each that makes oneDNN's primitive and
// warms the caches: 0.5-2 ms a class at 100-200 GFLOP/s, under 5 ms for the
// five.
void measure(ShapeClass& c) {
  using detail::GemmBackend;
  const int64_t M = c.M, N = c.N, K = c.K;
  std::vector<float> a(M * K), b(K * N), out(M * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(static_cast<int>(i % 13) - 6) / 8;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(static_cast<int>(i % 7) - 3) / 4;
  const bool bf16 = c.rival == GemmBackend::tapegrad;  // the class's operands are bfloat16
  const std::vector<bfloat16> a16 = bf16 ? std::vector<bfloat16>(a.begin(), a.end()) : std::vector<bfloat16>();
  const std::vector<bfloat16> b16 = bf16 ? std::vector<bfloat16>(b.begin(), b.end()) : std::vector<bfloat16>();
  const int64_t calls = std::max<int64_t>(1, (int64_t{1} << 22) / (M * N * K));
  auto run = [&](GemmBackend be) {
    for (int64_t i = 0; i < calls; ++i)
      if (!bf16)
        detail::gemm_f32_on(be, false, false, M, N, K, 1.f, a.data(), K, b.data(), N, 0.f, out.data(), N);
      else if (be == GemmBackend::tapegrad)
        detail::small_bf16_gemm(false, false, M, N, K, 1.f, a16.data(), K, b16.data(), N, 0.f, out.data(), N);
      else
        detail::onednn_gemm(false, false, M, N, K, 1.f, a16.data(), K, b16.data(), N, 0.f, out.data(), N);
  };
  // Where a backend cannot run the class (oneDNN makes no primitive or fails
  // running it, tapegrad's kernel is not built for this CPU), it gets 0.
  const GemmBackend side_backend[2] = {c.rival, GemmBackend::onednn};
  bool runs[2] = {!bf16 || detail::small_bf16_gemm_fits(false, false, M, N, K, K, N),
                  !bf16 || detail::onednn_has_bf16()};
  double best[2] = {1e30, 1e30};
  for (int rep = -1; rep < 3; ++rep)  // rep -1: oneDNN makes its primitive, the caches warm
    for (int side = 0; side < 2; ++side) {
      if (!runs[side]) continue;
      try {
        const auto t0 = std::chrono::steady_clock::now();
        run(side_backend[side]);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (rep >= 0) best[side] = std::min(best[side], s);
      } catch (const std::exception&) {
        runs[side] = false;
      }
    }
  for (int side = 0; side < 2; ++side)
    c.gflops[side] = runs[side] ? 2.0 * M * N * K * calls / best[side] / 1e9 : 0;
  c.backend = faster_of(c);
}

// The choices are kept per machine (detail::gemm_cache_path), so that every
// process on it makes the same one: a run and its resumption, the ranks of a
// job. Timing alone can choose differently in two processes where a class's
// backends are close and the machine is busy, and float32 results differ
// with the choice. A line of the file: the machine's key, the class, its
// shape, the backend, both GFLOP/s, tab-separated.
std::string machine_key() {
  std::string model = "unknown CPU";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  // The backends' builds and the kernels they pick belong to the key (the
  // OpenBLAS config names its core): a forced OpenBLAS core
  // (OPENBLAS_CORETYPE) or oneDNN ISA is another machine.
  return fmt::format("{} | {} | oneDNN {}", model, openblas_get_config(), detail::onednn_isa());
}

std::mutex cache_mutex;  // one process's classes read and write the file one at a time

// One line of the cache, split at its tabs; nullopt (with the reason) where
// it is not <machine> <class> <shape> <openblas|onednn|tapegrad> <GFLOP/s> <GFLOP/s>
// (the rival's GFLOP/s, then oneDNN's).
struct CacheLine {
  std::string key, name, shape;
  detail::GemmBackend backend;
  double gflops[2];
};
std::optional<CacheLine> parse_cache_line(const std::string& line, std::string& why) {
  std::vector<std::string> f;
  std::istringstream fields(line);
  for (std::string x; std::getline(fields, x, '\t');) f.push_back(x);
  if (f.size() != 6) {
    why = fmt::format("{} tab-separated fields, not 6", f.size());
    return std::nullopt;
  }
  CacheLine c{f[0], f[1], f[2], detail::GemmBackend::openblas, {}};
  if (f[3] == "onednn") {
    c.backend = detail::GemmBackend::onednn;
  } else if (f[3] == "tapegrad") {
    c.backend = detail::GemmBackend::tapegrad;
  } else if (f[3] != "openblas") {
    why = fmt::format("backend '{}' is not openblas, onednn or tapegrad", f[3]);
    return std::nullopt;
  }
  for (int k = 0; k < 2; ++k) {
    char* end = nullptr;
    c.gflops[k] = std::strtod(f[4 + k].c_str(), &end);
    if (f[4 + k].empty() || *end != '\0' || !(c.gflops[k] >= 0)) {
      why = fmt::format("GFLOP/s '{}' is not a number", f[4 + k]);
      return std::nullopt;
    }
  }
  return c;
}

// The cache's lines; empty where there is no file, and for a damaged one,
// which is refused with a warning naming the file, the line and why (the
// next store then writes a clean file).
std::vector<CacheLine> read_cache(const std::string& path) {
  std::vector<CacheLine> lines;
  std::ifstream in(path);
  int line_no = 0;
  for (std::string line, why; std::getline(in, line);) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    if (auto c = parse_cache_line(line, why)) {
      lines.push_back(std::move(*c));
      continue;
    }
    fmt::print(stderr, "tapegrad: refusing the GEMM cache {}: line {}: {}; timing the backends again\n", path,
               line_no, why);
    return {};
  }
  return lines;
}

std::string shape_of(const ShapeClass& c) { return fmt::format("{}x{}x{}", c.M, c.N, c.K); }

// c's choice from the cache's lines, if they have one for this machine: made
// again from the GFLOP/s, so a file written under another margin
// (kOnednnClearWin) gives this build's choice; the backend column is for readers.
bool load_cached(ShapeClass& c, const std::vector<CacheLine>& lines, const std::string& key) {
  for (const CacheLine& l : lines)
    if (l.key == key && l.name == c.name && l.shape == shape_of(c)) {
      c.gflops[0] = l.gflops[0], c.gflops[1] = l.gflops[1];
      c.backend = faster_of(c);
      c.cached = true;
      return true;
    }
  return false;
}

// Adds c's choice to the cache, keeping its other lines (GFLOP/s written
// exactly, so a reader recomputes the same choice from them); written
// to a temporary file renamed over it, so a reader never sees half of it. A
// cache that cannot be written is no error: the next process times again.
void store(const ShapeClass& c, const std::vector<CacheLine>& lines, const std::string& path, const std::string& key) {
  std::string text = "# tapegrad: the faster GEMM backend per shape class (GFLOP/s: the rival's, oneDNN's), "
                     "timed on this machine; delete this file to time them again\n";
  auto line = [](const std::string& k, const std::string& name, const std::string& shape, detail::GemmBackend be,
                 const double* gflops) {
    return fmt::format("{}\t{}\t{}\t{}\t{}\t{}\n", k, name, shape, backend_name(be), gflops[0], gflops[1]);
  };
  for (const CacheLine& l : lines)
    if (!(l.key == key && l.name == c.name)) text += line(l.key, l.name, l.shape, l.backend, l.gflops);
  text += line(key, c.name, shape_of(c), c.backend, c.gflops);
  try {  // the directory exists: the lock beside the file made it
    detail::AtomicFile out(path, [](const std::string& message) { throw ValueError(message); });
    out.write(text.data(), text.size());
    out.commit();
  } catch (const ValueError&) {
  }
}

// Holds an exclusive lock on `path` (created if missing) while alive, so that
// processes starting together time a class once: the others wait and read
// it. Where no lock can be had (a read-only directory), nothing is held.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~FileLock() {
    if (fd_ >= 0) ::close(fd_);  // closing releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

void measure_or_load(ShapeClass& c) {
  const std::string path = detail::gemm_cache_path();
  if (path.empty()) return measure(c);
  static const std::string key = machine_key();
  std::lock_guard lock(cache_mutex);
  FileLock across_processes(path + ".lock");
  const std::vector<CacheLine> lines = read_cache(path);
  if (load_cached(c, lines, key)) return;
  measure(c);
  store(c, lines, path, key);
}

detail::GemmBackend f32_backend(int64_t M, int64_t N, int64_t K) {
  switch (detail::gemm_f32_policy()) {
    case detail::GemmF32Policy::openblas: return detail::GemmBackend::openblas;
    case detail::GemmF32Policy::onednn: return detail::GemmBackend::onednn;
    case detail::GemmF32Policy::measure: break;
  }
  ShapeClass& c = shape_class(M, N, K);
  std::call_once(c.measured, measure_or_load, c);  // a thread meeting the class meanwhile waits for the choice
  return c.backend;
}

detail::GemmBackend bf16_small_backend() {
  switch (detail::gemm_bf16_policy()) {
    case detail::GemmBf16Policy::onednn: return detail::GemmBackend::onednn;
    case detail::GemmBf16Policy::tapegrad: return detail::GemmBackend::tapegrad;
    case detail::GemmBf16Policy::measure: break;
  }
  std::call_once(bf16_small.measured, measure_or_load, bf16_small);
  return bf16_small.backend;
}

void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
               const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  detail::gemm_f32_on(f32_backend(M, N, K), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
}
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
               const double* B, int64_t ldb, double beta, double* C, int64_t ldc, const double* bias) {
  if (bias) beta = start_from_bias(M, N, beta, bias, C, ldc);
  cblas_dgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blasint(M, "M"),
              to_blasint(N, "N"), to_blasint(K, "K"), alpha, A, to_blasint(lda, "lda"), B, to_blasint(ldb, "ldb"),
              beta, C, to_blasint(ldc, "ldc"));
}

// A stored (rows, cols) bfloat16 block widened into float32 `out` (leading dimension cols).
const float* widen(const bfloat16* x, int64_t rows, int64_t cols, int64_t ld, std::vector<float>& out) {
  detail::grow_scratch(out, rows * cols);
  for (int64_t r = 0; r < rows; ++r) bf16_to_float(x + r * ld, out.data() + r * cols, cols);
  return out.data();
}

// b_generation: nonzero where B lies in a copy autocast keeps (the number
// it gave those values: see autocast_cached), so oneDNN may keep B packed.
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
               const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias,
               uint64_t b_generation = 0) {
  if (!bias && detail::small_bf16_gemm_fits(ta, tb, M, N, K, lda, ldb) &&
      bf16_small_backend() == detail::GemmBackend::tapegrad)
    return detail::small_bf16_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  const bool onednn = detail::onednn_has_bf16();
  if (bias && (!onednn || alpha != 1.0f)) beta = start_from_bias(M, N, beta, std::exchange(bias, nullptr), C, ldc);
  if (onednn) return detail::onednn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, b_generation);
  // No bfloat16 kernels on this CPU: the same products (exact in float32)
  // and float32 sums, by OpenBLAS on widened copies.
  thread_local std::vector<float> a32, b32;
  const int64_t a_cols = ta ? M : K, b_cols = tb ? K : N;
  const float* a = widen(A, ta ? K : M, a_cols, lda, a32);
  const float* b = widen(B, tb ? N : K, b_cols, ldb, b32);
  blas_gemm(ta, tb, M, N, K, alpha, a, a_cols, b, b_cols, beta, C, ldc, nullptr);
}

// C (M,N) += the products of K's parts after the first, sums (parts - 1, M, N).
template <class S>
void add_partial_sums(int64_t M, int64_t N, int64_t parts, const S* sums, S* C, int64_t ldc) {
  parallel_for(M, std::max<int64_t>(1, (int64_t{1} << 15) / N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t p = 1; p < parts; ++p) {
        S* c = C + r * ldc;
        const S* w = sums + ((p - 1) * M + r) * N;
#pragma omp simd
        for (int64_t j = 0; j < N; ++j) c[j] += w[j];
      }
  });
}

// C (M,N) split into parts of rows (A's rows: op(A) is (M,K), so a row offset
// of A is m*lda, or m when A is stored transposed) or of columns (B's columns:
// n, or n*ldb when B is stored transposed); each part is one backend call.
// A long sum (K at least 4x C's longer side: a weight gradient over the
// tokens, 256x256 from K = 2016) splits K instead, so that each part stays a
// whole, square-ish product rather than a thin slice of rows (at 2 threads
// the recurrent LM's weight gradient ran at 51% of peak per thread split by
// rows, 63% whole at one): part 0 adds its product into C (with beta), the
// others write C-sized scratch of their own, added in after; the summation
// order then depends on the thread count, by rounding only. A narrow weight
// gradient (M at least 4N, K at least M) whose A is stored transposed splits
// K too: a part of its rows would read columns of A, a strided block, which
// the backends pack slowly (bfloat16 512x64x2048 from a (2048,1024)
// A: 143 GFLOP/s against 197 from a (2048,512) one; the LSTM LM's
// 1024x64x2048 at 2 threads: 144 GFLOP/s a thread by rows, 194 by K; float32
// 89 and 103; Zen 4).
// The bias goes with each part's columns of C, and with K's first part only.
// Returns the number of parts. b_generation: as blas_gemm's (bfloat16 only).
template <class S, class In>
int split_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, S alpha, const In* A, int64_t lda, const In* B,
               int64_t ldb, S beta, S* C, int64_t ldc, const S* bias, uint64_t b_generation = 0) {
  auto one = [&](int64_t m, int64_t n, int64_t k, const In* a, const In* b, S beta_, S* c, int64_t ldc_,
                 const S* bias_) {
    if constexpr (std::is_same_v<In, bfloat16>)
      blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta_, c, ldc_, bias_, b_generation);
    else
      blas_gemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta_, c, ldc_, bias_);
  };
  constexpr int64_t kMinWork = int64_t{1} << 18, kMinSide = 16, kMinSum = 256;
  const bool by_k = K >= 4 * std::max(M, N) || (ta && M >= 4 * N && K >= M);
  const bool by_rows = M >= N;
  const int64_t side = by_k ? K : by_rows ? M : N;
  const int threads = num_threads();  // first: its first call also sets OpenBLAS to one thread
  const int64_t parts =
      serial || M * N * K < kMinWork ? 1 : std::min<int64_t>(threads, side / (by_k ? kMinSum : kMinSide));
  if (parts <= 1) {
    one(M, N, K, A, B, beta, C, ldc, bias);
    return 1;
  }
  std::shared_ptr<Storage> scratch;
  S* sums = nullptr;  // (parts - 1, M, N): the products of K's parts after the first
  if (by_k) {
    scratch = new_storage(static_cast<size_t>((parts - 1) * M * N) * sizeof(S), Shape{parts - 1, M, N},
                          dtype_of<S>::value);
    sums = static_cast<S*>(scratch->data);
  }
  // Parts start at multiples of the kernels' blocks (16 rows or columns, an
  // AVX-512 or AMX tile's; 64 of K), so that only the last part has a
  // ragged edge: with many threads, 2016 rows in parts of 126 would give
  // every part a 14-row tail. parts <= side / align keeps every part non-empty.
  const int64_t align = by_k ? 64 : kMinSide;
  auto bound = [&](int64_t p) {
    if (p == parts) return side;
    return std::min(side, (side * p / parts + align / 2) / align * align);
  };
  auto part = [&](int64_t p) {
    const int64_t i0 = bound(p), i1 = bound(p + 1);
    if (by_k) {
      const In *a = A + (ta ? i0 * lda : i0), *b = B + (tb ? i0 : i0 * ldb);
      if (p == 0)
        one(M, N, i1 - i0, a, b, beta, C, ldc, bias);
      else
        one(M, N, i1 - i0, a, b, S(0), sums + (p - 1) * M * N, N, nullptr);
    } else if (by_rows) {
      one(i1 - i0, N, K, A + (ta ? i0 : i0 * lda), B, beta, C + i0 * ldc, ldc, bias);
    } else {
      one(M, i1 - i0, K, A, B + (tb ? i0 * ldb : i0), beta, C + i0, ldc, bias ? bias + i0 : nullptr);
    }
  };
  auto run = [](void* ctx, int64_t p) { (*static_cast<decltype(part)*>(ctx))(p); };
  if (!detail::run_chunks(parts, run, &part))
    for (int64_t p = 0; p < parts; ++p) part(p);
  if (by_k) add_partial_sums(M, N, parts, sums, C, ldc);
  return static_cast<int>(parts);
}

// An operand of an autocast GEMM as bfloat16: a kept parameter's copy (same
// strides), or its stored (rows, cols) block rounded into `block` (leading
// dimension cols), a block of the tensors' caching allocator held for the
// GEMM: between GEMMs the memory serves tensors, where a buffer of the
// thread's own would sit beside them at the size of the largest operand.
struct Rounded {
  const bfloat16* p;
  int64_t ld;
  uint64_t generation = 0;  // of a kept copy's values; 0 for a rounded block
};
Rounded round_operand(const float* x, int64_t rows, int64_t cols, int64_t ld, std::shared_ptr<Storage>& block) {
  uint64_t generation = 0;
  if (const bfloat16* kept = detail::autocast_cached(x, &generation)) return {kept, ld, generation};
  block.reset();  // a slice's block goes back before the next is taken, so the two need not coexist
  block = new_storage(static_cast<size_t>(rows * cols) * sizeof(bfloat16), Shape{rows, cols}, DType::bf16);
  bfloat16* out = static_cast<bfloat16*>(block->data);
  const int64_t shape[] = {rows}, strides[] = {ld};
  detail::round_rows(x, shape, strides, cols, out);
  return {out, cols};
}

// Rows [i0, i0 + m) and sums [p0, p0 + k) of a product's operand rounded:
// op(A) (M,K), stored (M,K) or, trans, (K,M); or op(B)^T, B stored (K,N) with
// trans = !tb.
Rounded round_block(bool trans, const float* x, int64_t ld, int64_t i0, int64_t m, int64_t p0, int64_t k,
                    std::shared_ptr<Storage>& block) {
  return trans ? round_operand(x + p0 * ld + i0, k, m, ld, block)
               : round_operand(x + i0 * ld + p0, m, k, ld, block);
}

// The most bytes an operand's rounded blocks may take at once. Larger
// operands that are not kept copies would add their whole bfloat16 size to
// the step's peak beside the float32 tensors (the LSTM's weight gradient
// rounds its (tokens, 4H) gate gradient, 4 MiB, and its states), and stay in
// the allocator's cache at that size. The GEMM runs instead in slices, each
// rounding its part into blocks of at most this: of C's rows (A is the
// larger to round) or columns (B is), where each slice is a whole block of C
// and C's values do not change; or, where both operands are rounded and K is
// the longest dimension (a weight gradient, K the tokens), of K, each slice
// adding its product into C in float32. 1 MiB took the LSTM LM's bfloat16
// peak RSS 3 MiB lower at 1 thread and 5 at 2, 512 KiB the recurrent LMs'
// peak of tensor memory another 0.4-0.5 MiB (the tanh RNN's (256,256)
// weight gradient over 2016 steps rounds its two operands in four slices,
// not two), at the same speed (Zen 4, lm_train, alternating runs).
constexpr int64_t kMaxRoundedBytes = int64_t{1} << 19;
constexpr int64_t kMinSlice = 64;  // rows, columns or k of a slice, so that it stays a GEMM that runs near peak

// A long sum of two rounded operands (a weight gradient over the tokens) on
// several threads: K cut into one part a thread, each part rounding its own
// slices of A and B (at most `budget` bytes at a time) and summing their
// products on its thread, part 0 into C (with beta and the bias), the others
// into C-sized scratch added in after. Cutting each
// slice's product over the threads instead gave each thin rows of a thin sum
// (the recurrent LM's 256x256 weight gradient from K = 2016 ran at 56% of
// peak per thread at 2 threads, 83% at one), and rounded a slice before
// either thread could start on it.
int sum_over_k_parts(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias, int64_t parts,
                     int64_t budget) {
  std::shared_ptr<Storage> scratch = new_storage(static_cast<size_t>((parts - 1) * M * N) * sizeof(float),
                                                 Shape{parts - 1, M, N}, DType::f32);
  float* sums = static_cast<float*>(scratch->data);  // (parts - 1, M, N)
  auto part = [&](int64_t p) {
    SerialGemm whole;
    std::shared_ptr<Storage> a_block, b_block;
    const int64_t k0 = K * p / parts, k1 = K * (p + 1) / parts;
    const int64_t bytes = (M + N) * (k1 - k0) * int64_t{sizeof(bfloat16)};  // the part's operands rounded
    const int64_t n = std::max<int64_t>(1, std::min((bytes + budget - 1) / budget, (k1 - k0) / kMinSlice));
    for (int64_t s = 0; s < n; ++s) {
      const int64_t p0 = k0 + (k1 - k0) * s / n, k = k0 + (k1 - k0) * (s + 1) / n - p0;
      const Rounded a = round_block(ta, A, lda, 0, M, p0, k, a_block);
      const Rounded b = round_block(!tb, B, ldb, 0, N, p0, k, b_block);
      const bool into_c = p == 0, first = s == 0;
      blas_gemm(ta, tb, M, N, k, alpha, a.p, a.ld, b.p, b.ld, !first ? 1.0f : into_c ? beta : 0.0f,
                into_c ? C : sums + (p - 1) * M * N, into_c ? ldc : N, into_c && first ? bias : nullptr);
    }
  };
  auto run = [](void* ctx, int64_t p) { (*static_cast<decltype(part)*>(ctx))(p); };
  if (!detail::run_chunks(parts, run, &part))
    for (int64_t p = 0; p < parts; ++p) part(p);
  add_partial_sums(M, N, parts, sums, C, ldc);
  return static_cast<int>(parts);
}

int autocast_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  constexpr int64_t two = sizeof(bfloat16);
  int64_t a_bytes = M * K * two, b_bytes = N * K * two;  // to round; kept copies are looked up only when it matters
  if (a_bytes + b_bytes > kMaxRoundedBytes) {
    if (detail::autocast_cached(A)) a_bytes = 0;
    if (detail::autocast_cached(B)) b_bytes = 0;
  }
  const int64_t total = a_bytes + b_bytes, pieces = (total + kMaxRoundedBytes - 1) / kMaxRoundedBytes;
  std::shared_ptr<Storage> a_block, b_block;
  // Stored as (M,K), or (K,M) when transposed; B likewise.
  auto round_a = [&](int64_t i0, int64_t m, int64_t p0, int64_t k) {
    return round_block(ta, A, lda, i0, m, p0, k, a_block);
  };
  auto round_b = [&](int64_t j0, int64_t n, int64_t p0, int64_t k) {
    return round_block(!tb, B, ldb, j0, n, p0, k, b_block);
  };
  if (a_bytes > 0 && b_bytes > 0 && K >= std::max(M, N) && pieces > 1) {
    // On several threads when each part's rounded slices, beside the parts'
    // scratch, keep to the same bound and still take kMinSlice of K (with
    // 1/8 to spare: the allocator's blocks are up to that much larger).
    const int64_t parts = serial ? 1 : std::min<int64_t>(num_threads(), K / (4 * kMinSlice));
    if (parts > 1) {
      const int64_t scratch = (parts - 1) * M * N * int64_t{sizeof(float)};
      const int64_t budget = (kMaxRoundedBytes - scratch - scratch / 8) * 7 / 8 / parts;
      if (budget >= kMinSlice * (M + N) * two)
        return sum_over_k_parts(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, parts, budget);
    }
    const int64_t slices = std::max<int64_t>(1, std::min(pieces, K / kMinSlice));
    int used = 1;
    for (int64_t s = 0; s < slices; ++s) {
      const int64_t p0 = K * s / slices, k = K * (s + 1) / slices - p0;
      const Rounded a = round_a(0, M, p0, k), b = round_b(0, N, p0, k);
      used = split_gemm(ta, tb, M, N, k, alpha, a.p, a.ld, b.p, b.ld, s == 0 ? beta : 1.0f, C, ldc,
                        s == 0 ? bias : nullptr);
    }
    return used;
  }
  const bool slice_a = a_bytes >= b_bytes;  // slice C along the larger rounded operand's free dimension
  const int64_t side = slice_a ? M : N;
  const int64_t slices = std::max<int64_t>(1, std::min(pieces, side / kMinSlice));
  const Rounded whole = slice_a ? round_b(0, N, 0, K) : round_a(0, M, 0, K);  // the operand not sliced, once
  int parts = 1;
  for (int64_t s = 0; s < slices; ++s) {
    const int64_t i0 = side * s / slices, n = side * (s + 1) / slices - i0;
    if (slice_a) {
      const Rounded a = round_a(i0, n, 0, K);
      parts = split_gemm(ta, tb, n, N, K, alpha, a.p, a.ld, whole.p, whole.ld, beta, C + i0 * ldc, ldc, bias,
                         whole.generation);
    } else {
      const Rounded b = round_b(i0, n, 0, K);
      parts = split_gemm(ta, tb, M, n, K, alpha, whole.p, whole.ld, b.p, b.ld, beta, C + i0, ldc,
                         bias ? bias + i0 : nullptr, b.generation);
    }
  }
  return parts;
}

// Runs one GEMM (run returns the threads it split it over). Its work goes
// to the op being profiled; while the profiler is on, its time goes to its
// shape's row too (profiler_gemm_shapes).
template <class Run>
void profiled(std::string_view precision, bool ta, bool tb, int64_t M, int64_t N, int64_t K, Run&& run) {
  count_flops(M, N, K);
  if (!profiler_enabled()) {
    run();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const int threads = run();
  profiler_add_gemm(precision, ta, tb, M, N, K, threads,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  if (autocast_enabled() && M > 0 && N > 0 && K > 0)
    return profiled("bf16", ta, tb, M, N, K,
                    [&] { return autocast_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias); });
  profiled("f32", ta, tb, M, N, K,
           [&] { return split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias); });
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bfloat16* A, int64_t lda,
          const bfloat16* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  profiled("bf16", ta, tb, M, N, K,
           [&] { return split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias); });
}

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha, const double* A, int64_t lda,
          const double* B, int64_t ldb, double beta, double* C, int64_t ldc, const double* bias) {
  profiled("f64", ta, tb, M, N, K,
           [&] { return split_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias); });
}

SerialGemm::SerialGemm() : saved_(serial) { serial = true; }
SerialGemm::~SerialGemm() { serial = saved_; }

void blas_set_num_threads(int n) { openblas_set_num_threads(n); }

int blas_num_threads() { return openblas_get_num_threads(); }

namespace detail {

GemmF32Policy parse_gemm_f32_policy(const char* value) {
  if (value == nullptr || *value == '\0') return GemmF32Policy::measure;
  const std::string_view v = value;
  if (v == "measure") return GemmF32Policy::measure;
  if (v == "openblas") return GemmF32Policy::openblas;
  if (v == "onednn") return GemmF32Policy::onednn;
  throw ValueError(fmt::format("TAPEGRAD_GEMM_F32={}: give openblas, onednn or measure", v));
}

std::string gemm_cache_path() {
  static const std::string path = [] {
    if (const char* dir = std::getenv("TAPEGRAD_CACHE_DIR")) return *dir ? std::string(dir) + "/gemm.tsv" : "";
    if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) return std::string(xdg) + "/tapegrad/gemm.tsv";
    if (const char* home = std::getenv("HOME"); home && *home) return std::string(home) + "/.cache/tapegrad/gemm.tsv";
    return std::string();
  }();
  return path;
}

GemmBf16Policy parse_gemm_bf16_policy(const char* value) {
  if (value == nullptr || *value == '\0') return GemmBf16Policy::measure;
  const std::string_view v = value;
  if (v == "measure") return GemmBf16Policy::measure;
  if (v == "onednn") return GemmBf16Policy::onednn;
  if (v == "tapegrad") return GemmBf16Policy::tapegrad;
  throw ValueError(fmt::format("TAPEGRAD_GEMM_BF16={}: give onednn, tapegrad or measure", v));
}

GemmBf16Policy gemm_bf16_policy() {
  static const GemmBf16Policy policy = parse_gemm_bf16_policy(std::getenv("TAPEGRAD_GEMM_BF16"));
  return policy;
}

GemmBf16Choice gemm_bf16_choice() {
  GemmBf16Choice choice{fmt::format("{}x{}x{}", bf16_small.M, bf16_small.N, bf16_small.K), bf16_small_backend()};
  if (gemm_bf16_policy() == GemmBf16Policy::measure)
    choice.tapegrad_gflops = bf16_small.gflops[0], choice.onednn_gflops = bf16_small.gflops[1],
    choice.cached = bf16_small.cached;
  return choice;
}

GemmF32Policy gemm_f32_policy() {
  static const GemmF32Policy policy = parse_gemm_f32_policy(std::getenv("TAPEGRAD_GEMM_F32"));
  return policy;
}

std::vector<GemmF32Choice> gemm_f32_choices() {
  std::vector<GemmF32Choice> out;
  for (ShapeClass& c : shape_classes) {
    GemmF32Choice choice{c.name, fmt::format("{}x{}x{}", c.M, c.N, c.K), f32_backend(c.M, c.N, c.K)};
    if (gemm_f32_policy() == GemmF32Policy::measure)
      choice.openblas_gflops = c.gflops[0], choice.onednn_gflops = c.gflops[1], choice.cached = c.cached;
    out.push_back(choice);
  }
  return out;
}

void round_rows(const float* x, std::span<const int64_t> shape, std::span<const int64_t> strides, int64_t cols,
                bfloat16* out) {
  int64_t rows = 1;
  for (int64_t n : shape) rows *= n;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(cols, 1));
  const int64_t dims = static_cast<int64_t>(shape.size());
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    // Row r0's index over the leading dims, and its offset by their strides;
    // then both step on like an odometer (a division per dim for every row
    // cost more than rounding a row of 64).
    int64_t index[kMaxDims] = {}, offset = 0;
    for (int64_t d = dims - 1, rest = r0; d >= 0; rest /= shape[d--]) {
      index[d] = rest % shape[d];
      offset += index[d] * strides[d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      float_to_bf16(x + offset, out + r * cols, cols);
      for (int64_t d = dims - 1; d >= 0; --d) {
        offset += strides[d];
        if (++index[d] < shape[d]) break;
        offset -= index[d] * strides[d];
        index[d] = 0;
      }
    }
  });
}

void gemm_f32_on(GemmBackend backend, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* bias) {
  const bool onednn = backend == GemmBackend::onednn;
  if (bias && (!onednn || alpha != 1.0f)) beta = start_from_bias(M, N, beta, std::exchange(bias, nullptr), C, ldc);
  if (onednn) return onednn_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias);
  openblas_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace detail

std::string gemm_backend_info() {
  std::string bf16 = detail::onednn_has_bf16()
                         ? fmt::format("oneDNN {} {}", detail::onednn_isa(), detail::onednn_kernel(true))
                         : fmt::format("oneDNN {} has no bfloat16 matmul: OpenBLAS on widened operands",
                                       detail::onednn_isa());
  const detail::GemmBf16Choice small = detail::gemm_bf16_choice();
  const char* small_on = small.backend == detail::GemmBackend::tapegrad ? "tapegrad" : "oneDNN";
  if (detail::gemm_bf16_policy() == detail::GemmBf16Policy::measure)
    bf16 += fmt::format(", and for small products the faster of tapegrad's kernel and it, measured (GFLOP/s); "
                        "{} {}: {} ({:.1f} vs {:.1f}{})", bf16_small.name,
                        small.shape, small_on, small.tapegrad_gflops, small.onednn_gflops,
                        small.cached ? ", cached" : "");
  else
    bf16 += fmt::format("; small products on {} (TAPEGRAD_GEMM_BF16={})", small_on, std::getenv("TAPEGRAD_GEMM_BF16"));
  const std::string openblas = fmt::format("OpenBLAS {}", openblas_get_corename());
  const std::string onednn = fmt::format("oneDNN {}", detail::onednn_isa());
  std::string f32;
  switch (detail::gemm_f32_policy()) {
    case detail::GemmF32Policy::openblas: f32 = openblas + " for every shape (TAPEGRAD_GEMM_F32=openblas)"; break;
    case detail::GemmF32Policy::onednn: f32 = onednn + " for every shape (TAPEGRAD_GEMM_F32=onednn)"; break;
    case detail::GemmF32Policy::measure:
      f32 = fmt::format("the faster per shape class, measured ({} vs {}, GFLOP/s)", openblas, onednn);
      for (const detail::GemmF32Choice& c : detail::gemm_f32_choices())
        f32 += fmt::format("; {} {}: {} ({:.1f} vs {:.1f}{})", c.name, c.shape,
                           c.backend == detail::GemmBackend::onednn ? "oneDNN" : "OpenBLAS", c.openblas_gflops,
                           c.onednn_gflops, c.cached ? ", cached" : "");
      if (const std::string path = detail::gemm_cache_path(); !path.empty()) f32 += fmt::format("; cache {}", path);
      break;
  }
  return fmt::format("float32: {}; bfloat16: {}", f32, bf16);
}

}  // namespace tg
