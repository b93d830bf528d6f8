// Part 5, parallelism: how many steps of a forward (and so of its backward,
// which walks the same chain back) must run one after another, read off the
// recorded graph at each T; and training throughput at 1 and 2 threads, for
// a training batch and for one long sequence.
#include <algorithm>
#include <chrono>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "autograd/op.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "nn/nn.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

struct GraphDepth {
  int64_t sequential = 0;  // the longest chain of dependent steps
  int64_t nodes = 0;       // recorded ops
};

// The longest chain from the inputs to `out` in the recorded graph: one step
// per op, except a fused recurrence (rnn_tanh_recurrence, lstm_recurrence,
// gru_recurrence: xp (T,B,.) is input 0), which runs its T steps one after
// another inside one node. Iterative, as the graph of a long unroll is deep.
GraphDepth graph_depth(const Tensor& out) {
  std::unordered_map<const Node*, int64_t> depth;
  std::vector<std::pair<const Node*, bool>> stack = {{out.impl()->grad_fn.get(), false}};
  while (!stack.empty()) {
    auto [n, inputs_done] = stack.back();
    stack.pop_back();
    if (!n || (depth.count(n) && !inputs_done)) continue;
    if (!inputs_done) {
      stack.push_back({n, true});
      for (const Edge& e : n->edges)
        if (e.node && !depth.count(e.node.get())) stack.push_back({e.node.get(), false});
      depth[n] = -1;  // seen; its value comes when its inputs are done
      continue;
    }
    int64_t before = 0;
    for (const Edge& e : n->edges)
      if (e.node) before = std::max(before, depth.at(e.node.get()));
    const bool recurrence = n->op->name.ends_with("_recurrence");
    depth[n] = before + (recurrence ? n->edges[0].shape[0] : 1);
  }
  return {out.impl()->grad_fn ? depth.at(out.impl()->grad_fn.get()) : 0, static_cast<int64_t>(depth.size())};
}

struct Regime {
  std::string name;
  int64_t B, T;
};

}  // namespace

