// hvp — the cost of a Hessian-vector product, in both orders, against the
// cost of one gradient, and of a Jacobian-vector product against one
// forward, on a training workload's model (bench/workloads.h); tapegrad side
// of bench/compare_hvp.py. Prints one JSON line with the median seconds of
// each and the peak memory of each HVP (the batch is random tokens: the cost
// does not depend on the text).
//
//   build/bench/hvp --workload gpt-s --threads 1
//
// gradient:   forward, loss, grad() w.r.t. every parameter.
// hvp:        reverse over reverse: forward, loss, grad() with create_graph,
//             g . v, grad() again: H v for one random direction v over all
//             parameters.
// fwd_hvp:    forward over reverse, tg::hvp: the tangent along v of the
//             gradient computed with create_graph.
// forward:    the loss alone, under no_grad.
// jvp:        tg::jvp of the loss along v: the loss and its directional derivative.
// Before timing, the two HVPs are compared (max relative difference).
#include <algorithm>
#include <chrono>
#include <functional>

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
  app.add_flag("--profile", profile, "Print the op profile of one Hessian-vector product in each order, of one forward and of one jvp");
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
    auto loss_fn = [&](const std::vector<Tensor>&) { return std::vector<Tensor>{model.loss(x, y)}; };
    auto fwd_hvp = [&] { return tg::hvp(loss_fn, params, v).hvp; };
    auto forward = [&] {
      NoGradGuard no_grad;
      return model.loss(x, y);
    };
    auto jvp = [&] { return tg::jvp(loss_fn, params, v).tangents; };
    auto hvp = [&] {
      Tensor loss = model.loss(x, y);
      std::vector<Tensor> g = grad({loss}, params, {}, {.retain_graph = true, .create_graph = true});
      Tensor gv = sum(mul(g[0], v[0]));
      for (size_t k = 1; k < g.size(); ++k) gv = add(gv, sum(mul(g[k], v[k])));
      return grad({gv}, params, {}, {.retain_graph = false, .create_graph = false, .allow_unused = true});
    };
    gradient();
    // Validate before timing: both orders give the same H v.
    const std::vector<Tensor> rev = hvp(), fwd = fwd_hvp();
    double diff = 0, scale = 0;
    for (size_t k = 0; k < rev.size(); ++k) {
      if (!rev[k].defined()) continue;
      diff = std::max(diff, max(abs(sub(rev[k], fwd[k]))).item());
      scale = std::max(scale, max(abs(rev[k])).item());
    }
    // Peak memory of one product in each order, above what is held before it.
    auto peak_mib = [](auto&& f) {
      const size_t before = memory_stats().bytes_in_use;
      reset_peak_memory_stats();
      f();
      return static_cast<double>(memory_stats().peak_bytes_in_use - before) / (1 << 20);
    };
    const double rev_peak = peak_mib(hvp), fwd_peak = peak_mib(fwd_hvp);
    jvp();
    if (profile) {
      auto plain_forward = [&] { return std::vector<Tensor>{forward()}; };
      for (const auto& [name, product] : {std::pair<const char*, std::function<std::vector<Tensor>()>>{"reverse over reverse", hvp},
                                          {"forward over reverse", fwd_hvp}, {"forward (no_grad)", plain_forward},
                                          {"jvp", jvp}}) {
        profiler_reset();
        profiler_enable(true);
        product();
        profiler_enable(false);
        fmt::print("{}:\n{}\n", name, profiler_report());
      }
    }
    const double t_grad = median_seconds(reps, gradient);
    const double t_hvp = median_seconds(reps, hvp);
    const double t_fwd_hvp = median_seconds(reps, fwd_hvp);
    const double t_forward = median_seconds(reps, forward);
    const double t_jvp = median_seconds(reps, jvp);
    fmt::print(
        "{{\"side\": \"tapegrad\", \"workload\": \"{}\", \"threads\": {}, \"params\": {}, \"grad_s\": {:.5f}, "
        "\"hvp_s\": {:.5f}, \"hvp_over_grad\": {:.2f}, \"fwd_hvp_s\": {:.5f}, \"fwd_hvp_over_grad\": {:.2f}, "
        "\"hvp_rel_diff\": {:.3g}, \"hvp_peak_mib\": {:.1f}, \"fwd_hvp_peak_mib\": {:.1f}, \"forward_s\": {:.5f}, "
        "\"jvp_s\": {:.5f}, \"jvp_over_forward\": {:.2f}}}\n",
        workload, threads, model.num_parameters(), t_grad, t_hvp, t_hvp / t_grad, t_fwd_hvp, t_fwd_hvp / t_grad,
        diff / scale, rev_peak, fwd_peak, t_forward, t_jvp, t_jvp / t_forward);
  } catch (const std::exception& e) {
    fmt::print(stderr, "hvp: {}\n", e.what());
    return 1;
  }
  return 0;
}
