#pragma once
/// \file
/// Recurrent cells and the multi-layer modules that unroll them over time with
/// shared weights (vanilla RNN, LSTM, GRU). Parameter names and gate
/// order follow torch.nn: weight_ih (G*H, I), weight_hh (G*H, H), bias_ih,
/// bias_hh (G*H) with G = 1 (RNN), 4 (LSTM: i, f, g, o), 3 (GRU: r, z, n);
/// all initialised U(-1/sqrt(H), 1/sqrt(H)) as torch.
///
/// The modules compute the input projection of all time steps in one GEMM,
/// then one (B,H) x (H,G*H) GEMM per step: the LSTM's four gates come out of
/// one GEMM. The time loop of a layer is one op on the tape with a hand-written
/// backward (autograd/ops/rnn_ops.h); a cell is that op run for one step.
/// A missing initial state means zeros.
#include <memory>
#include <vector>

#include "dropout.h"
#include "module.h"

namespace tg::nn {

/// Options of RNNCell, LSTMCell and GRUCell.
struct RNNCellOptions {
  int64_t input = 0;   ///< I
  int64_t hidden = 0;  ///< H
  bool bias = true;    ///< whether the cell has bias_ih and bias_hh
};

/// h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh)
class RNNCell : public Module {
 public:
  /// A cell initialised from the default generator.
  explicit RNNCell(const RNNCellOptions& options);
  /// x (B, I), h (B, H) or undefined -> h' (B, H)
  Tensor forward(const Tensor& x, const Tensor& h = Tensor());
  std::string extra_repr() const override;

  RNNCellOptions options;  ///< as constructed
  ///@{
  /// (H, I), (H, H), (H), (H)
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  ///@}
};

/// The state an LSTM carries from step to step.
struct LSTMState {
  Tensor h;  ///< (B, H)
  Tensor c;  ///< (B, H)
};

/// i, f, g, o = split(x W_ih^T + b_ih + h W_hh^T + b_hh); c' = sig(f) c + sig(i) tanh(g); h' = sig(o) tanh(c')
class LSTMCell : public Module {
 public:
  /// A cell initialised from the default generator.
  explicit LSTMCell(const RNNCellOptions& options);
  /// x (B, I), state (B, H) each, or undefined -> the next state
  LSTMState forward(const Tensor& x, const LSTMState& state = {});
  std::string extra_repr() const override;

  RNNCellOptions options;  ///< as constructed
  ///@{
  /// (4H, I), (4H, H), (4H), (4H)
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  ///@}
};

/// r, z = sig(...); n = tanh(x W_in^T + b_in + r * (h W_hn^T + b_hn)); h' = (1 - z) n + z h
class GRUCell : public Module {
 public:
  /// A cell initialised from the default generator.
  explicit GRUCell(const RNNCellOptions& options);
  /// x (B, I), h (B, H) or undefined -> h' (B, H)
  Tensor forward(const Tensor& x, const Tensor& h = Tensor());
  std::string extra_repr() const override;

  RNNCellOptions options;  ///< as constructed
  ///@{
  /// (3H, I), (3H, H), (3H), (3H)
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;
  ///@}
};

/// Options of RNN, LSTM and GRU.
struct RNNOptions {
  int64_t input = 0;   ///< I
  int64_t hidden = 0;  ///< H
  int64_t layers = 1;  ///< L
  bool bias = true;    ///< whether the cells have biases
  bool batch_first = true;  ///< x (B, T, I); false: (T, B, I)
  double dropout = 0.0;     ///< between layers (not after the last), in training
  /// LSTM only: each layer keeps its input and h_t, not the gates and cell
  /// states of every step (tg::lstm_recompute), and backward rebuilds them;
  /// RNN and GRU reject it.
  bool recompute_gates = false;
};

/// What RNN, LSTM and GRU return.
struct RNNOutput {
  Tensor output;  ///< top layer's hidden state at every step: (B, T, H) (or (T, B, H))
  Tensor h;       ///< final hidden state of every layer: (L, B, H)
  Tensor c;       ///< LSTM only: final cell state (L, B, H)
};

/// A stack of L RNNCells run over a sequence. Children "layers.0",
/// "layers.1", ... are the cells (so parameter names are layers.0.weight_ih, ...).
class RNN : public Module {
 public:
  /// L cells initialised from the default generator.
  explicit RNN(const RNNOptions& options);
  /// x (B, T, I) (or (T, B, I)); h0 (L, B, H) or undefined
  RNNOutput forward(const Tensor& x, const Tensor& h0 = Tensor());
  std::string extra_repr() const override;

  RNNOptions options;  ///< as constructed
  std::shared_ptr<ModuleList<RNNCell>> layers;  ///< the cells, bottom first
  std::shared_ptr<Dropout> drop;  ///< between layers
};

/// A stack of L LSTMCells run over a sequence, named as RNN's.
class LSTM : public Module {
 public:
  /// L cells initialised from the default generator.
  explicit LSTM(const RNNOptions& options);
  /// x (B, T, I) (or (T, B, I)); h0, c0 (L, B, H) or undefined
  RNNOutput forward(const Tensor& x, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());
  std::string extra_repr() const override;

  RNNOptions options;  ///< as constructed
  std::shared_ptr<ModuleList<LSTMCell>> layers;  ///< the cells, bottom first
  std::shared_ptr<Dropout> drop;  ///< between layers
};

/// A stack of L GRUCells run over a sequence, named as RNN's.
class GRU : public Module {
 public:
  /// L cells initialised from the default generator.
  explicit GRU(const RNNOptions& options);
  /// x (B, T, I) (or (T, B, I)); h0 (L, B, H) or undefined
  RNNOutput forward(const Tensor& x, const Tensor& h0 = Tensor());
  std::string extra_repr() const override;

  RNNOptions options;  ///< as constructed
  std::shared_ptr<ModuleList<GRUCell>> layers;  ///< the cells, bottom first
  std::shared_ptr<Dropout> drop;  ///< between layers
};

}  // namespace tg::nn
