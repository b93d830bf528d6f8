#pragma once
// The encoder-only and encoder-decoder transformers.
//
// TransformerEncoder: token embedding + positions -> N bidirectional blocks ->
// final LayerNorm (pre-LN). TransformerClassifier puts a head on it, pooled
// (mean over non-padding positions) or first-token (a [CLS]-style id 0).
//
// EncoderDecoderTransformer ("Attention is all you need"): the encoder reads
// the source; the decoder's masked self-attention reads the target so far and
// its cross-attention reads the encoder's output (keys and values from the
// encoder, queries from the decoder). Greedy decoding uses key/value caches.
#include <memory>
#include <vector>

#include "seq2seq.h"
#include "../nn/embedding.h"
#include "../nn/layer_norm.h"
#include "../nn/linear.h"
#include "../nn/positional.h"
#include "../nn/transformer.h"

namespace tg::models {

struct TransformerOptions {
  int64_t vocab = 0;      // V (source and target share it in the encoder-decoder)
  int64_t max_len = 128;  // longest sequence
  int64_t layers = 2;     // L (each of encoder and decoder)
  int64_t heads = 4;      // H
  int64_t dim = 64;       // C
  int64_t hidden_mult = 4;
  nn::Activation activation = nn::Activation::gelu;
  nn::NormPosition norm = nn::NormPosition::pre;
  bool sinusoidal = true;  // fixed sinusoidal positions (Vaswani et al.) or learned embeddings
  double dropout = 0.0;
  // k > 0: layers 0, k, 2k, ... of the encoder and of the decoder are
  // checkpointed: backward reruns them instead of keeping their activations
  // (an encoder layer as its attention half and its MLP half in row chunks,
  // nn::checkpointed_forward; a decoder layer as one tg::checkpoint). 0: none.
  int64_t checkpoint_layers = 0;
};

class TransformerEncoder : public nn::Module {
 public:
  explicit TransformerEncoder(const TransformerOptions& options);
  // ids (B,S) int64, padding (B,S) nonzero = padding or undefined -> (B,S,C)
  Tensor forward(const Tensor& ids, const Tensor& padding = Tensor());

  TransformerOptions options;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::SinusoidalPositionalEncoding> pe;
  std::shared_ptr<nn::LearnedPositionalEmbedding> wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList<nn::TransformerEncoderLayer>> layers;
  std::shared_ptr<nn::LayerNorm> ln_f;  // pre-LN only
};

enum class Pooling { mean, first };

class TransformerClassifier : public nn::Module {
 public:
  TransformerClassifier(const TransformerOptions& options, int64_t classes, Pooling pooling = Pooling::mean);
  // ids (B,S), padding (B,S) or undefined -> logits (B, classes)
  Tensor forward(const Tensor& ids, const Tensor& padding = Tensor());

  Pooling pooling;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<nn::Linear> head;
};

class EncoderDecoderTransformer : public Seq2SeqModel {
 public:
  explicit EncoderDecoderTransformer(const TransformerOptions& options);
  Tensor forward(const Tensor& src, const Tensor& tgt_in, const Tensor& src_padding = Tensor()) override;
  std::vector<std::vector<int64_t>> greedy(const Tensor& src, const Tensor& src_padding, int64_t bos, int64_t eos,
                                           int64_t max_len) override;

  TransformerOptions options;
  std::shared_ptr<TransformerEncoder> encoder;
  std::shared_ptr<nn::Embedding> tgt_embed;
  std::shared_ptr<nn::SinusoidalPositionalEncoding> pe;
  std::shared_ptr<nn::LearnedPositionalEmbedding> wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList<nn::TransformerDecoderLayer>> layers;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;

 private:
  Tensor embed_target(const Tensor& ids, int64_t start);
  Tensor decode(const Tensor& x);  // final norm + head: (B,T,C) -> (B,T,V)
};

}  // namespace tg::models
