// Part 3, long-range dependencies, two ways:
//  - a synthetic recall task: one key among distractors, to be named at every
//    later position; accuracy k positions after the key, for each k;
//  - real text: part 1's models' validation loss on the same characters
//    given 1, 2, 4, ... block characters of their true context (the rest of
//    the window from elsewhere in the text), i.e. how much each gains from
//    seeing more of the past.
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/tokenizer.h"
#include "examples/study/fit.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"
#include "report/progress.h"
#include "report/report.h"

namespace tg::study {
namespace {

// Ids 0..7 are keys, 8..15 distractors.
constexpr int64_t kKeys = 8, kDistractors = 8, kRecallVocab = kKeys + kDistractors;

// B sequences of length L: distractors and one key, at position p. From p on
// the model must name the key: the target at every later position t is the
// key (recalled across t - p positions), before that none (-100, ignored).
// k = 0 draws p uniformly from [0, L-2] per sequence, so every distance up to
// L-1 is trained at once; k > 0 puts the key k positions before the last.
data::LMBatch recall_batch(int64_t B, int64_t L, int64_t k, Generator& g) {
  std::vector<int64_t> ids(B * L), targets(B * L, -100);
  for (int64_t b = 0; b < B; ++b) {
    int64_t* row = ids.data() + b * L;
    for (int64_t t = 0; t < L; ++t) row[t] = kKeys + g.randint(0, kDistractors);
    const int64_t p = k > 0 ? L - 1 - k : g.randint(0, L - 1), key = g.randint(0, kKeys);
    row[p] = key;
    std::fill(targets.begin() + b * L + p + 1, targets.begin() + (b + 1) * L, key);
  }
  return {from_vector(ids, {B, L}), from_vector(targets, {B, L})};
}

// Distances tested: powers of two below L, 3L/4 and L-1.
std::vector<int64_t> test_distances(int64_t L) {
  std::vector<int64_t> ks;
  for (int64_t k = 1; k < L - 1; k *= 2) ks.push_back(k);
  if (3 * L / 4 > ks.back() && 3 * L / 4 < L - 1) ks.push_back(3 * L / 4);
  ks.push_back(L - 1);
  return ks;
}

// Accuracy at the last position of sequences whose key is k positions before it.
double accuracy(models::LanguageModel& m, int64_t L, int64_t k, int64_t n, uint64_t seed) {
  NoGradGuard no_grad;
  m.eval();
  Generator g(seed + static_cast<uint64_t>(k));
  int64_t right = 0;
  for (int64_t done = 0; done < n;) {
    const int64_t B = std::min<int64_t>(100, n - done);
    data::LMBatch b = recall_batch(B, L, k, g);
    std::vector<int64_t> guess = argmax(m.forward(b.inputs).select(1, L - 1), 1).to_vector<int64_t>();
    std::vector<int64_t> key = b.targets.select(1, L - 1).contiguous().to_vector<int64_t>();
    for (int64_t i = 0; i < B; ++i) right += guess[i] == key[i];
    done += B;
  }
  return static_cast<double>(right) / static_cast<double>(n);
}

// Context lengths scored on real text: powers of two below block, and block.
std::vector<int64_t> context_lengths(int64_t block) {
  std::vector<int64_t> ts;
  for (int64_t t = 1; t < block; t *= 2) ts.push_back(t);
  ts.push_back(block);
  return ts;
}

// Index in contexts of block/16 (or the nearest below): the short context
// whose loss the gain is measured from.
size_t context_gain_from(const std::vector<int64_t>& contexts, int64_t block) {
  size_t i = 0;
  while (i + 1 < contexts.size() && contexts[i + 1] <= std::max<int64_t>(1, block / 16)) ++i;
  return i;
}

}  // namespace

double loss_given_context(models::LanguageModel& m, const std::vector<int64_t>& ids, int64_t t, int64_t block,
                          int64_t n) {
  NoGradGuard no_grad;
  m.eval();
  const int64_t span = static_cast<int64_t>(ids.size()) - block;
  double total = 0;
  for (int64_t first = 0; first < n;) {
    const int64_t B = std::min<int64_t>(64, n - first);
    std::vector<int64_t> window(B * block), target(B);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t at = (first + b) * span / n;
      const int64_t p = block + at, elsewhere = block + (at + span / 2) % span;  // the target's index; half the ids away
      int64_t* w = window.data() + b * block;
      std::copy(ids.begin() + elsewhere - block, ids.begin() + elsewhere - t, w);  // block - t unrelated ids
      std::copy(ids.begin() + p - t, ids.begin() + p, w + (block - t));          // then the t before the target
      target[b] = ids[p];
    }
    const Tensor last = m.forward(from_vector(window, {B, block})).select(1, block - 1);  // (B,V)
    total += cross_entropy(last, from_vector(target, {B}), -100, 0.0, Reduction::sum).item();
    first += B;
  }
  return total / static_cast<double>(n);
}

