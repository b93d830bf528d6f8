// Part 2, cost against context length: time per token and peak tensor memory
// of a forward and a backward at T from 32 to 1024, measured, and the time
// predicted from the FLOP counts; where attention's n^2 d term overtakes the
// n d^2 terms, and where GPT's cost overtakes the recurrences'. Each is
// measured again with activation checkpointing (every GPT block; the RNN's
// recurrence over chunks of sqrt(T) steps; the LSTM's gates rebuilt in
// backward): the memory it saves and the time it costs.
//
// FLOP counts per token (a multiply-add is 2 FLOPs; GEMMs only):
//   recurrent (G gates: 1 RNN, 3 GRU, 4 LSTM; E embedding, H hidden, V vocabulary)
//     forward  2 G H (E + H) + 2 H V     input projection, recurrence, head
//     backward twice the forward          (input and weight gradients of each GEMM)
//   GPT (L blocks of width C)
//     forward  L (24 C^2 + 4 T C) + 2 C V  qkv 6C^2, proj 2C^2, MLP 16C^2; q k^T and P v 2TC each
//     backward L (48 C^2 + 10 T C) + 4 C V the attention backward recomputes q k^T, then four GEMMs
// So per layer and sequence the d^2 terms are n d^2 and attention's is n^2 d,
// as the claim says; attention's term is the larger from T = 72 C / 14 on.
#include <algorithm>
#include <chrono>
#include <cmath>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "models/rnn_lm.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

struct Flops {
  double fwd = 0, bwd = 0;  // per token
  double attention = 0;     // of fwd + bwd, attention's n^2 d terms (q k^T, P v and their backward)
};

Flops flops_per_token(const models::LanguageModel& m, int64_t T) {
  if (auto* g = dynamic_cast<const models::GPT*>(&m)) {
    const double C = static_cast<double>(g->options.dim), L = static_cast<double>(g->options.layers);
    const double V = static_cast<double>(g->options.vocab), n = static_cast<double>(T);
    return {L * (24 * C * C + 4 * n * C) + 2 * C * V, L * (48 * C * C + 10 * n * C) + 4 * C * V, L * 14 * n * C};
  }
  const auto& o = dynamic_cast<const models::RNNLM&>(m).options;
  const double G = o.cell == models::CellKind::lstm ? 4 : o.cell == models::CellKind::gru ? 3 : 1;
  const double H = static_cast<double>(o.hidden), E = static_cast<double>(o.embed), V = static_cast<double>(o.vocab);
  const double fwd = 2 * G * H * (E + H) + 2 * H * V;
  return {fwd, 2 * fwd, 0};
}

struct Measurement {
  int64_t B = 0, T = 0;
  // Microseconds per token, medians over the repetitions; tensor memory above what was in use before.
  double fwd_us = 0, bwd_us = 0, fwd_mib = 0, step_mib = 0;
  Spread step_us;  // forward + backward, microseconds per token: median and quartiles over the repetitions
  Flops flops;
};

// A random batch of B sequences of T tokens and their targets.
std::pair<Tensor, Tensor> random_batch(int64_t B, int64_t T, uint64_t seed) {
  Generator gen(seed);
  std::vector<int64_t> ids(B * T), targets(B * T);
  for (auto& i : ids) i = gen.randint(0, kCharVocab);
  for (auto& i : targets) i = gen.randint(0, kCharVocab);
  return {from_vector(ids, {B, T}), from_vector(targets, {B, T})};
}

// One forward and backward of m on (x, y), into r's samples: microseconds per
// token of each, and the peaks of tensor memory above what was in use before.
// The forward records at `precision`, and its backward follows (autocast.h).
struct Samples {
  std::vector<double> fwd, bwd;
  double fwd_mib = 0, step_mib = 0;
};
void time_step(models::LanguageModel& m, const Tensor& x, const Tensor& y, DType precision, Samples& r) {
  const double tokens = static_cast<double>(x.numel());
  m.zero_grad();
  const double base = static_cast<double>(memory_stats().bytes_in_use);
  reset_peak_memory_stats();
  const auto t0 = std::chrono::steady_clock::now();
  Tensor loss;
  {
    AutocastGuard autocast(precision);
    loss = m.loss(x, y);
  }
  const auto t1 = std::chrono::steady_clock::now();
  r.fwd_mib = (memory_stats().peak_bytes_in_use - base) / 1048576.0;
  loss.backward();
  const auto t2 = std::chrono::steady_clock::now();
  r.step_mib = (memory_stats().peak_bytes_in_use - base) / 1048576.0;
  m.zero_grad();
  r.fwd.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / tokens);
  r.bwd.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count() / tokens);
}

