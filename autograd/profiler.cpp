#include "autograd/profiler.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "autograd/blas.h"
#include "autograd/parallel.h"

namespace tg {
namespace {

struct Entry {
  uint64_t calls = 0;
  double seconds = 0, flops = 0;
};

// A GEMM shape: precision, transposes, M, N, K and the threads it ran on.
using GemmKey = std::tuple<std::string, bool, bool, int64_t, int64_t, int64_t, int>;

struct State {
  std::mutex mu;
  std::map<std::string, Entry> entries;  // "op" or "op (backward)"
  std::map<GemmKey, Entry> gemms;
};

State& state() {
  static State* s = new State();
  return *s;
}

bool initial_enabled() {
  const char* e = std::getenv("TAPEGRAD_PROFILE");
  return e && *e && std::string_view(e) != "0";
}
bool g_enabled = initial_enabled();
// Nested scopes (an op calling another op) attribute time to the outermost.
thread_local int t_depth = 0;
// The work of every GEMM since the start, from any thread: an op's GEMMs may
// run on the pool's workers, so a scope counts the growth of this total while
// it is open (the profiler assumes one thread drives the ops, as training does).
std::atomic<uint64_t> g_flops{0};
// Time and work of the scopes timed apart (stands_apart) run on this thread
// so far: the enclosing op's scope subtracts what grew while it was open.
thread_local double t_apart_seconds = 0;
thread_local uint64_t t_apart_flops = 0;
// The part of g_flops that RecomputedWork marked, and its value at the last reset.
std::atomic<uint64_t> g_recomputed_flops{0};
uint64_t g_recomputed_at_reset = 0;
thread_local bool t_recomputing = false;

// A recompute (an output rebuilt for another op's backward) and a tangent
// rule (run when the next op reads the tangent) are rows of their own even
// when nested in another op's scope, and that op's time excludes them.
bool stands_apart(ProfilePhase phase) { return phase == ProfilePhase::recompute || phase == ProfilePhase::tangent; }
const char* phase_suffix(ProfilePhase phase) {
  switch (phase) {
    case ProfilePhase::backward: return " (backward)";
    case ProfilePhase::recompute: return " (recompute)";
    case ProfilePhase::tangent: return " (tangent)";
    default: return "";
  }
}

}  // namespace

void profiler_enable(bool on) { g_enabled = on; }
bool profiler_enabled() { return g_enabled; }
void profiler_reset() {
  std::lock_guard lock(state().mu);
  state().entries.clear();
  state().gemms.clear();
  g_recomputed_at_reset = g_recomputed_flops.load(std::memory_order_relaxed);
}
void profiler_add_flops(double flops) {
  g_flops.fetch_add(static_cast<uint64_t>(flops), std::memory_order_relaxed);
  if (t_recomputing) g_recomputed_flops.fetch_add(static_cast<uint64_t>(flops), std::memory_order_relaxed);
}
RecomputedWork::RecomputedWork() : saved_(t_recomputing) { t_recomputing = true; }
RecomputedWork::~RecomputedWork() { t_recomputing = saved_; }

ProfileScope*& ProfileScope::innermost() {
  thread_local ProfileScope* scope = nullptr;
  return scope;
}

std::string current_op_name() {
  const ProfileScope* s = ProfileScope::innermost();
  if (!s) return "";
  return fmt::format("'{}'{}", s->op_, phase_suffix(s->phase_));
}

void ProfileScope::start() {
  // Nested in a timed op: counted in the outer one, unless it stands apart.
  if (t_depth > 0 && !stands_apart(phase_)) return;
  ++t_depth;
  active_ = true;
  flops0_ = g_flops.load(std::memory_order_relaxed);
  excluded0_ = t_apart_seconds;
  excluded_flops0_ = t_apart_flops;
  t0_ = std::chrono::steady_clock::now();
}

void ProfileScope::stop() {
  const double total_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const uint64_t total_flops = g_flops.load(std::memory_order_relaxed) - flops0_;
  const double dt = total_seconds - (t_apart_seconds - excluded0_);
  const double flops = static_cast<double>(total_flops - (t_apart_flops - excluded_flops0_));
  --t_depth;
  if (stands_apart(phase_)) {
    // Everything it took, nested scopes included, leaves the enclosing op.
    t_apart_seconds = excluded0_ + total_seconds;
    t_apart_flops = excluded_flops0_ + total_flops;
  }
  std::string key = fmt::format("{}{}", op_, phase_suffix(phase_));
  std::lock_guard lock(state().mu);
  Entry& e = state().entries[key];
  e.calls++;
  e.seconds += dt;
  e.flops += flops;
}

ProfileTotals profiler_totals() {
  std::lock_guard lock(state().mu);
  ProfileTotals t;
  for (auto& [name, e] : state().entries) {
    t.seconds += e.seconds;
    if (e.flops > 0) t.flop_seconds += e.seconds, t.flops += e.flops;
  }
  t.model_flops = t.flops - static_cast<double>(g_recomputed_flops.load(std::memory_order_relaxed) - g_recomputed_at_reset);
  return t;
}

std::string profiler_report(double gemm_peak_gflops) {
  std::lock_guard lock(state().mu);
  std::vector<std::pair<std::string, Entry>> rows(state().entries.begin(), state().entries.end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  double total = 0, flops = 0;
  for (auto& [name, e] : rows) total += e.seconds, flops += e.flops;
  std::string out = fmt::format("{:<32} {:>9} {:>11} {:>7} {:>9}\n", "op", "calls", "total ms", "share", "GFLOP/s");
  for (auto& [name, e] : rows) {
    std::string gf = e.flops > 0 ? fmt::format("{:.1f}", e.flops / e.seconds / 1e9) : "";
    out += fmt::format("{:<32} {:>9} {:>11.2f} {:>6.1f}% {:>9}\n", name, e.calls, e.seconds * 1e3,
                       total > 0 ? 100 * e.seconds / total : 0.0, gf);
  }
  out += fmt::format("{:<32} {:>9} {:>11.2f} {:>7} {:>9.1f}\n", "total", "", total * 1e3, "",
                     total > 0 ? flops / total / 1e9 : 0.0);
  if (gemm_peak_gflops > 0 && total > 0)
    out += fmt::format("MFU: {:.1f}% of the measured GEMM peak ({:.1f} GFLOP/s)\n",
                       100 * flops / total / 1e9 / gemm_peak_gflops, gemm_peak_gflops);
  return out;
}

double GemmShapeStats::gflops_per_thread() const {
  return seconds > 0 ? 2.0 * static_cast<double>(M) * N * K * calls / (seconds * threads) / 1e9 : 0.0;
}

void profiler_add_gemm(std::string_view precision, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int threads,
                       double seconds) {
  std::lock_guard lock(state().mu);  // GEMMs of a head-parallel op report from every worker
  Entry& e = state().gemms[GemmKey{std::string(precision), ta, tb, M, N, K, threads}];
  e.calls++;
  e.seconds += seconds;
}

std::vector<GemmShapeStats> profiler_gemm_shapes() {
  std::lock_guard lock(state().mu);
  std::vector<GemmShapeStats> out;
  for (const auto& [k, e] : state().gemms) {
    const auto& [precision, ta, tb, M, N, K, threads] = k;
    out.push_back({precision, ta, tb, M, N, K, threads, e.calls, e.seconds});
  }
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.seconds > b.seconds; });
  return out;
}

