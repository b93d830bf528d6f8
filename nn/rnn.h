#pragma once
// Recurrent cells and the multi-layer modules that unroll them over time with
// shared weights (seed 002: vanilla RNN, LSTM). Parameter names and gate
// order follow torch.nn: weight_ih (G*H, I), weight_hh (G*H, H), bias_ih,
// bias_hh (G*H) with G = 1 (RNN), 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n);
// all initialised U(-1/sqrt(H), 1/sqrt(H)) as torch.
//
// The modules compute the input projection of all time steps in one GEMM,
// then one (B,H) x (H,G*H) GEMM per step: the LSTM's four gates come out of
// one GEMM. The time loop of a layer is one op on the tape with a hand-written
// backward (autograd/ops/rnn_ops.h); a cell is that op run for one step.
// A missing initial state means zeros.
#include <memory>
#include <vector>

#include "nn/dropout.h"
#include "nn/module.h"

namespace tg::nn {

struct RNNCellOptions {
  int64_t input = 0;   // I
  int64_t hidden = 0;  // H
  bool bias = true;
};

// h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)
class RNNCell : public Module {
 public:
  explicit RNNCell(const RNNCellOptions& options);
  // x (B, I), h (B, H) or undefined -> h' (B, H)
  Tensor forward(const Tensor& x, const Tensor& h = Tensor());
  std::string extra_repr() const override;

  RNNCellOptions options;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};

struct LSTMState {
  Tensor h;  // (B, H)
  Tensor c;  // (B, H)
};

// i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh); c' = sig(f) c + sig(i) tanh(g); h' = sig(o) tanh(c')
class LSTMCell : public Module {
 public:
  explicit LSTMCell(const RNNCellOptions& options);
  // x (B, I), state (B, H) each, or undefined -> the next state
  LSTMState forward(const Tensor& x, const LSTMState& state = {});
  std::string extra_repr() const override;

  RNNCellOptions options;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};

// r, z = sig(...); n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)); h' = (1 - z) n + z h
class GRUCell : public Module {
 public:
  explicit GRUCell(const RNNCellOptions& options);
  Tensor forward(const Tensor& x, const Tensor& h = Tensor());
  std::string extra_repr() const override;

  RNNCellOptions options;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
};

struct RNNOptions {
  int64_t input = 0;   // I
  int64_t hidden = 0;  // H
  int64_t layers = 1;  // L
  bool bias = true;
  bool batch_first = true;  // x (B, T, I); false: (T, B, I)
  double dropout = 0.0;     // between layers (not after the last), in training
};

struct RNNOutput {
  Tensor output;  // top layer's hidden state at every step: (B, T, H) (or (T, B, H))
  Tensor h;       // final hidden state of every layer: (L, B, H)
  Tensor c;       // LSTM only: final cell state (L, B, H)
};

// Children "layers.0", "layers.1", ... are the cells (so parameter names are
// layers.0.weight_ih, ...).
class RNN : public Module {
 public:
  explicit RNN(const RNNOptions& options);
  // h0 (L, B, H) or undefined
  RNNOutput forward(const Tensor& x, const Tensor& h0 = Tensor());
  std::string extra_repr() const override;

  RNNOptions options;
  std::shared_ptr<ModuleList<RNNCell>> layers;
  std::shared_ptr<Dropout> drop;
};

class LSTM : public Module {
 public:
  explicit LSTM(const RNNOptions& options);
  // h0, c0 (L, B, H) or undefined
  RNNOutput forward(const Tensor& x, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());
  std::string extra_repr() const override;

  RNNOptions options;
  std::shared_ptr<ModuleList<LSTMCell>> layers;
  std::shared_ptr<Dropout> drop;
};

class GRU : public Module {
 public:
  explicit GRU(const RNNOptions& options);
  RNNOutput forward(const Tensor& x, const Tensor& h0 = Tensor());
  std::string extra_repr() const override;

  RNNOptions options;
  std::shared_ptr<ModuleList<GRUCell>> layers;
  std::shared_ptr<Dropout> drop;
};

}  // namespace tg::nn
