// evaluate_similarity on any bytes as a WordSim-353 / SimLex-999 file: a
// ValueError, or counts that add up (pairs skipped for an unknown word are
// among the pairs of the file).
#include "fuzz/fuzz.h"
#include "fuzz/word_vectors.h"
#include "models/word_eval.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tg::fuzz::write_input(data, size, "similarity.txt");
  tg::models::SimilarityResult r;
  if (!tg::fuzz::accepted([&] { r = tg::models::evaluate_similarity(tg::fuzz::word_vectors(), path); })) return 0;
  tg::fuzz::require(r.oov >= 0 && r.oov <= r.pairs, "0 <= oov <= pairs");
  return 0;
}
