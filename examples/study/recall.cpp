// Part 3, long-range dependencies, two ways:
//  - a synthetic recall task: one key among distractors, to be named at every
//    later position; accuracy k positions after the key, for each k;
//  - real text: part 1's models' validation loss at each position of the
//    context, i.e. how much each gains from seeing more of the past.
#include <cmath>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "data/tokenizer.h"
#include "examples/common/progress.h"
#include "examples/common/report.h"
#include "examples/study/plot.h"
#include "examples/study/study.h"

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

}  // namespace

PartOutput run_recall(Study& s) {
  const Config& c = s.c;
  const int64_t L = c.recall_length;
  const std::vector<int64_t> ks = test_distances(L);
  // Part 1's files, before minutes of training: the second half needs them.
  const std::string tokenizer_path = from_tuning(s, "tokenizer.json");
  for (const std::string& kind : c.models) from_tuning(s, kind + ".safetensors");
  fmt::print("recall: sequences of {} tokens, a key (1 of {}) among distractors (1 of {}), to be named at every later "
             "position; {} steps x {} sequences per model at each learning rate of {}, the best kept; then part 1's "
             "models scored by position on the validation text\n",
             L, kKeys, kDistractors, c.recall_steps, c.recall_batch, fmt::join(c.lrs, ", "));

  // --- the synthetic task
  std::string recall_csv = "model,k,accuracy,tests\n";
  examples::Table recall_table{{"model", "lr"}, {}};
  for (int64_t k : ks) recall_table.header.push_back(fmt::format("k={}", k));
  Panel recall_panel{fmt::format("recall of a key k tokens back (sequences of {})", L), "distance k",
                     "accuracy k positions after the key", true};
  recall_panel.hline = 1.0 / kKeys;
  recall_panel.hline_label = "chance";
  recall_panel.key = "center right";
  recall_panel.xbase = 2;
  std::string recall_summary;
  std::string sweep_csv = "model,lr,steps,val_loss,chosen\n";
  Generator val_gen(c.seed + 4);
  const data::LMBatch val = recall_batch(256, L, 0, val_gen);  // every distance, as in training
  auto loss = [](models::LanguageModel& m, const data::LMBatch& b) { return m.loss(b.inputs, b.targets); };
  for (const std::string& kind : c.models) {
    // Learning on this task comes suddenly after a plateau, so a short sweep
    // cannot tell the rates apart: every rate gets the full run, the best is kept.
    std::vector<std::shared_ptr<models::LanguageModel>> trained;
    const Sweep sw = sweep_lr(c.lrs, [&](double lr) {
      auto candidate = make_model(c, kind, kRecallVocab, L, c.seed);
      TrainSpec spec{.label = fmt::format("{} recall lr {}", kind, format_lr(lr)), .lr = lr, .steps = c.recall_steps,
                     .warmup = std::max<int64_t>(1, c.recall_steps / 10), .eval_every = std::max<int64_t>(1, c.recall_steps / 4),
                     .tokens_per_step = c.recall_batch * L, .seed = c.seed + 5};
      auto next = [&](Generator& g) { return recall_batch(c.recall_batch, L, 0, g); };
      const double v = train(*candidate, spec, next, loss, [&] {
        NoGradGuard no_grad;
        candidate->eval();
        return loss(*candidate, val).item();
      }).curve.back().val_loss;
      trained.push_back(candidate);
      return v;
    });
    const double lr = c.lrs[sw.best];
    models::LanguageModel* m = trained[sw.best].get();
    for (size_t i = 0; i < c.lrs.size(); ++i)
      sweep_csv += fmt::format("{},{},{},{:.6f},{}\n", kind, c.lrs[i], c.recall_steps, sw.losses[i], i == sw.best ? 1 : 0);
    Series acc{kind, {}, {}, kind};
    std::vector<std::string> row = {kind, format_lr(lr)};
    for (int64_t k : ks) {
      const double a = accuracy(*m, L, k, c.recall_tests, c.seed + 6);
      recall_csv += fmt::format("{},{},{:.4f},{}\n", kind, k, a, c.recall_tests);
      row.push_back(fmt::format("{:.2f}", a));
      acc.x.push_back(static_cast<double>(k)), acc.y.push_back(a);
    }
    recall_summary += fmt::format("{}{} {:.2f}@k={} {:.2f}@k={}", recall_summary.empty() ? "" : ", ", kind,
                                  acc.y.front(), ks.front(), acc.y.back(), ks.back());
    recall_table.rows.push_back(row);
    recall_panel.series.push_back(acc);
  }
  examples::write_file(s.path("recall.csv"), recall_csv);
  examples::write_file(s.path("recall_sweep.csv"), sweep_csv);

  // --- real text: loss by position, part 1's models
  const auto tok = data::load_tokenizer(tokenizer_path);
  const Text& text = s.text();
  const data::LMBatches val_set(tok->encode(text.val), c.block);
  std::string context_csv = "model,position,val_loss\n";
  Panel context_panel{fmt::format("validation loss by position in the context ({})", text.source),
                      "position in the context (characters seen, half-octave bins)", "val loss (nats/char)", true};
  context_panel.xbase = 2;
  examples::Table context_table{{"model"}, {}};
  std::vector<std::pair<int64_t, int64_t>> bands;  // [begin, end) positions: 0, 1-3, 4-15, 16-63, ...
  for (int64_t b = 0, e = 1; b < c.block; b = e, e = std::min(c.block, e * 4)) bands.push_back({b, e});
  for (auto [b, e] : bands) context_table.header.push_back(e - b == 1 ? fmt::format("pos {}", b) : fmt::format("pos {}-{}", b, e - 1));
  examples::Progress bar("context", static_cast<int64_t>(c.models.size()), "models");
  int64_t done = 0;
  for (const std::string& kind : c.models) {
    auto m = load_model(from_tuning(s, kind + ".safetensors"));
    if (m->vocab_size() != tok->vocab_size())
      throw std::runtime_error(fmt::format("{}.safetensors has vocabulary {}, tokenizer.json {}: rerun part 1", kind,
                                           m->vocab_size(), tok->vocab_size()));
    NoGradGuard no_grad;
    m->eval();
    std::vector<double> by_pos(c.block, 0.0);
    for (int64_t i = 0; i < c.context_batches; ++i) {
      data::LMBatch b = val_set.fixed(i, c.context_batches, c.batch);
      Tensor logits = m->forward(b.inputs);  // (B,T,V)
      Tensor l = cross_entropy(logits.reshape({-1, logits.size(-1)}), b.targets.reshape({-1}), -100, 0.0, Reduction::none);
      std::vector<double> pos = mean(l.reshape({b.inputs.size(0), c.block}), {0}).to(DType::f64).to_vector<double>();
      for (int64_t t = 0; t < c.block; ++t) by_pos[t] += pos[t] / static_cast<double>(c.context_batches);
    }
    for (int64_t t = 0; t < c.block; ++t) context_csv += fmt::format("{},{},{:.6f}\n", kind, t, by_pos[t]);
    // Plotted as means over half-octave bins of positions: one position's
    // mean is noisy (it depends on which characters fall there).
    Series series{kind, {}, {}, kind};
    for (int64_t b = 0, i = 1; b < c.block; ++i) {
      const int64_t e = std::min(c.block, std::max<int64_t>(b + 1, std::llround(std::pow(2.0, i / 2.0))));
      double sum = 0;
      for (int64_t t = b; t < e; ++t) sum += by_pos[t];
      series.x.push_back(std::sqrt(static_cast<double>(b + 1) * static_cast<double>(e)));
      series.y.push_back(sum / static_cast<double>(e - b));
      b = e;
    }
    std::vector<std::string> row = {kind};
    for (auto [b, e] : bands) {
      double sum = 0;
      for (int64_t t = b; t < e; ++t) sum += by_pos[t];
      row.push_back(fmt::format("{:.3f}", sum / static_cast<double>(e - b)));
    }
    context_table.rows.push_back(row);
    context_panel.series.push_back(series);
    bar.update(++done, static_cast<double>(done), kind);
  }
  bar.finish("");
  examples::write_file(s.path("context.csv"), context_csv);
  for (auto [png, panel] : {std::pair{"recall.png", recall_panel}, std::pair{"context.png", context_panel}})
    if (std::string why = plot(s.path(png), {panel}); !why.empty()) fmt::print("recall: no plot {}: {}\n", png, why);
  fmt::print("\nrecall accuracy by distance k:\n{}\nvalidation loss by position (nats/char):\n{}", recall_table.text(),
             context_table.text());

  std::string md = fmt::format(
      "**Recall.** Sequences of {} tokens: distractors (8 symbols) and one key (8 other symbols) at a random position; "
      "from there on the model must name the key at every position. Trained for {} steps of {} sequences (every "
      "distance up to {} at once) at each learning rate of part 1's grid; the run with the lowest validation loss "
      "is the one shown (all in recall_sweep.csv). Accuracy at the last position of {} fresh "
      "sequences whose key is k positions back (chance {:.3f}).\n\n{}\n"
      "![recall](recall.png)\n\n**Loss by position on real text.** Part 1's models on {} validation windows of {} "
      "characters, each window read from an empty state: the loss at position t is what the model does with t "
      "characters of context.\n\n{}\n![context](context.png)\n",
      L, c.recall_steps, c.recall_batch, L - 1, c.recall_tests, 1.0 / kKeys, recall_table.markdown(),
      c.context_batches * c.batch, c.block, context_table.markdown());
  return {"recall accuracy " + recall_summary, md};
}

}  // namespace tg::study
