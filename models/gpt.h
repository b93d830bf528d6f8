#pragma once
// GPT: a decoder-only transformer language model (GPT-2's architecture).
//   x = wte(ids) + wpe(positions)              (B,T,C)
//   x = block_l(x) for l < L, causal pre-LN blocks (post-LN optional)
//   logits = ln_f(x) wte^T                     (B,T,V), head tied to wte (untied optional)
// Initialisation as GPT-2: weights N(0, 0.02), the residual projections
// (attn.proj, mlp.proj) N(0, 0.02 / sqrt(2L)), biases 0, LayerNorms 1/0.
#include <memory>

#include "language_model.h"
#include "../nn/embedding.h"
#include "../nn/layer_norm.h"
#include "../nn/linear.h"
#include "../nn/positional.h"
#include "../nn/transformer.h"

namespace tg::models {

enum class PositionKind { learned, sinusoidal };

struct GPTOptions {
  int64_t vocab = 0;    // V
  int64_t block = 64;   // longest context T
  int64_t layers = 2;   // L
  int64_t heads = 4;    // H
  int64_t dim = 128;    // C
  int64_t hidden_mult = 4;
  nn::Activation activation = nn::Activation::gelu;
  nn::NormPosition norm = nn::NormPosition::pre;
  PositionKind positions = PositionKind::learned;
  bool tied = true;     // output head shares wte's weight
  bool bias = true;
  double dropout = 0.0;
  // k > 0: blocks 0, k, 2k, ... are checkpointed (nn::checkpointed_forward):
  // each keeps its input and its attention half's output (B,T,C) for
  // backward, which reruns the attention half, then the MLP half a quarter of
  // the rows at a time, instead of keeping the block's activations. 1
  // checkpoints every block; 0 none.
  int64_t checkpoint_blocks = 0;
};

class GPT : public LanguageModel {
 public:
  explicit GPT(const GPTOptions& options);
  Tensor forward(const Tensor& ids) override;  // ids (B,T) -> (B,T,V)
  std::unique_ptr<DecodeState> start(int64_t B) const override;
  Tensor forward_step(const Tensor& ids, DecodeState& state) override;
  int64_t vocab_size() const override { return options.vocab; }
  int64_t max_context() const override { return options.block; }
  std::string extra_repr() const override;

  GPTOptions options;
  std::shared_ptr<nn::Embedding> wte;
  std::shared_ptr<nn::LearnedPositionalEmbedding> wpe;       // learned positions
  std::shared_ptr<nn::SinusoidalPositionalEncoding> pe;      // or fixed ones
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList<nn::TransformerEncoderLayer>> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;  // untied only

 private:
  Tensor embed(const Tensor& ids, int64_t start);  // (B,T) -> (B,T,C)
  Tensor unembed(const Tensor& x);                 // (B,T,C) -> (B,T,V)
};

}  // namespace tg::models
