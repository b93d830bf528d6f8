#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "autograd/autograd.h"

namespace tg::models {

int64_t sample_token(const std::vector<double>& logits, const SamplingOptions& o, Generator& gen) {
  const int64_t V = static_cast<int64_t>(logits.size());
  if (V == 0) throw ValueError("sample_token: empty logits");
  if (o.greedy) return std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (!(o.temperature > 0)) throw ValueError(fmt::format("sample_token: temperature must be > 0, got {}", o.temperature));
  std::vector<int64_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  int64_t k = (o.top_k > 0 && o.top_k < V) ? o.top_k : V;
  // The k largest logits (ties broken by id, so sampling is deterministic).
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int64_t a, int64_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  const double top = logits[order[0]];
  std::vector<double> p(k);
  double total = 0;
  for (int64_t i = 0; i < k; ++i) total += p[i] = std::exp((logits[order[i]] - top) / o.temperature);
  double u = gen.uniform() * total;
  for (int64_t i = 0; i < k; ++i) {
    if (u < p[i]) return order[i];
    u -= p[i];
  }
  return order[k - 1];
}

std::vector<int64_t> generate(LanguageModel& model, const std::vector<int64_t>& prompt, const SamplingOptions& o,
                              Generator& gen) {
  if (prompt.empty()) throw ValueError("generate: the prompt is empty (give at least one token)");
  for (int64_t id : prompt)
    if (id < 0 || id >= model.vocab_size())
      throw IndexError(fmt::format("generate: prompt token {} is outside the vocabulary of {}", id, model.vocab_size()));
  NoGradGuard no_grad;
  model.eval();
  const int64_t ctx = model.max_context();
  std::vector<int64_t> seq = prompt;
  if (ctx > 0 && static_cast<int64_t>(seq.size()) > ctx) seq.erase(seq.begin(), seq.end() - ctx);
  std::vector<int64_t> out;
  auto state = model.start(1);
  Tensor feed = from_vector(seq, {1, static_cast<int64_t>(seq.size())});
  for (int64_t n = 0; n < o.max_new_tokens; ++n) {
    Tensor logits = model.forward_step(feed, *state);           // (1,Tnew,V)
    Tensor last = logits.select(1, logits.size(1) - 1).to(DType::f64).contiguous();  // (1,V)
    std::vector<double> row = last.to_vector<double>();
    int64_t next = sample_token(row, o, gen);
    out.push_back(next);
    seq.push_back(next);
    if (ctx > 0 && state->position >= ctx) {
      // The window is full: start again from the last half block of context.
      int64_t keep = std::max<int64_t>(1, ctx / 2);
      std::vector<int64_t> tail(seq.end() - keep, seq.end());
      state = model.start(1);
      feed = from_vector(tail, {1, keep});
    } else {
      feed = from_vector(std::vector<int64_t>{next}, {1, 1});
    }
  }
  return out;
}

}  // namespace tg::models
