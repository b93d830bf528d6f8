// allreduce_bw — the time of one float32 sum-allreduce against its size, as
// DistributedDataParallel issues them (MPI_Iallreduce then MPI_Wait) and as
// the blocking MPI_Allreduce. Rank 0 prints one JSON line per size:
// microseconds per call, the median and the fastest of the repetitions (on a
// machine whose cores are shared, a call often waits for the other rank to
// be scheduled: the median measures that, the fastest what the transport
// does), and for the fastest two bandwidths, "algbw" = bytes / time and
// "busbw" = algbw * 2(N-1)/N, the bytes each rank actually moves in a ring
// allreduce (the nccl-tests convention), which is what a link's speed bounds.
//
//   mpirun -np 2 --bind-to none build/bench/allreduce_bw
//   mpirun -np 2 --bind-to none build/bench/allreduce_bw --min-kb 4 --max-kb 65536 --seconds 0.3
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "distributed/dist.h"

using namespace tg;

namespace {

struct Timing {
  double median, fastest;  // seconds per call
};

// Seconds per call of f over at least 5 calls and about `budget` seconds.
template <class F>
Timing time_calls(F&& f, double budget) {
  f();  // first touch of the buffers, connection set-up
  std::vector<double> times;
  double spent = 0;
  // Every rank must make the same number of calls: rank 0 decides, after each call.
  for (int more = 1; more;) {
    MPI_Barrier(MPI_COMM_WORLD);
    auto t0 = std::chrono::steady_clock::now();
    f();
    double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    times.push_back(t);
    spent += t;
    more = times.size() < 5 || spent < budget;
    MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
  }
  std::sort(times.begin(), times.end());
  return {times[times.size() / 2], times.front()};
}

}  // namespace

int main(int argc, char** argv) {
  dist::Environment mpi(argc, argv);
  int64_t min_kb = 1, max_kb = 64 * 1024;
  double budget = 0.3;
  CLI::App app{"allreduce_bw: float32 allreduce time and bandwidth against message size (run under mpirun)"};
  app.add_option("--min-kb", min_kb, "Smallest message, KiB")->check(CLI::PositiveNumber);
  app.add_option("--max-kb", max_kb, "Largest message, KiB (sizes go up by 4x)")->check(CLI::PositiveNumber);
  app.add_option("--seconds", budget, "Time spent per size and call");
  CLI11_PARSE(app, argc, argv);
  try {
    const int N = dist::world_size();
    if (N < 2) throw ValueError("allreduce_bw: run it under mpirun with at least 2 ranks");
    for (int64_t kb = min_kb; kb <= max_kb; kb *= 4) {
      const int n = static_cast<int>(kb * 1024 / 4);
      std::vector<float> buf(static_cast<size_t>(n), 1.0f);
      const Timing blocking = time_calls(
          [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }, budget);
      const Timing nonblocking = time_calls(
          [&] {
            MPI_Request r;
            MPI_Iallreduce(MPI_IN_PLACE, buf.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &r);
            MPI_Wait(&r, MPI_STATUS_IGNORE);
          },
          budget);
      if (!dist::is_main()) continue;
      const double bytes = kb * 1024.0, bus = 2.0 * (N - 1) / N;
      fmt::print(
          "{{\"ranks\": {}, \"bytes\": {}, \"iallreduce_median_us\": {:.1f}, \"iallreduce_fastest_us\": {:.1f}, "
          "\"iallreduce_algbw_gbs\": {:.3f}, \"iallreduce_busbw_gbs\": {:.3f}, \"allreduce_median_us\": {:.1f}, "
          "\"allreduce_fastest_us\": {:.1f}, \"allreduce_algbw_gbs\": {:.3f}, \"allreduce_busbw_gbs\": {:.3f}}}\n",
          N, static_cast<int64_t>(bytes), nonblocking.median * 1e6, nonblocking.fastest * 1e6,
          bytes / nonblocking.fastest / 1e9, bus * bytes / nonblocking.fastest / 1e9, blocking.median * 1e6,
          blocking.fastest * 1e6, bytes / blocking.fastest / 1e9, bus * bytes / blocking.fastest / 1e9);
      std::fflush(stdout);
    }
  } catch (const std::exception& e) {
    dist::abort(fmt::format("allreduce_bw: {}", e.what()));
  }
  return 0;
}
