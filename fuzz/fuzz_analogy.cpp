// evaluate_analogies on any bytes as a questions-words.txt file, over all the
// vectors and over the 3 most frequent only: a ValueError, or counts that add
// up (correct <= seen <= total, per section and in all).
#include "fuzz/fuzz.h"
#include "fuzz/word_vectors.h"
#include "models/word_eval.h"

namespace {

void check(int64_t correct, int64_t seen, int64_t total) {
  tg::fuzz::require(0 <= correct && correct <= seen && seen <= total, "0 <= correct <= seen <= total");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tg::fuzz::write_input(data, size, "questions-words.txt");
  for (int64_t restrict_vocab : {int64_t{30000}, int64_t{3}}) {
    tg::models::AnalogyResult r;
    if (!tg::fuzz::accepted([&] { r = tg::models::evaluate_analogies(tg::fuzz::word_vectors(), path, restrict_vocab); }))
      return 0;
    check(r.correct, r.seen, r.total);
    int64_t total = 0;
    for (const auto& s : r.sections) {
      check(s.correct, s.seen, s.total);
      total += s.total;
    }
    tg::fuzz::require(total == r.total, "the sections' totals add up to the total");
  }
  return 0;
}