PartOutput run_recall(Study& s) {
  const Config& c = s.c;
  const int64_t L = c.recall_length;
  const std::vector<int64_t> ks = test_distances(L);
  // Part 1's files, before minutes of training: the second half needs them.
  const std::string tokenizer_path = from_tuning(s, "tokenizer.json");
  for (const std::string& kind : c.models)
    for (int64_t i = 0; i < c.seeds; ++i) from_tuning(s, model_file(kind, i));
  fmt::print("recall: sequences of {} tokens, a key (1 of {}) among distractors (1 of {}), to be named at every later "
             "position; {} steps x {} sequences per model at each learning rate of {}, the best kept; then part 1's "
             "models scored by position on the validation text\n",
             L, kKeys, kDistractors, c.recall_steps, c.recall_batch, fmt::join(c.lrs, ", "));

  // --- the synthetic task
  const std::string dtype = part_dtype(c, "recall");  // of the task's training; the scoring is float32
  std::string recall_csv = "model,seed,k,accuracy,tests,chance,dtype\n";
  report::Table recall_table{{"model", "lr"}, {}};
  for (int64_t k : ks) recall_table.header.push_back(fmt::format("k={}", k));
  Panel recall_panel{.title = fmt::format("recall of a key k tokens back (sequences of {})", L), .xlabel = "distance k",
                     .ylabel = "accuracy k positions after the key", .logx = true, .xbase = 2, .ymin = 0, .ymax = 1.05};
  recall_panel.hline = 1.0 / kKeys;
  recall_panel.hline_label = "chance";
  recall_panel.key = "center right";
  std::string recall_summary;
  std::string sweep_csv = "model,lr,steps,val_loss,chosen,dtype\n";
  Generator val_gen(c.seed + 4);
  const data::LMBatch val = recall_batch(256, L, 0, val_gen);  // every distance, as in training
  auto loss = [](models::LanguageModel& m, const data::LMBatch& b) { return m.loss(b.inputs, b.targets); };
  for (const std::string& kind : c.models) {
    // Run i of the seeds at learning rate lr: its own initialisation and batches.
    auto train_one = [&](double lr, int64_t i, double& val_loss) {
      auto m = make_model(c, kind, kRecallVocab, L, run_seed(c, i));
      TrainSpec spec{.label = fmt::format("{} recall lr {}{}", kind, format_lr(lr), i ? fmt::format(" seed {}", i) : ""),
                     .precision = gemm_precision(c), .lr = lr, .steps = c.recall_steps,
                     .warmup = std::max<int64_t>(1, c.recall_steps / 10), .eval_every = std::max<int64_t>(1, c.recall_steps / 4),
                     .tokens_per_step = c.recall_batch * L, .seed = run_seed(c, i) + 5};
      auto next = [&](Generator& g) { return recall_batch(c.recall_batch, L, 0, g); };
      val_loss = train(*m, spec, next, loss, [&] {
        NoGradGuard no_grad;
        m->eval();
        return loss(*m, val).item();
      }).curve.back().val_loss;
      return m;
    };
    // Learning on this task comes suddenly after a plateau, so a short sweep
    // cannot tell the rates apart: every rate gets the full run from the
    // first seed, the best is kept, and the other seeds train at its rate.
    std::map<double, std::shared_ptr<models::LanguageModel>> trained;  // by learning rate
    const Sweep sw = sweep_lr(c.lrs, [&](double lr) {
      double v = 0;
      trained[lr] = train_one(lr, 0, v);
      return v;
    });
    const double lr = sw.lrs[sw.best];
    std::vector<std::shared_ptr<models::LanguageModel>> runs = {trained.at(lr)};
    for (int64_t i = 1; i < c.seeds; ++i) {
      double v = 0;
      runs.push_back(train_one(lr, i, v));
    }
    for (size_t i = 0; i < sw.lrs.size(); ++i)
      sweep_csv += fmt::format("{},{},{},{:.6f},{},{}\n", kind, sw.lrs[i], c.recall_steps, sw.losses[i],
                               i == sw.best ? 1 : 0, dtype);
    Series acc{kind, {}, {}, kind};
    std::vector<std::string> row = {kind, format_lr(lr)};
    for (int64_t k : ks) {
      std::vector<double> by_seed;
      for (int64_t i = 0; i < c.seeds; ++i) {
        const double a = accuracy(*runs[i], L, k, c.recall_tests, c.seed + 6);
        recall_csv += fmt::format("{},{},{},{:.4f},{},{:.4f},{}\n", kind, run_seed(c, i), k, a, c.recall_tests,
                                  1.0 / kKeys, dtype);
        by_seed.push_back(a);
      }
      const Range a = range_of(by_seed);
      row.push_back(format_range(a, 2));
      acc.x.push_back(static_cast<double>(k)), acc.y.push_back(a.mean), acc.ylo.push_back(a.lo), acc.yhi.push_back(a.hi);
    }
    recall_summary += fmt::format("{}{} {:.2f}@k={} {:.2f}@k={}", recall_summary.empty() ? "" : ", ", kind,
                                  acc.y.front(), ks.front(), acc.y.back(), ks.back());
    recall_table.rows.push_back(row);
    recall_panel.series.push_back(acc);
  }
  report::write_file(s.path("recall.csv"), recall_csv);
  report::write_file(s.path("recall_sweep.csv"), sweep_csv);

  // --- real text: the same characters scored with more and more context, part 1's models
  const auto tok = data::load_tokenizer(tokenizer_path);
  const Text& text = s.text();
  const std::vector<int64_t> val_ids = tok->encode(text.val);
  const std::vector<int64_t> contexts = context_lengths(c.block);
  const int64_t n_targets = c.context_batches * c.batch;
  if (static_cast<int64_t>(val_ids.size()) <= c.block + n_targets)
    throw std::runtime_error(fmt::format("recall: the validation text has {} characters, too few for {} targets with "
                                         "{} characters of context each", val_ids.size(), n_targets, c.block));
  std::string context_csv = "model,seed,context,val_loss,targets\n";
  Panel context_panel{.title = fmt::format("loss on the same {} validation characters given the t characters before "
                                           "each ({})", n_targets, text.source),
                      .xlabel = "context t (true characters before the target)", .ylabel = "val loss (nats/char)",
                      .logx = true, .xbase = 2};
  report::Table context_table{{"model"}, {}};
  for (int64_t t : contexts) context_table.header.push_back(fmt::format("t={}", t));
  context_table.header.push_back(fmt::format("gain t={}->{}", std::max<int64_t>(1, c.block / 16), c.block));
  report::Progress bar("context", static_cast<int64_t>(c.models.size() * contexts.size()) * c.seeds, "contexts");
  int64_t done = 0;
  for (const std::string& kind : c.models) {
    std::vector<std::vector<double>> by_seed(contexts.size());  // [context][seed]
    std::vector<double> gains;
    for (int64_t i = 0; i < c.seeds; ++i) {
      auto m = load_model(from_tuning(s, model_file(kind, i)));
      if (m->vocab_size() != tok->vocab_size())
        throw std::runtime_error(fmt::format("{} has vocabulary {}, tokenizer.json {}: rerun part 1",
                                             model_file(kind, i), m->vocab_size(), tok->vocab_size()));
      for (size_t j = 0; j < contexts.size(); ++j) {
        const double l = loss_given_context(*m, val_ids, contexts[j], c.block, n_targets);
        by_seed[j].push_back(l);
        context_csv += fmt::format("{},{},{},{:.6f},{}\n", kind, run_seed(c, i), contexts[j], l, n_targets);
        ++done;
        bar.update(done, static_cast<double>(done), fmt::format("{} seed {} t={}", kind, i, contexts[j]));
      }
      gains.push_back(by_seed[context_gain_from(contexts, c.block)].back() - by_seed.back().back());
    }
    Series series{kind, {}, {}, kind};
    std::vector<std::string> row = {kind};
    for (size_t j = 0; j < contexts.size(); ++j) {
      const Range l = range_of(by_seed[j]);
      series.x.push_back(static_cast<double>(contexts[j]));
      series.y.push_back(l.mean), series.ylo.push_back(l.lo), series.yhi.push_back(l.hi);
      row.push_back(fmt::format("{:.3f}", l.mean));
    }
    row.push_back(format_range(range_of(gains), 3));
    context_table.rows.push_back(row);
    context_panel.series.push_back(series);
  }
  bar.finish("");
  report::write_file(s.path("context.csv"), context_csv);
  for (auto [png, panel] : {std::pair{"recall.png", recall_panel}, std::pair{"context.png", context_panel}})
    if (std::string why = plot(s.path(png), {panel}); !why.empty()) fmt::print("recall: no plot {}: {}\n", png, why);
  fmt::print("\nrecall accuracy by distance k:\n{}\nvalidation loss given t characters of context (nats/char):\n{}",
             recall_table.text(), context_table.text());

  std::string md = fmt::format(
      "**Recall.** Sequences of {} tokens: distractors (8 symbols) and one key (8 other symbols) at a random position; "
      "from there on the model must name the key at every position. Trained for {} steps of {} sequences (every "
      "distance up to {} at once) at each learning rate of part 1's grid from the first seed; the rate with the "
      "lowest validation loss is kept (all in recall_sweep.csv) and the model trained at it from each of {} seeds. "
      "Accuracy at the last position of {} fresh sequences whose key is k positions back (chance {:.3f}): mean and, "
      "in brackets, min-max over the seeds (the plot's bars).\n\n{}\n"
      "![recall](recall.png)\n\n**Loss against context on real text.** Part 1's models predict the same {} "
      "validation characters (spread evenly over the validation text), each at the last position of a window of {} "
      "characters whose last t are the ones just before it and whose first {} - t come from elsewhere in the text "
      "(half of it away), for t = {}: the same targets, at the same position, in windows like the training ones, "
      "so the curve shows only what more of the true context is worth. Each of part 1's seeds is scored; the table gives the mean over them, *gain* (the loss at t = {} "
      "minus the loss at t = {}) its mean and min-max.\n\n{}\n![context](context.png)\n",
      L, c.recall_steps, c.recall_batch, L - 1, c.seeds, c.recall_tests, 1.0 / kKeys, recall_table.markdown(), n_targets,
      c.block, c.block, fmt::join(contexts, ", "), contexts[context_gain_from(contexts, c.block)], c.block, context_table.markdown());
  return {"recall accuracy " + recall_summary, md};
}

}  // namespace tg::study
