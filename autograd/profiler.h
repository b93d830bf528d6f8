#pragma once
/// \file
/// Per-op profiler: off by default (one branch per op when off). Turn it on with
/// profiler_enable(true) or the environment variable TAPEGRAD_PROFILE=1, then
/// print profiler_report(): op, calls, total time, share, achieved GFLOP/s.
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tg {

/// Turns timing on or off (for every thread).
void profiler_enable(bool on);
/// Whether ops are being timed.
bool profiler_enabled();
/// Forgets what was timed so far.
void profiler_reset();
/// Table of the ops timed since the last reset. If gemm_peak_gflops > 0 the
/// report adds the model FLOP utilisation (matmul FLOP/s over that peak).
std::string profiler_report(double gemm_peak_gflops = 0.0);
/// Sums over the ops timed since the last reset: all ops' time, and the time
/// and floating-point work of the ops that report work (the matmuls).
struct ProfileTotals {
  double seconds = 0;       ///< all ops
  double flop_seconds = 0;  ///< the ops that report work
  double flops = 0;         ///< their floating-point operations
  /// flops less the work that rebuilt a value the forward had computed
  /// (RecomputedWork): the model's FLOPs, which MFU counts.
  double model_flops = 0;
};
/// The totals since the last reset.
ProfileTotals profiler_totals();
/// Adds floating-point work to the op currently being timed (matmul reports 2*M*N*K).
void profiler_add_flops(double flops);
/// While one lives, the work profiler_add_flops gets on its thread rebuilds
/// values the forward computed (attention's probabilities in its backward):
/// it counts toward its op's FLOPs and GFLOP/s, the hardware's work, but not
/// toward ProfileTotals::model_flops.
class RecomputedWork {
 public:
  RecomputedWork();   ///< marks this thread's work as recomputed
  ~RecomputedWork();  ///< restores the mark it found
  RecomputedWork(const RecomputedWork&) = delete;
  RecomputedWork& operator=(const RecomputedWork&) = delete;

 private:
  bool saved_;
};
/// One GEMM shape's calls while the profiler was on (profiler_gemm_shapes).
struct GemmShapeStats {
  std::string precision;  ///< what it multiplied in: "f32", "bf16" (autocast or bfloat16 operands) or "f64"
  bool ta = false;  ///< A transposed (row-major, as gemm() takes it)
  bool tb = false;  ///< B transposed
  int64_t M = 0;    ///< rows of C
  int64_t N = 0;    ///< columns of C
  int64_t K = 0;    ///< the inner dim
  int threads = 1;  ///< the threads gemm() split it over (1 for a GEMM run inside a parallel op)
  uint64_t calls = 0;  ///< calls of this shape
  double seconds = 0;  ///< wall time of its calls, summed
  /// GFLOP/s of each thread it ran on: 2 M N K calls / (seconds * threads).
  double gflops_per_thread() const;
};
/// Adds one call of a GEMM shape (gemm() reports each while the profiler is on).
void profiler_add_gemm(std::string_view precision, bool ta, bool tb, int64_t M, int64_t N, int64_t K, int threads,
                       double seconds);
/// The GEMM shapes timed since the last reset, most time first.
std::vector<GemmShapeStats> profiler_gemm_shapes();
/// Table of profiler_gemm_shapes(): shape, calls, time, share of all GEMM
/// time, GFLOP/s per thread and, given one core's peak (GFLOP/s) for the
/// precision the shapes ran in, each one's fraction of it; the rows past
/// `max_rows` are summed into one.
std::string profiler_gemm_report(double core_peak_gflops = 0.0, size_t max_rows = 20);
/// The OpenBLAS sgemm peak at the current thread count: best GFLOP/s of five
/// square n x n x n products after a warm-up (what MFU is measured against).
double measure_sgemm_peak_gflops(int64_t n = 1024);

/// forward: "op"; backward: "op (backward)"; recompute: "op (recompute)",
/// an output rebuilt for another op's backward (Node::saved_tensor);
/// tangent: "op (tangent)", the op's tangent rule (forward mode), which runs
/// when the next op reads the tangent. A recompute or a tangent rule is timed
/// as its own row even inside another op's scope, and that op's time and work
/// exclude it, so a GEMM op's GFLOP/s is not diluted by the pointwise work of
/// rebuilding its input, nor an op's time by the rule of the op before it.
enum class ProfilePhase { forward, backward, recompute, tangent };

/// Times its own lifetime as one call of `op` in the profiler's table (when
/// the profiler is on); an op of one's own opens one in its forward and
/// backward. Profiler on or off, it is also the thread's innermost running
/// op while it lives, which an out-of-memory error names (current_op_name).
class ProfileScope {
 public:
  /// Starts timing `op`, if the profiler is on.
  ProfileScope(std::string_view op, ProfilePhase phase = ProfilePhase::forward)
      : op_(op), phase_(phase), outer_(innermost()) {
    innermost() = this;
    if (profiler_enabled()) start();
  }
  ~ProfileScope() {
    if (active_) stop();
    innermost() = outer_;
  }
  ProfileScope(const ProfileScope&) = delete;
  ProfileScope& operator=(const ProfileScope&) = delete;

 private:
  friend std::string current_op_name();
  static ProfileScope*& innermost();
  void start();
  void stop();
  bool active_ = false;
  std::string_view op_;
  ProfilePhase phase_ = ProfilePhase::forward;
  ProfileScope* outer_;
  std::chrono::steady_clock::time_point t0_;
  uint64_t flops0_ = 0;      // the GEMM work counter when the scope opened
  double excluded0_ = 0;     // the thread's recompute seconds when it opened
  uint64_t excluded_flops0_ = 0;
};

/// The op running on this thread now, as the profiler names it ("matmul",
/// "matmul (backward)", "layer_norm (recompute)"), or "" outside any op.
std::string current_op_name();

}  // namespace tg
