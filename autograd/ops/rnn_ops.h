#pragma once
/// \file
/// Fused recurrences: the whole time loop of one RNN / LSTM / GRU layer as one
/// op on the tape, with backpropagation through time written by hand.
///
/// The input projection xp = x W_ih^T + b stays outside (tg::linear: one GEMM
/// for all steps), but for lstm_recompute. Per step, the forward runs one GEMM
/// h_{t-1} W_hh^T and one fused pointwise pass, the backward one GEMM dG_t W_hh;
/// dW_hh is one GEMM over all steps. One op, not one per step: on this tape
/// the gradient of a slice has its input's full shape, so per-step slices of
/// xp would cost O(T^2) in backward. A recorded backward (create_graph) is
/// written in differentiable ops, the recursion through time an op of its own.
///
/// Everything is time-major (T,B,...); gate order as torch.nn. A missing
/// (undefined) initial state means zeros.
#include "../tensor.h"

namespace tg {

/// xp (T,B,H) = x W_ih^T + b_ih + b_hh, w_hh (H,H), h0 (B,H)
/// -> (T,B,H): h_t = tanh(xp_t + h_{t-1} W_hh^T)
Tensor rnn_tanh_recurrence(const Tensor& xp, const Tensor& w_hh, const Tensor& h0 = Tensor());

/// xp (T,B,4H) = x W_ih^T + b_ih + b_hh (gates i, f, g, o), w_hh (4H,H), h0 and c0 (B,H)
/// -> (2,T,B,H): [h_t; c_t] with c_t = sig(f) c_{t-1} + sig(i) tanh(g), h_t = sig(o) tanh(c_t)
Tensor lstm_recurrence(const Tensor& xp, const Tensor& w_hh, const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());

/// The same LSTM layer with its input projection, for less memory: x (T,B,I),
/// w_ih (4H,I), bias (4H) = b_ih + b_hh or undefined, w_hh (4H,H), h0 and c0
/// (B,H) -> (T+1,B,H): [h_t; c_{T-1}], the hidden states of lstm_recurrence(x
/// W_ih^T + bias, w_hh, h0, c0), then the last cell state. Its node keeps x,
/// the h_t and a cell state per chunk of ceil(sqrt(T)) steps -- not the gates
/// and cell states of every step, 6H values a step -- and backward rebuilds
/// the gates chunk by chunk, two GEMMs over each chunk's steps at once and a
/// pointwise pass, instead of rerunning the sequential recurrence.
Tensor lstm_recompute(const Tensor& x, const Tensor& w_ih, const Tensor& bias, const Tensor& w_hh,
                      const Tensor& h0 = Tensor(), const Tensor& c0 = Tensor());

/// The slopes of one LSTM step that its backward recursion reads, for all
/// steps at once, as a differentiable op (what lstm_recurrence's recorded
/// backward builds on): act (T,B,4H) the gate activations [i, f, g, o]
/// (i, f, o = sig and g = tanh of the pre-activations), c (T,B,H) the cell
/// states c_t, c_prev (T,B,H) the states c_{t-1}
/// -> (T,B,6H): [f, k, j], k = o (1 - tanh^2 c_t),
///    j = [g i(1-i), c_{t-1} f(1-f), i (1-g^2), tanh(c_t) o(1-o)].
Tensor lstm_gate_slopes(const Tensor& act, const Tensor& c, const Tensor& c_prev);

/// The backward recursion of lstm_recurrence as a differentiable op (what its
/// recorded backward builds on): gout (2,T,B,H) the gradients of [h_t; c_t],
/// s (T,B,6H) = lstm_gate_slopes(...) = [f, k, j], w_hh (4H,H)
/// -> (T,B,5H): [dA_t; dc_t], dA_t the gradient of the pre-activation gates.
Tensor lstm_recurrence_grad(const Tensor& gout, const Tensor& s, const Tensor& w_hh);

/// The backward recursion of a one-state recurrence (the tanh RNN's, the
/// GRU's) as a differentiable op, what their recorded backwards build on:
/// g (T,B,H) the gradient of the output, a (T,B,H) the state's direct carry
/// (the GRU's z; undefined for none), j (T,B,QH) the slopes of the projected
/// pre-activations, w_hh (QH,H) -> u (T,B,H), the gradient reaching h_t:
/// u_t = g_t + a_{t+1} u_{t+1} + (u_{t+1} j_{t+1}) W, u spread over the Q gate blocks of j.
Tensor gated_recurrence_grad(const Tensor& g, const Tensor& a, const Tensor& j, const Tensor& w_hh);

/// xp (T,B,3H) = x W_ih^T + b_ih (gates r, z, n), w_hh (3H,H), b_hh (3H) or undefined, h0 (B,H)
/// -> (T,B,H): r, z = sig(xp_rz + h W_hrz^T + b_hrz); n = tanh(xp_n + r (h W_hn^T + b_hn));
///             h_t = (1 - z) n + z h_{t-1}
Tensor gru_recurrence(const Tensor& xp, const Tensor& w_hh, const Tensor& b_hh = Tensor(), const Tensor& h0 = Tensor());

}  // namespace tg
