#pragma once
// Fixed word vectors (V = 12, C = 4) for the similarity and analogy targets:
// the words of their seed files, two of them capitalised so that the
// case-insensitive lookup has work to do.
#include <cmath>

#include "models/word2vec.h"

namespace tg::fuzz {

inline const models::KeyedVectors& word_vectors() {
  static const models::KeyedVectors kv = [] {
    models::KeyedVectors kv;
    kv.words = {"the", "king", "queen", "man", "woman", "Paris", "france", "Berlin", "germany", "cat", "dog", "car"};
    kv.dim = 4;
    for (size_t i = 0; i < kv.words.size(); ++i)
      for (int c = 0; c < kv.dim; ++c) kv.vectors.push_back(static_cast<float>(std::sin(1.0 + 3.0 * i + c)));
    kv.rebuild_index();
    return kv;
  }();
  return kv;
}

}  // namespace tg::fuzz