Measurement summarise(const models::LanguageModel& m, int64_t B, int64_t T, const Samples& r) {
  std::vector<double> step;
  for (size_t i = 0; i < r.fwd.size(); ++i) step.push_back(r.fwd[i] + r.bwd[i]);
  return {.B = B, .T = T, .fwd_us = spread(r.fwd).median, .bwd_us = spread(r.bwd).median, .fwd_mib = r.fwd_mib,
          .step_mib = r.step_mib, .step_us = spread(step), .flops = flops_per_token(m, T)};
}

// Activation checkpointing on or off in m (GPTOptions::checkpoint_blocks,
// RNNLMOptions::checkpoint_time). The same weights either way.
void set_checkpointing(models::LanguageModel& m, bool on) {
  if (auto* g = dynamic_cast<models::GPT*>(&m))
    g->options.checkpoint_blocks = on ? 1 : 0;
  else
    dynamic_cast<models::RNNLM&>(m).options.checkpoint_time = on;
}

}  // namespace

PartOutput run_cost(Study& s) {
  const Config& c = s.c;
  std::vector<int64_t> lengths = c.cost_lengths;
  std::sort(lengths.begin(), lengths.end());
  const int64_t max_T = lengths.back();
  std::vector<double> xs(lengths.begin(), lengths.end());
  fmt::print("cost: forward + backward of a batch of {} tokens (that / T sequences), T = {}; GPT with fixed (sinusoidal) positions so "
             "its parameter count does not depend on T; medians of {} timed repetitions; {} threads\n",
             c.cost_tokens, fmt::join(lengths, ", "), c.cost_reps, num_threads());

  const std::string dtype = part_dtype(c, "cost");
  std::string csv = "model,T,batch,fwd_us_per_token,bwd_us_per_token,pred_fwd_us_per_token,pred_bwd_us_per_token,"
                    "step_us_q1,step_us_q3,fwd_flops_per_token,bwd_flops_per_token,attention_flops_per_token,fwd_mib,"
                    "step_mib,ckpt_fwd_us_per_token,ckpt_bwd_us_per_token,ckpt_step_mib,dtype\n";
  report::Table table{{"model", "T", "B", "fwd us/tok", "bwd us/tok", "fwd+bwd quartiles", "predicted fwd",
                       "predicted bwd", "GFLOP/s",
                         "fwd MiB", "fwd+bwd MiB", "checkpointed us/tok", "checkpointed MiB"}, {}};
  // Dashed is checkpointed in both panels; every series is in a legend.
  Panel time_panel{.title = "time per token, forward + backward",
                   .xlabel = "context length T", .ylabel = "microseconds per token", .logx = true, .logy = true, .xbase = 2,
                   .key = "above vertical maxrows 3"};
  // Flat when the work per batch is fixed: attention keeps no (T,T) matrix for
  // its backward (it recomputes the probabilities), so nothing grows with T.
  Panel mem_panel{.title = "peak tensor memory of a step",
                  .xlabel = "context length T",
                  .ylabel = fmt::format("MiB (batch of {} tokens)", c.cost_tokens), .logx = true, .xbase = 2,
                  .key = "above vertical maxrows 3"};
  std::map<std::string, std::vector<double>> total_us, total_flops;
  double attention_crossover = 0;
  report::Progress bar("cost", static_cast<int64_t>(c.models.size() * (c.cost_reps + 1)), "rounds");
  int64_t done = 0;
  for (const std::string& kind : c.models) {
    auto m = make_model(c, kind, kCharVocab, max_T, c.seed, models::PositionKind::sinusoidal);
    if (auto* g = dynamic_cast<models::GPT*>(m.get())) attention_crossover = 72.0 * g->options.dim / 14.0;
    // Every T, plain and checkpointed, once per round: a burst of load on the
    // machine then slows one repetition of many cells, which their medians
    // and quartiles shrug off, rather than every repetition of one cell.
    // Round 0 warms the allocator's cache up and is not counted.
    std::vector<std::pair<Tensor, Tensor>> batches;
    for (int64_t T : lengths) batches.push_back(random_batch(std::max<int64_t>(1, c.cost_tokens / T), T, c.seed + 3));
    std::vector<Samples> plain(lengths.size()), ckpt(lengths.size());
    Samples warm;
    for (int64_t rep = 0; rep <= c.cost_reps; ++rep) {
      for (size_t i = 0; i < lengths.size(); ++i) {
        const auto& [x, y] = batches[i];
        time_step(*m, x, y, gemm_precision(c), rep == 0 ? warm : plain[i]);
        set_checkpointing(*m, true);
        time_step(*m, x, y, gemm_precision(c), rep == 0 ? warm : ckpt[i]);
        set_checkpointing(*m, false);
      }
      ++done;
      bar.update(done, static_cast<double>(done), fmt::format("{} round {}", kind, rep));
    }
    std::vector<Measurement> ms, checkpointed;
    for (size_t i = 0; i < lengths.size(); ++i) {
      const int64_t B = batches[i].first.size(0), T = lengths[i];
      ms.push_back(summarise(*m, B, T, plain[i]));
      checkpointed.push_back(summarise(*m, B, T, ckpt[i]));
    }
    // Predicted: the measured time at the shortest T, scaled by the FLOP counts.
    const Measurement& first = ms.front();
    Series measured{kind, {}, {}, kind, Series::points}, predicted{kind + ", predicted from FLOPs", {}, {}, kind, Series::line};
    Series memory{kind, {}, {}, kind}, ckpt_memory{kind + ", checkpointed", {}, {}, kind, Series::dashed};
    Series ckpt_time{kind + ", checkpointed", {}, {}, kind, Series::dashed};
    for (size_t i = 0; i < ms.size(); ++i) {
      const Measurement& r = ms[i];
      const Measurement& ck = checkpointed[i];
      const double pf = first.fwd_us * r.flops.fwd / first.flops.fwd, pb = first.bwd_us * r.flops.bwd / first.flops.bwd;
      csv += fmt::format(
          "{},{},{},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{:.5f},{:.0f},{:.0f},{:.0f},{:.3f},{:.3f},{:.5f},{:.5f},{:.3f},{}\n", kind,
          r.T, r.B, r.fwd_us, r.bwd_us, pf, pb, r.step_us.q1, r.step_us.q3, r.flops.fwd, r.flops.bwd, r.flops.attention,
          r.fwd_mib, r.step_mib, ck.fwd_us, ck.bwd_us, ck.step_mib, dtype);
      table.rows.push_back({kind, std::to_string(r.T), std::to_string(r.B), fmt::format("{:.2f}", r.fwd_us), fmt::format("{:.2f}", r.bwd_us),
                            fmt::format("{:.2f}-{:.2f}", r.step_us.q1, r.step_us.q3),
                            fmt::format("{:.2f}", pf), fmt::format("{:.2f}", pb),
                            fmt::format("{:.1f}", (r.flops.fwd + r.flops.bwd) / (r.fwd_us + r.bwd_us) / 1e3),
                            fmt::format("{:.1f}", r.fwd_mib), fmt::format("{:.1f}", r.step_mib),
                            fmt::format("{:.2f}", ck.fwd_us + ck.bwd_us), fmt::format("{:.1f}", ck.step_mib)});
      measured.x.push_back(static_cast<double>(r.T)), measured.y.push_back(r.fwd_us + r.bwd_us);
      measured.ylo.push_back(r.step_us.q1), measured.yhi.push_back(r.step_us.q3);
      predicted.x.push_back(static_cast<double>(r.T)), predicted.y.push_back(pf + pb);
      memory.x.push_back(static_cast<double>(r.T)), memory.y.push_back(r.step_mib);
      ckpt_memory.x.push_back(static_cast<double>(r.T)), ckpt_memory.y.push_back(ck.step_mib);
      ckpt_time.x.push_back(static_cast<double>(r.T)), ckpt_time.y.push_back(ck.fwd_us + ck.bwd_us);
      total_us[kind].push_back(r.fwd_us + r.bwd_us);
      total_flops[kind].push_back(r.flops.fwd + r.flops.bwd);
    }
    time_panel.series.push_back(measured);
    time_panel.series.push_back(predicted);
    time_panel.series.push_back(ckpt_time);
    mem_panel.series.push_back(memory);
    mem_panel.series.push_back(ckpt_memory);
  }
  bar.finish("");
  std::string crossings;
  if (attention_crossover > 0) {
    time_panel.markers.push_back({attention_crossover, fmt::format("GPT: n^2 d = n d^2 terms (T={:.0f})", attention_crossover)});
    if (attention_crossover > max_T)
      time_panel.xlabel += fmt::format(" (GPT's n^2 d term passes its n d^2 terms at T={:.0f})", attention_crossover);
    crossings += fmt::format("In GPT's FLOP count attention's n²·d term equals the n·d² terms at T = 72·C/14 = {:.0f}.",
                             attention_crossover);
    for (const std::string& kind : c.models) {
      if (kind == "gpt" || !total_us.count("gpt")) continue;
      auto measured = crossing(xs, total_us["gpt"], total_us[kind]);
      auto by_flops = crossing(xs, total_flops["gpt"], total_flops[kind]);
      if (measured) time_panel.markers.push_back({*measured, fmt::format("GPT dearer than {} (T={:.0f})", kind, *measured)});
      auto says = [&](const std::optional<double>& x, const std::vector<double>& g, const std::vector<double>& r) {
        if (x) return fmt::format("from T ≈ {:.0f}", *x);
        return g.front() > r.front() ? std::string("at every T measured") : fmt::format("at no T up to {}", max_T);
      };
      crossings += fmt::format(" GPT costs more per token than the {}: in time {}, in FLOPs {}.", kind,
                               says(measured, total_us["gpt"], total_us[kind]),
                               says(by_flops, total_flops["gpt"], total_flops[kind]));
    }
  }
  report::write_file(s.path("cost.csv"), csv);
  std::string why = plot(s.path("cost.png"), {time_panel, mem_panel}, 1400, 600);
  if (!why.empty()) fmt::print("cost: no plot: {}\n", why);
  fmt::print("\n{}\n{}\n", table.text(), crossings);

  std::string md = fmt::format(
      "Forward and backward of a batch of {} random tokens at each T ({} / T sequences: a fixed token budget per step, "
      "as in training; no optimizer step), {} threads, medians of {} "
      "repetitions (quartiles of forward + backward in the table and as the plot's bars); microseconds per token. *predicted* scales the time measured at T = {} by the model's FLOP count "
      "(see examples/study/cost.cpp). Memory is the peak of tensor memory above what was in use before the forward "
      "(activations kept for backward, gradients, temporaries). It does not grow with T for GPT either: this library's "
      "attention saves only q, k and v for its backward and recomputes the (T, T) probabilities there, a block of "
      "query rows at a time in a per-thread scratch (at most 1 MiB) that is not tensor memory. The recurrences' FLOPs per token do not "
      "depend on T, yet their time grows: at a fixed token budget a longer T means fewer sequences, so each of the T "
      "sequential steps multiplies a narrower (B, H) matrix, which runs at fewer GFLOP/s. *checkpointed* (dashed in the plot) is the same "
      "step with activation checkpointing (the models' checkpoint options): every GPT block keeps only its input and "
      "backward reruns it (tg::checkpoint); the RNN keeps the input and entering state of each chunk of ceil(sqrt(T)) "
      "steps and reruns the chunk; the LSTM keeps its hidden states but not its gates, which backward rebuilds chunk by "
      "chunk with one GEMM over the chunk's steps.\n\n{}\n{}\n\n![cost](cost.png)\n",
      c.cost_tokens, c.cost_tokens, num_threads(), c.cost_reps, lengths.front(), table.markdown(), crossings);
  std::string summary;
  for (const std::string& kind : c.models)
    summary += fmt::format("{}{} x{:.1f} per token from T={} to {}", summary.empty() ? "" : "; ", kind,
                           total_us[kind].back() / total_us[kind].front(), lengths.front(), max_T);
  return {summary, md};
}

}  // namespace tg::study