PartOutput run_parallel(Study& s) {
  const Config& c = s.c;
  std::vector<int64_t> lengths = c.cost_lengths;
  std::sort(lengths.begin(), lengths.end());
  const int64_t max_T = lengths.back();
  const std::vector<Regime> regimes = {{fmt::format("batch {} x {}", c.batch, c.block), c.batch, c.block},
                                       {fmt::format("one sequence of {}", max_T), 1, max_T}};
  const int threads_before = num_threads();
  fmt::print("parallel: sequential steps of a forward at T = {}; training steps (forward, backward, AdamW) at 1 and 2 "
             "threads, {} timed pairs, median and quartiles\n", fmt::join(lengths, ", "), c.parallel_steps);

  const std::string dtype = part_dtype(c, "parallel");
  std::string steps_csv = "model,T,sequential_steps,graph_nodes\n",
              tput_csv = "model,regime,batch,T,threads,tokens_per_s,tokens_per_s_q1,tokens_per_s_q3,dtype\n",
              speedup_csv = "model,regime,speedup,speedup_q1,speedup_q3,pairs\n";
  Panel steps_panel{.title = "steps that must run one after another (forward; backward the same)",
                    .xlabel = "context length T", .ylabel = "sequential steps", .logx = true, .logy = true, .xbase = 2,
                    .key = "top left"};
  Panel tput_panel{.title = fmt::format("training throughput, median and quartiles (load average {} when this part began)",
                                            load_average()),
                   .xlabel = "threads", .ylabel = "tokens per second", .logy = true, .xtics = {1, 2},
                   .key = "outside right top"};
  report::Table steps_table{{"model"}, {}},
      tput_table{{"model", "regime", "tok/s 1 thread", "tok/s 2 threads", "speedup (quartiles)"}, {}};
  for (int64_t T : lengths) steps_table.header.push_back(fmt::format("T={}", T));
  std::string summary;
  report::Progress bar("parallel", static_cast<int64_t>(c.models.size() * (1 + regimes.size())), "parts");
  int64_t done = 0;
  for (const std::string& kind : c.models) {
    auto m = make_model(c, kind, kCharVocab, max_T, c.seed, models::PositionKind::sinusoidal);
    std::vector<std::string> steps_row = {kind};
    Series steps{kind, {}, {}, kind};
    GraphDepth first, last;
    for (int64_t T : lengths) {
      Generator g(c.seed + 7);
      std::vector<int64_t> ids(T);
      for (auto& i : ids) i = g.randint(0, kCharVocab);
      const Tensor x = from_vector(ids, {1, T});
      Tensor loss = m->loss(x, x);  // the graph's shape is all that is read
      GraphDepth d = graph_depth(loss);
      steps_csv += fmt::format("{},{},{},{}\n", kind, T, d.sequential, d.nodes);
      steps.x.push_back(static_cast<double>(T)), steps.y.push_back(static_cast<double>(d.sequential));
      steps_row.push_back(std::to_string(d.sequential));
      if (T == lengths.front()) first = d;
      last = d;
    }
    steps_table.rows.push_back(steps_row);
    steps_panel.series.push_back(steps);
    ++done;
    bar.update(done, static_cast<double>(done), kind + " graph");

    nn::AdamW opt(nn::weight_decay_groups(*m, 0.01), nn::AdamWOptions{.lr = 1e-4});
    for (size_t ri = 0; ri < regimes.size(); ++ri) {
      const Regime& r = regimes[ri];
      Generator g(c.seed + 8);
      std::vector<int64_t> ids(r.B * (r.T + 1));
      for (auto& i : ids) i = g.randint(0, kCharVocab);
      const Tensor all = from_vector(ids, {r.B, r.T + 1});
      const Tensor x = all.narrow(1, 0, r.T).contiguous(), y = all.narrow(1, 1, r.T).contiguous();
      auto step_seconds = [&](int n) {
        set_num_threads(n);
        const auto t0 = std::chrono::steady_clock::now();
        Tensor loss;
        {
          AutocastGuard autocast(gemm_precision(c));  // forward and loss; the backward follows
          loss = m->loss(x, y);
        }
        loss.backward();
        opt.step();
        opt.zero_grad();
        return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      };
      step_seconds(1), step_seconds(2);  // warm-up: the allocator's cache, the thread pool
      // Steps at 1 and 2 threads in pairs, one right after the other, so that
      // each pair's ratio is one speedup measured under the same conditions.
      const double tok = static_cast<double>(r.B * r.T);
      std::vector<double> r1, r2, speedups;
      for (int64_t i = 0; i < c.parallel_steps; ++i) {
        const double a = step_seconds(1), b = step_seconds(2);
        r1.push_back(tok / a), r2.push_back(tok / b), speedups.push_back(a / b);
      }
      const Spread q1 = spread(r1), q2 = spread(r2), sp = spread(speedups);
      tput_csv += fmt::format("{},{},{},{},1,{:.1f},{:.1f},{:.1f},{}\n{},{},{},{},2,{:.1f},{:.1f},{:.1f},{}\n", kind,
                              r.name, r.B, r.T, q1.median, q1.q1, q1.q3, dtype, kind, r.name, r.B, r.T, q2.median,
                              q2.q1, q2.q3, dtype);
      speedup_csv += fmt::format("{},{},{:.4f},{:.4f},{:.4f},{}\n", kind, r.name, sp.median, sp.q1, sp.q3,
                                 c.parallel_steps);
      const double s1 = q1.median, s2 = q2.median;
      tput_table.rows.push_back({kind, r.name, report::format_count(s1), report::format_count(s2),
                                 fmt::format("{:.2f} ({:.2f}-{:.2f})", sp.median, sp.q1, sp.q3)});
      tput_panel.series.push_back({fmt::format("{}, {}", kind, r.name), {1, 2}, {s1, s2}, kind,
                                   ri == 0 ? Series::linepoints : Series::dashed, {q1.q1, q2.q1}, {q1.q3, q2.q3}});
      if (ri == 0) summary += fmt::format("{}{} {}->{} steps, x{:.2f} at 2 threads", summary.empty() ? "" : "; ", kind,
                                          first.sequential, last.sequential, sp.median);
      ++done;
      bar.update(done, static_cast<double>(done), kind + " " + r.name);
    }
  }
  set_num_threads(threads_before);
  bar.finish("");
  report::write_file(s.path("steps.csv"), steps_csv);
  report::write_file(s.path("parallel.csv"), tput_csv);
  report::write_file(s.path("speedup.csv"), speedup_csv);
  if (std::string why = plot(s.path("parallel.png"), {steps_panel, tput_panel}, 1300, 500); !why.empty())
    fmt::print("parallel: no plot: {}\n", why);
  fmt::print("\nsequential steps of a forward:\n{}\ntraining throughput:\n{}", steps_table.text(), tput_table.text());
  std::string md = fmt::format(
      "*Sequential steps*: the longest chain of ops in the recorded graph of one forward (one sequence), a fused "
      "recurrence counting its T time steps; the backward runs the same chain in reverse. *tok/s*: training steps "
      "(forward, backward, AdamW), {} pairs of one step at 1 thread and one at 2, the median of each; the speedup is "
      "the median of the pairs' ratios, with its quartiles. The models are part 2's "
      "(GPT with fixed positions, so it takes any T up to {}).\n\nSequential steps of a forward:\n\n{}\nTraining "
      "throughput:\n\n{}\n![parallel](parallel.png)\n",
      c.parallel_steps, max_T, steps_table.markdown(), tput_table.markdown());
  return {summary, md};
}

}  // namespace tg::study
