// load_word2vec(path, binary = true): see fuzz_word2vec.h.
#include "fuzz/fuzz_word2vec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return tg::fuzz::load_word2vec_input(data, size, true);
}
