// run_cells: independent runs spread over the ranks of an MPI job.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "distributed/dist.h"
#include "examples/study/study.h"

namespace tg::study {

std::vector<size_t> deal_cells(const std::vector<double>& cost, std::vector<double>& load, double cap) {
  std::vector<size_t> order(cost.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<size_t> rank_of(cost.size(), kUndealt);
  for (size_t i : order) {
    const size_t r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    if (load[r] + cost[i] > cap) continue;
    load[r] += cost[i];
    rank_of[i] = r;
  }
  return rank_of;
}

std::vector<std::string> run_cells(const std::vector<double>& cost, const std::function<std::string(size_t)>& run) {
  std::vector<double> load(static_cast<size_t>(dist::world_size()), 0.0);
  return run_cells(deal_cells(cost, load), run);
}

std::vector<std::string> run_cells(const std::vector<size_t>& rank_of, const std::function<std::string(size_t)>& run) {
  const size_t me = static_cast<size_t>(dist::rank());
  std::vector<size_t> mine;
  for (size_t i = 0; i < rank_of.size(); ++i) {
    if (rank_of[i] == kUndealt) throw std::logic_error("run_cells: a cell was not dealt to any rank");
    if (rank_of[i] == me) mine.push_back(i);
  }
  // This rank's results as "<cell index> <length>\n<result>" records, gathered from every rank.
  std::string packed;
  for (size_t i : mine) {
    const std::string result = run(i);
    packed += fmt::format("{} {}\n{}", i, result.size(), result);
  }
  // A rank done early waits asleep (a blocking collective would spin on its
  // core, which a rank of another job, or rank 0's other work, could use).
  dist::idle_barrier();
  std::vector<std::string> out(rank_of.size());
  std::vector<bool> seen(rank_of.size(), false);
  for (const std::string& from : dist::all_gather(packed))
    for (size_t pos = 0; pos < from.size();) {
      const size_t eol = from.find('\n', pos);
      size_t i = 0, len = 0;
      if (eol == std::string::npos || std::sscanf(from.c_str() + pos, "%zu %zu", &i, &len) != 2 || i >= out.size() ||
          seen[i] || eol + 1 + len > from.size())
        throw std::runtime_error("run_cells: a rank sent a damaged result");
      out[i] = from.substr(eol + 1, len), seen[i] = true;
      pos = eol + 1 + len;
    }
  if (std::find(seen.begin(), seen.end(), false) != seen.end())
    throw std::runtime_error("run_cells: a cell's result is missing");
  return out;
}

}  // namespace tg::study
