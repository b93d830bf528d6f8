#include "nn/embedding.h"

#include "nn/init.h"

namespace tg::nn {

Embedding::Embedding(const EmbeddingOptions& o) : UnaryModule("Embedding"), options(o) {
  if (o.num_embeddings <= 0 || o.dim <= 0)
    throw ValueError(fmt::format("Embedding: num_embeddings ({}) and dim ({}) must be positive", o.num_embeddings,
                                 o.dim));
  if (o.padding_idx < -1 || o.padding_idx >= o.num_embeddings)
    throw ValueError(fmt::format("Embedding: padding_idx {} outside [0, {}) (or -1 for none)", o.padding_idx,
                                 o.num_embeddings));
  Tensor w = empty({o.num_embeddings, o.dim});
  init::normal_(w);
  if (o.padding_idx >= 0) init::zeros_(w.select(0, o.padding_idx));
  weight = register_parameter("weight", w);
}

Tensor Embedding::forward(const Tensor& ids) {
  ModulePathScope path(name());
  if (!ids.defined()) throw ValueError("Embedding: ids are undefined");
  if (ids.dtype() != DType::i64)
    throw DTypeError(fmt::format("Embedding: ids {} are {}, expected int64", ids.shape(), dtype_name(ids.dtype())));
  // Checked here too so the message names the layer and the vocabulary.
  const Tensor c = ids.contiguous();
  const int64_t* p = c.data<int64_t>();
  for (int64_t i = 0; i < c.numel(); ++i)
    if (p[i] < 0 || p[i] >= options.num_embeddings)
      throw IndexError(fmt::format("Embedding: id {} out of range for vocabulary size V = {}", p[i],
                                   options.num_embeddings));
  return embedding(weight, ids, options.padding_idx);
}

std::string Embedding::extra_repr() const {
  std::string s = fmt::format("num_embeddings={}, dim={}", options.num_embeddings, options.dim);
  if (options.padding_idx >= 0) s += fmt::format(", padding_idx={}", options.padding_idx);
  return s;
}

}  // namespace tg::nn
