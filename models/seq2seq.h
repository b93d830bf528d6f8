#pragma once
// Sequence-to-sequence models: an encoder reads the source, a
// decoder writes the target one token at a time. Trained with teacher
// forcing (the decoder reads the true previous token), decoded greedily.
#include <functional>
#include <memory>
#include <vector>

#include "../nn/attention.h"
#include "../nn/embedding.h"
#include "../nn/linear.h"
#include "../nn/module.h"
#include "../nn/rnn.h"

namespace tg::models {

class Seq2SeqModel : public nn::Module {
 public:
  using nn::Module::Module;
  // src (B,S) int64, tgt_in (B,T) int64 (starts with BOS), src_padding (B,S)
  // nonzero = padding or undefined -> logits (B,T,V) for the next target tokens.
  virtual Tensor forward(const Tensor& src, const Tensor& tgt_in, const Tensor& src_padding = Tensor()) = 0;
  // Greedy decoding from BOS until EOS or max_len tokens; returns each row's
  // tokens without BOS and EOS. Runs without a tape.
  virtual std::vector<std::vector<int64_t>> greedy(const Tensor& src, const Tensor& src_padding, int64_t bos,
                                                   int64_t eos, int64_t max_len) = 0;

 protected:
  // The greedy loop both decoders share: next(prev ids (B), t) -> logits (B,V)
  // for step t; stops when every row has written EOS or after max_len steps.
  static std::vector<std::vector<int64_t>> greedy_loop(int64_t batch, int64_t bos, int64_t eos, int64_t max_len,
                                                       const std::function<Tensor(const Tensor&, int64_t)>& next);
};

struct Seq2SeqRNNOptions {
  int64_t vocab = 0;     // V (shared by source and target)
  int64_t embed = 32;    // E
  int64_t hidden = 128;  // H
  bool attention = false;  // false: the whole source squeezed into the encoder's final state
  int64_t attention_dim = 0;  // A for the additive attention; 0 means H
};

// LSTM encoder-decoder. Without attention the decoder sees the source only
// through the encoder's final (h, c): the fixed-vector bottleneck. With
// additive (Bahdanau) attention, each step reads a context vector
// c_t = sum_s a_ts enc_s with a_t = softmax_s v^T tanh(W1 h_{t-1} + W2 enc_s),
// fed with the token embedding and to the output layer.
class Seq2SeqRNN : public Seq2SeqModel {
 public:
  explicit Seq2SeqRNN(const Seq2SeqRNNOptions& options);
  Tensor forward(const Tensor& src, const Tensor& tgt_in, const Tensor& src_padding = Tensor()) override;
  std::vector<std::vector<int64_t>> greedy(const Tensor& src, const Tensor& src_padding, int64_t bos, int64_t eos,
                                           int64_t max_len) override;
  std::string extra_repr() const override;

  Seq2SeqRNNOptions options;
  std::shared_ptr<nn::Embedding> embed;
  std::shared_ptr<nn::LSTM> encoder;
  std::shared_ptr<nn::LSTMCell> decoder;
  std::shared_ptr<nn::AdditiveAttention> attn;  // attention only
  std::shared_ptr<nn::Linear> out;

 private:
  struct Encoded {
    Tensor outputs, projected, padding;  // (B,S,H), (B,S,A), (B,S)
    nn::LSTMState state;
  };
  Encoded encode(const Tensor& src, const Tensor& src_padding);
  // One decoder step: token ids (B) -> logits (B,V); updates state and context.
  Tensor step(const Tensor& ids, const Encoded& enc, nn::LSTMState& state, Tensor& context);
};

}  // namespace tg::models
