#pragma once
// Recurrent language models: the past is carried in a fixed-size state.
// ids (B,T) -> embedding (B,T,E) -> multi-layer RNN/LSTM/GRU (B,T,H)
// -> dropout -> linear head (B,T,V). Dropout sits between recurrent layers
// and before the head, as in Zaremba et al.
#include <memory>

#include "language_model.h"
#include "../nn/dropout.h"
#include "../nn/embedding.h"
#include "../nn/linear.h"
#include "../nn/rnn.h"

namespace tg::models {

enum class CellKind { rnn, lstm, gru };
const char* cell_name(CellKind k);

struct RNNLMOptions {
  int64_t vocab = 0;    // V
  int64_t embed = 64;   // E
  int64_t hidden = 256; // H
  int64_t layers = 1;   // L
  CellKind cell = CellKind::lstm;
  double dropout = 0.0;
  // Trade time for activation memory in the recurrence. LSTM: its layers
  // keep h_t, not the gates and cell states of every step, and backward
  // rebuilds them over chunks of ceil(sqrt(T)) steps with a GEMM per chunk
  // (nn::RNNOptions::recompute_gates). RNN and GRU: the recurrence is
  // checkpointed over chunks of ceil(sqrt(T)) steps (tg::checkpoint):
  // backward keeps each chunk's input and entering state and reruns one
  // chunk at a time (all but the last, whose activations backward needs
  // first).
  bool checkpoint_time = false;
};

// RNNLM(o)'s parameter count without building it (building draws weights
// from the default generator): embedding V*E, head H*V + V, and per layer
// G*H*(in + H + 2) for W_ih, W_hh and two biases (G gates: 1 RNN, 3 GRU,
// 4 LSTM; in = E for the first layer, H above).
int64_t rnn_lm_parameters(const RNNLMOptions& o);
// The hidden size in [8, 4096] whose RNNLM (o otherwise) has the parameter
// count nearest budget, the smaller on a tie: a recurrent model matched to
// another's size.
int64_t hidden_for_parameters(RNNLMOptions o, int64_t budget);

class RNNLM : public LanguageModel {
 public:
  explicit RNNLM(const RNNLMOptions& options);
  Tensor forward(const Tensor& ids) override;  // (B,T) -> (B,T,V)
  std::unique_ptr<DecodeState> start(int64_t B) const override;
  Tensor forward_step(const Tensor& ids, DecodeState& state) override;
  int64_t vocab_size() const override { return options.vocab; }
  std::string extra_repr() const override;

  RNNLMOptions options;
  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::RNN> rnn;    // exactly one of rnn / lstm / gru
  std::shared_ptr<nn::LSTM> lstm;
  std::shared_ptr<nn::GRU> gru;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::Linear> head;

 private:
  nn::RNNOutput run(const Tensor& x, const Tensor& h0, const Tensor& c0);
  nn::RNNOutput run_checkpointed(const Tensor& x);  // RNN and GRU
};

}  // namespace tg::models
