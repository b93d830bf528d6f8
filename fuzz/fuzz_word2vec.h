#pragma once
// load_word2vec on any bytes, text or binary: a ValueError, or vectors whose
// table holds exactly one row of dim floats per word.
#include "fuzz/fuzz.h"
#include "models/word2vec.h"

namespace tg::fuzz {

inline int load_word2vec_input(const uint8_t* data, size_t size, bool binary) {
  const std::string path = write_input(data, size, binary ? "vectors.bin" : "vectors.txt");
  models::KeyedVectors kv;
  if (!accepted([&] { kv = models::load_word2vec(path, binary); })) return 0;
  require(kv.dim >= 1, "an accepted file has dim >= 1");
  require(kv.vectors.size() == kv.words.size() * static_cast<size_t>(kv.dim), "one row of dim floats per word");
  for (int32_t i = 0; i < static_cast<int32_t>(kv.size()); ++i)
    require(kv.id(kv.words[i]) >= 0, "every loaded word can be looked up");
  return 0;
}

}  // namespace tg::fuzz
