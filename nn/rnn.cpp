// Recurrent cells and modules. Each layer is two ops on the tape: one GEMM
// projecting the inputs of all steps (tg::linear), then the fused recurrence
// of autograd/ops/rnn_ops.h (one GEMM per step inside); an LSTM layer with
// recompute_gates is one op, lstm_recompute, projection included. A cell is
// a layer run for one step. The recurrences are time-major: batch-first
// input is transposed once at the bottom and the output once at the top.
#include "nn/rnn.h"

#include <cmath>
#include <type_traits>

#include "autograd/ops/rnn_ops.h"
#include "nn/init.h"

namespace tg::nn {
namespace {

// torch.nn's init for every recurrent weight and bias: U(-1/sqrt(H), 1/sqrt(H)).
void init_cell(Module& m, const RNNCellOptions& o, int64_t gates, Tensor& w_ih, Tensor& w_hh, Tensor& b_ih,
               Tensor& b_hh) {
  if (o.input <= 0 || o.hidden <= 0)
    throw ValueError(
        fmt::format("{}: input ({}) and hidden ({}) sizes must be positive", m.type_name(), o.input, o.hidden));
  const double k = 1.0 / std::sqrt(static_cast<double>(o.hidden));
  auto param = [&](const char* name, const Shape& shape) {
    Tensor t = empty(shape);
    init::uniform_(t, -k, k);
    return m.register_parameter(name, t);
  };
  w_ih = param("weight_ih", {gates * o.hidden, o.input});
  w_hh = param("weight_hh", {gates * o.hidden, o.hidden});
  if (o.bias) {
    b_ih = param("bias_ih", {gates * o.hidden});
    b_hh = param("bias_hh", {gates * o.hidden});
  }
}

std::string cell_repr(const RNNCellOptions& o) {
  return fmt::format("input={}, hidden={}, bias={}", o.input, o.hidden, o.bias);
}

// x (..., I): the last axis must be the layer's input width.
void check_input(const Module& m, const Tensor& x, int64_t rank, const char* layout, int64_t input) {
  if (!x.defined()) throw ValueError(fmt::format("{}: input is undefined", m.type_name()));
  if (x.dim() != rank || x.size(-1) != input)
    throw ShapeError(fmt::format("{}: input {} must be {} with I = {}", m.type_name(), x.shape(), layout, input));
}

void check_state(const Module& m, const Tensor& s, const char* name, const Shape& want, const char* layout) {
  if (s.defined() && !(s.shape() == want))
    throw ShapeError(fmt::format("{}: {} {} must be {} {}", m.type_name(), name, s.shape(), want, layout));
}

// b_ih + b_hh, folded into the input projection (RNN and LSTM add both to every step).
Tensor both_biases(const Tensor& b_ih, const Tensor& b_hh) { return b_ih.defined() ? add(b_ih, b_hh) : Tensor(); }

// x (T,B,I) -> (T,B,G*H) with one GEMM.
Tensor project(const Tensor& x, const Tensor& w_ih, const Tensor& bias) {
  const int64_t T = x.size(0), B = x.size(1);
  return linear(x.reshape({T * B, x.size(2)}), w_ih, bias).view({T, B, w_ih.size(0)});
}

// Shared driver of RNN / LSTM / GRU: runs `layer(l, x (T,B,I_l), h0_l, c0_l)`
// -> (T,B,H) per layer, with dropout in between, and gathers final states.
template <class Layer>
RNNOutput run_layers(Module& m, const RNNOptions& o, Dropout& drop, const Tensor& x, const Tensor& h0, const Tensor& c0,
                     bool lstm, Layer layer) {
  const char* layout = o.batch_first ? "(B,T,I)" : "(T,B,I)";
  check_input(m, x, 3, layout, o.input);
  const int64_t B = x.size(o.batch_first ? 0 : 1);
  const Shape state{o.layers, B, o.hidden};
  check_state(m, h0, "h0", state, "(layers, batch, hidden)");
  check_state(m, c0, "c0", state, "(layers, batch, hidden)");
  if (x.size(o.batch_first ? 1 : 0) < 1)
    throw ShapeError(fmt::format("{}: input {} has no time step", m.type_name(), x.shape()));
  Tensor seq = o.batch_first ? x.transpose(0, 1) : x;
  std::vector<Tensor> hs, cs;
  for (int64_t l = 0; l < o.layers; ++l) {
    if (l > 0 && o.dropout > 0) seq = drop.forward(seq);
    Tensor h, c;
    seq = layer(l, seq, h0.defined() ? h0.select(0, l) : Tensor(), c0.defined() ? c0.select(0, l) : Tensor(), h, c);
    hs.push_back(h);
    if (lstm) cs.push_back(c);
  }
  RNNOutput out;
  out.output = o.batch_first ? seq.transpose(0, 1).contiguous() : seq;
  out.h = stack(hs, 0);
  if (lstm) out.c = stack(cs, 0);
  return out;
}

void check_options(const Module& m, const RNNOptions& o) {
  if (o.input <= 0 || o.hidden <= 0 || o.layers <= 0)
    throw ValueError(fmt::format("{}: input ({}), hidden ({}) and layers ({}) must be positive", m.type_name(), o.input,
                                 o.hidden, o.layers));
  if (o.dropout < 0 || o.dropout >= 1)
    throw ValueError(fmt::format("{}: dropout {} must be in [0, 1)", m.type_name(), o.dropout));
}

std::string module_repr(const RNNOptions& o) {
  return fmt::format("input={}, hidden={}, layers={}, bias={}, batch_first={}, dropout={}", o.input, o.hidden, o.layers,
                     o.bias, o.batch_first, o.dropout);
}

RNNCellOptions layer_options(const RNNOptions& o, int64_t l) {
  return {.input = l == 0 ? o.input : o.hidden, .hidden = o.hidden, .bias = o.bias};
}

// Registers "layers" (one cell per layer, named layers.0, layers.1, ...) and "drop".
template <class Cell>
void build_layers(Module& m, const RNNOptions& o, std::shared_ptr<ModuleList<Cell>>& layers,
                  std::shared_ptr<Dropout>& drop) {
  check_options(m, o);
  if (o.recompute_gates && !std::is_same_v<Cell, LSTMCell>)
    throw ValueError(fmt::format("{}: recompute_gates is an LSTM option", m.type_name()));
  layers = m.register_module("layers", std::make_shared<ModuleList<Cell>>());
  for (int64_t l = 0; l < o.layers; ++l) layers->push_back(std::make_shared<Cell>(layer_options(o, l)));
  drop = m.register_module("drop", std::make_shared<Dropout>(DropoutOptions{.p = o.dropout}));
}

}  // namespace

// ============================ cells ============================
RNNCell::RNNCell(const RNNCellOptions& o) : Module("RNNCell"), options(o) {
  init_cell(*this, o, 1, weight_ih, weight_hh, bias_ih, bias_hh);
}
std::string RNNCell::extra_repr() const { return cell_repr(options); }

Tensor RNNCell::forward(const Tensor& x, const Tensor& h) {
  ModulePathScope path(name());
  check_input(*this, x, 2, "(B,I)", options.input);
  check_state(*this, h, "h", {x.size(0), options.hidden}, "(batch, hidden)");
  Tensor xp = linear(x, weight_ih, both_biases(bias_ih, bias_hh)).unsqueeze(0);
  return rnn_tanh_recurrence(xp, weight_hh, h).squeeze(0);
}

LSTMCell::LSTMCell(const RNNCellOptions& o) : Module("LSTMCell"), options(o) {
  init_cell(*this, o, 4, weight_ih, weight_hh, bias_ih, bias_hh);
}
std::string LSTMCell::extra_repr() const { return cell_repr(options); }

LSTMState LSTMCell::forward(const Tensor& x, const LSTMState& state) {
  ModulePathScope path(name());
  check_input(*this, x, 2, "(B,I)", options.input);
  check_state(*this, state.h, "h", {x.size(0), options.hidden}, "(batch, hidden)");
  check_state(*this, state.c, "c", {x.size(0), options.hidden}, "(batch, hidden)");
  Tensor xp = linear(x, weight_ih, both_biases(bias_ih, bias_hh)).unsqueeze(0);
  Tensor out = lstm_recurrence(xp, weight_hh, state.h, state.c).view({2, x.size(0), options.hidden});
  return {out.select(0, 0), out.select(0, 1)};
}

GRUCell::GRUCell(const RNNCellOptions& o) : Module("GRUCell"), options(o) {
  init_cell(*this, o, 3, weight_ih, weight_hh, bias_ih, bias_hh);
}
std::string GRUCell::extra_repr() const { return cell_repr(options); }

Tensor GRUCell::forward(const Tensor& x, const Tensor& h) {
  ModulePathScope path(name());
  check_input(*this, x, 2, "(B,I)", options.input);
  check_state(*this, h, "h", {x.size(0), options.hidden}, "(batch, hidden)");
  Tensor xp = linear(x, weight_ih, bias_ih).unsqueeze(0);
  return gru_recurrence(xp, weight_hh, bias_hh, h).squeeze(0);
}

// ============================ multi-layer modules ============================
RNN::RNN(const RNNOptions& o) : Module("RNN"), options(o) { build_layers(*this, o, layers, drop); }
LSTM::LSTM(const RNNOptions& o) : Module("LSTM"), options(o) { build_layers(*this, o, layers, drop); }
GRU::GRU(const RNNOptions& o) : Module("GRU"), options(o) { build_layers(*this, o, layers, drop); }
std::string RNN::extra_repr() const { return module_repr(options); }
std::string LSTM::extra_repr() const { return module_repr(options); }
std::string GRU::extra_repr() const { return module_repr(options); }

RNNOutput RNN::forward(const Tensor& x, const Tensor& h0) {
  ModulePathScope path(name());
  return run_layers(*this, options, *drop, x, h0, Tensor(), false,
                    [&](int64_t l, const Tensor& seq, const Tensor& h, const Tensor&, Tensor& h_n, Tensor&) {
                      RNNCell& cell = (*layers)[l];
                      Tensor xp = project(seq, cell.weight_ih, both_biases(cell.bias_ih, cell.bias_hh));
                      Tensor out = rnn_tanh_recurrence(xp, cell.weight_hh, h);
                      h_n = out.select(0, out.size(0) - 1);
                      return out;
                    });
}

RNNOutput LSTM::forward(const Tensor& x, const Tensor& h0, const Tensor& c0) {
  ModulePathScope path(name());
  return run_layers(*this, options, *drop, x, h0, c0, true,
                    [&](int64_t l, const Tensor& seq, const Tensor& h, const Tensor& c, Tensor& h_n, Tensor& c_n) {
                      LSTMCell& cell = (*layers)[l];
                      const Tensor bias = both_biases(cell.bias_ih, cell.bias_hh);
                      const int64_t T = seq.size(0);
                      if (options.recompute_gates) {
                        // (T+1,B,H): rows 0..T-1 are h_t, row T is c_{T-1}. The copy of a
                        // batch-first input is the one project() makes.
                        Tensor out = lstm_recompute(seq.contiguous(), cell.weight_ih, bias, cell.weight_hh, h, c);
                        h_n = out.select(0, T - 1);
                        c_n = out.select(0, T);
                        return out.narrow(0, 0, T);
                      }
                      Tensor xp = project(seq, cell.weight_ih, bias);
                      // (2,T,B,H) seen as (2T,B,H): rows 0..T-1 are h_t, rows T..2T-1 are c_t.
                      Tensor out = lstm_recurrence(xp, cell.weight_hh, h, c).view({2 * T, xp.size(1), options.hidden});
                      h_n = out.select(0, T - 1);
                      c_n = out.select(0, 2 * T - 1);
                      return out.narrow(0, 0, T);
                    });
}

RNNOutput GRU::forward(const Tensor& x, const Tensor& h0) {
  ModulePathScope path(name());
  return run_layers(*this, options, *drop, x, h0, Tensor(), false,
                    [&](int64_t l, const Tensor& seq, const Tensor& h, const Tensor&, Tensor& h_n, Tensor&) {
                      GRUCell& cell = (*layers)[l];
                      Tensor xp = project(seq, cell.weight_ih, cell.bias_ih);
                      Tensor out = gru_recurrence(xp, cell.weight_hh, cell.bias_hh, h);
                      h_n = out.select(0, out.size(0) - 1);
                      return out;
                    });
}

}  // namespace tg::nn
