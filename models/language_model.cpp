#include "models/language_model.h"

#include "autograd/autograd.h"

namespace tg::models {

Tensor LanguageModel::loss(const Tensor& ids, const Tensor& targets) {
  Tensor logits = forward(ids);  // (B,T,V)
  const int64_t V = logits.size(-1);
  return cross_entropy(logits.reshape({-1, V}), targets.reshape({-1}));
}

}  // namespace tg::models
