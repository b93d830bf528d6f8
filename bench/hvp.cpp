// hvp — the cost of a Hessian-vector product by double backward against the
// cost of one gradient, on a training workload's model (bench/workloads.h),
// tapegrad side of bench/compare_hvp.py. Prints one JSON line with the median
// seconds of each (the batch is random tokens: the cost does not depend on
// the text).
//
//   build/bench/hvp --workload gpt-s --threads 1
//
// gradient: forward, loss, grad() w.r.t. every parameter.
// hvp:      forward, loss, grad() with create_graph, g . v, grad() again:
//           H v for one random direction v over all parameters.
#include <algorithm>
#include <chrono>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "autograd/autograd.h"
#include "bench/workloads.h"

using namespace tg;

namespace {

template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::string workload = "gpt-s";
  int threads = 1, reps = 7;
  bool profile = false;
  int64_t vocab = 85;
  CLI::App app{"hvp: Hessian-vector product cost against one gradient, tapegrad side"};
  app.add_option("--workload", workload, "gpt-s, gpt-m, rnn or lstm")->check(CLI::IsMember({"gpt-s", "gpt-m", "rnn", "lstm"}));
  app.add_option("--threads", threads, "Threads for kernels and OpenBLAS")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "Timed repetitions (the median is reported)")->check(CLI::PositiveNumber);
  app.add_flag("--profile", profile, "Print the op profile of one Hessian-vector product");
  CLI11_PARSE(app, argc, argv);
  try {
    set_num_threads(threads);
    const bench::Workload& w = bench::workloads().at(workload);
    manual_seed(1);
    bench::Trainer trainer = bench::make_trainer(w, vocab);
    auto& model = *trainer.model;
    std::vector<Tensor> params = model.parameters();
    Generator gen(2);
    Tensor x = randint(0, vocab, {w.batch, w.model.block}, &gen), y = randint(0, vocab, {w.batch, w.model.block}, &gen);
    std::vector<Tensor> v;
    for (const Tensor& p : params) v.push_back(randn(p.shape(), p.dtype(), &gen));

    auto gradient = [&] {
      Tensor loss = model.loss(x, y);
      return grad({loss}, params);
    };
    auto hvp = [&] {
      Tensor loss = model.loss(x, y);
      std::vector<Tensor> g = grad({loss}, params, {}, {.retain_graph = true, .create_graph = true});
      Tensor gv = sum(mul(g[0], v[0]));
      for (size_t k = 1; k < g.size(); ++k) gv = add(gv, sum(mul(g[k], v[k])));
      return grad({gv}, params, {}, {.retain_graph = false, .create_graph = false, .allow_unused = true});
    };
    gradient();
    hvp();  // warm the allocator's cache
    if (profile) {
      profiler_reset();
      profiler_enable(true);
      hvp();
      profiler_enable(false);
      fmt::print("{}\n", profiler_report());
    }
    const double t_grad = median_seconds(reps, gradient);
    const double t_hvp = median_seconds(reps, hvp);
    fmt::print(
        "{{\"side\": \"tapegrad\", \"workload\": \"{}\", \"threads\": {}, \"params\": {}, \"grad_s\": {:.5f}, "
        "\"hvp_s\": {:.5f}, \"hvp_over_grad\": {:.2f}}}\n",
        workload, threads, model.num_parameters(), t_grad, t_hvp, t_hvp / t_grad);
  } catch (const std::exception& e) {
    fmt::print(stderr, "hvp: {}\n", e.what());
    return 1;
  }
  return 0;
}