std::string profiler_gemm_report(double core_peak_gflops, size_t max_rows) {
  const std::vector<GemmShapeStats> shapes = profiler_gemm_shapes();
  double total = 0;
  for (const GemmShapeStats& g : shapes) total += g.seconds;
  const bool peak = core_peak_gflops > 0;
  std::string out = fmt::format("{:<5} {:<3} {:>16} {:>7} {:>7} {:>10} {:>6} {:>13}{}\n", "GEMM", "A B", "M x N x K",
                                "threads", "calls", "total ms", "share", "GFLOP/s/thr", peak ? "  of peak" : "");
  GemmShapeStats rest;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const GemmShapeStats& g = shapes[i];
    if (i >= max_rows) {
      rest.calls += g.calls, rest.seconds += g.seconds;
      continue;
    }
    const double gf = g.gflops_per_thread();
    out += fmt::format("{:<5} {}{} {:>16} {:>7} {:>7} {:>10.2f} {:>5.1f}% {:>13.1f}{}\n", g.precision,
                       g.ta ? "T " : "N ", g.tb ? "T" : "N", fmt::format("{}x{}x{}", g.M, g.N, g.K), g.threads,
                       g.calls, g.seconds * 1e3, total > 0 ? 100 * g.seconds / total : 0.0, gf,
                       peak ? fmt::format("  {:>6.1f}%", 100 * gf / core_peak_gflops) : "");
  }
  if (rest.calls > 0)
    out += fmt::format("{:<5} {:<3} {:>16} {:>7} {:>7} {:>10.2f} {:>5.1f}%\n", "", "", "(other shapes)", "",
                       rest.calls, rest.seconds * 1e3, total > 0 ? 100 * rest.seconds / total : 0.0);
  return out;
}

double measure_sgemm_peak_gflops(int64_t n) {
  // OpenBLAS's own peak at num_threads() threads: its threading, not gemm()'s
  // split, and OpenBLAS whichever backend gemm() chose for float32.
  struct OpenBlasThreads {
    OpenBlasThreads() { blas_set_num_threads(num_threads()); }
    ~OpenBlasThreads() { blas_set_num_threads(1); }
  } openblas;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  auto sgemm = [&] {
    detail::gemm_f32_on(detail::GemmBackend::openblas, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f,
                        c.data(), n);
  };
  sgemm();  // warm-up
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = std::chrono::steady_clock::now();
    sgemm();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 2.0 * n * n * n / s / 1e9);
  }
  return best;
}

}  // namespace tg
