#pragma once
// The interface every language model here implements (RNN, LSTM, GPT):
// p(x) = prod_t p(x_t | x_<t). forward() scores a whole (B,T) batch in one
// pass for training; forward_step() continues from a DecodeState (the RNN's
// hidden state, the transformer's key/value cache), which is what generation
// uses. Both give the same logits (tested).
#include <memory>
#include <string>

#include "../nn/module.h"

namespace tg::models {

// What a model carries from one decoding step to the next.
struct DecodeState {
  virtual ~DecodeState() = default;
  int64_t position = 0;  // tokens consumed so far
};

class LanguageModel : public nn::Module {
 public:
  using nn::Module::Module;
  // ids (B,T) int64 -> logits (B,T,V)
  virtual Tensor forward(const Tensor& ids) = 0;
  // A fresh state for B sequences.
  virtual std::unique_ptr<DecodeState> start(int64_t B) const = 0;
  // ids (B,Tnew) are the next tokens after what state has seen -> logits (B,Tnew,V).
  virtual Tensor forward_step(const Tensor& ids, DecodeState& state) = 0;
  virtual int64_t vocab_size() const = 0;
  // The longest context the model can attend to (0: unbounded, as an RNN).
  virtual int64_t max_context() const { return 0; }
  // Mean next-token cross-entropy (nats/token) of ids (B,T) against targets (B,T).
  Tensor loss(const Tensor& ids, const Tensor& targets);
};

}  // namespace tg::models
