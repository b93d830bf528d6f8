#pragma once
// What the fused recurrences (autograd/ops/rnn/*.cpp, declared in
// ../rnn_ops.h) share: the gate nonlinearities, the batch and unit splits
// over the pool, argument checks, and the pieces of the recorded backwards.
// G is the gate width (H, 4H or 3H); every buffer is row-major time-major,
// step t of a (T,B,K) buffer at t*B*K. Internal to autograd/ops/rnn/ (not
// installed).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "autograd/blas.h"
#include "autograd/op.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/parallel.h"

namespace tg::detail::rnn {

// Gate nonlinearities. float32 builds them on nn_kernels.h's polynomial exp,
// so the pointwise loops vectorise (within 3 ulp of libm: sigmoid 2.5, tanh
// 2.7); float64 keeps libm, for gradchecks and parity to 1e-10.
inline float sigmoid_gate(float x) { return 1.0f / (1.0f + detail::vexp(std::min(-x, 88.0f))); }
inline double sigmoid_gate(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline float tanh_gate(float x) {
  // (1 - e^-2|x|) / (1 + e^-2|x|) cancels for small |x|: there, the Taylor series to x^11.
  const float a = std::abs(x), e = detail::vexp(-2.0f * a), x2 = x * x;
  const float series =
      x * (1.0f +
           x2 * (-1.0f / 3 + x2 * (2.0f / 15 + x2 * (-17.0f / 315 + x2 * (62.0f / 2835 + x2 * (-1382.0f / 155925))))));
  return a < 0.3f ? series : std::copysign((1.0f - e) / (1.0f + e), x);
}
inline double tanh_gate(double x) { return std::tanh(x); }

// Elements per parallel chunk of a step's pointwise pass: fewer than
// kElementwiseGrain, since each gate value costs an exp or two. The passes
// split over the batch rows (row_grain(G, kGateGrain) rows of G gates).
constexpr int64_t kGateGrain = 8192;

struct Dims {
  int64_t T, B, H;
};

// Rows [first, first + n) of the batch. Batch rows never mix in a recurrence,
// so the kernels below take a range of rows and carry it through every step;
// step t of a (T,B,K) buffer holds the range's rows at (t*B + first)*K, n*K
// elements, one after another.
struct Rows {
  int64_t first, n;
};

// Runs body(rows) over the batch split into one part per thread, each part
// carried through all T steps by one thread with one-thread GEMMs, no barrier
// between steps: for the backward-recursion ops of higher-order gradients
// (the recurrences themselves split their units, UnitSplit below). A step's
// GEMM (B x H by H x G) is
// too small for OpenBLAS to thread well, and threading each of the T steps
// would wake the threads twice a step. A part
// has at least 4 rows (a GEMM's rows) and ~2^16 multiply-adds; with one part,
// the whole batch runs on this thread, OpenBLAS threading its GEMMs and the
// pointwise passes splitting over rows. The parts depend only on B and the
// thread count: when the pool is busy (another thread of the program uses
// it), they run one after another here, with the same results.
template <class F>
void for_batch_rows(const Dims& d, int64_t G, F&& body) {
  const int64_t grain = std::max<int64_t>(4, (int64_t{1} << 16) / std::max<int64_t>(1, d.T * d.H * G));
  const int64_t parts = std::min<int64_t>(num_threads(), d.B / grain);
  if (parts <= 1) {
    body(Rows{0, d.B});
    return;
  }
  auto part = [&](int64_t c) {
    SerialGemm whole;  // this part's GEMMs on this thread
    const int64_t b0 = d.B * c / parts, b1 = d.B * (c + 1) / parts;
    body(Rows{b0, b1 - b0});
  };
  auto run = [](void* ctx, int64_t c) { (*static_cast<decltype(part)*>(ctx))(c); };
  if (!detail::run_chunks(parts, run, &part))
    for (int64_t c = 0; c < parts; ++c) part(c);
}

// Hidden units [first, first + n) of the state.
struct Units {
  int64_t first, n;
};

// The split of the recurrences (RNN, LSTM, GRU) over the pool: the hidden
// units in one part per thread, each step's parts run at once and a barrier
// between steps (parallel_steps), since a step reads all of the one before.
// Forward, a part computes its units' Q gate blocks with one (B, Q n) GEMM
// against its own Q n rows of W_hh (rows_by_part) into a (B, Q n) scratch,
// then its units of h_t; backward, its units of the gradient reaching h_{t-1}
// with one GEMM against its n columns of W_hh. Splitting the batch instead
// (as the backward-recursion ops do) has every thread read and
// pack all of W_hh at every step -- 1 MiB for the LSTM LM's in float32, a
// core's L2 -- and run GEMMs of half the rows. A part has >= 16 units (a
// multiple of 16 but the last: whole vectors in the pointwise passes) and
// >= 2^17 multiply-adds a step, ~10 microseconds against a barrier's one: so
// one sequence of the study's H = 576 RNN (3.3e5 a step) splits (it trains
// 1.9x faster at 2 threads than at 1; unsplit, 1.1x).
// With one part the RNN and the LSTM work in place, as without a split.
struct UnitSplit {
  UnitSplit(const Dims& d, int64_t Q)
      : H(d.H), parts(std::max<int64_t>(1, std::min<int64_t>({num_threads(), d.H / 16, (d.B * d.H * Q * d.H) >> 17}))) {}
  Units operator[](int64_t k) const { return {first(k), first(k + 1) - first(k)}; }
  int64_t H, parts;

 private:
  int64_t first(int64_t k) const { return k == parts ? H : H * k / parts / 16 * 16; }
};

// W_hh (QH,H) with each part's Q blocks of n rows next to each other, part
// k's from row Q first; W_hh itself with one part.
template <class S>
Tensor rows_by_part(const Tensor& w, int64_t Q, const UnitSplit& split) {
  if (split.parts == 1) return w;
  const int64_t H = split.H;
  Tensor out = empty({Q * H, H}, w.dtype());
  const S* from = w.data<S>();
  S* to = out.data<S>();
  for (int64_t k = 0; k < split.parts; ++k) {
    const Units u = split[k];
    for (int64_t q = 0; q < Q; ++q, to += u.n * H) std::copy_n(from + (q * H + u.first) * H, u.n * H, to);
  }
  return out;
}

// Runs fwd(units, t, w, z) for the steps t = 0..T-1 of every part: w the
// part's rows of W_hh (Q n, H), z its scratch (B, Q n); with one part and
// in_place, z is nullptr (the kernel works in its output).
template <class S, class F>
void forward_by_units(const Dims& d, int64_t Q, const Tensor& w, bool in_place, F&& fwd) {
  const UnitSplit split(d, Q);
  const Tensor rows = rows_by_part<S>(w, Q, split);
  const Tensor scratch = split.parts > 1 || !in_place ? empty({d.B, Q * d.H}, w.dtype()) : Tensor();
  parallel_steps(split.parts, d.T, [&](int64_t k, int64_t t) {
    SerialGemm whole;  // the part's GEMM on its own thread
    const Units u = split[k];
    fwd(u, t, rows.data<S>() + Q * u.first * d.H, scratch.defined() ? scratch.data<S>() + d.B * Q * u.first : nullptr);
  });
}

// Runs bwd(units, c) for the calls c = 0..T of every part (see the kernels).
template <class F>
void backward_by_units(const Dims& d, int64_t Q, F&& bwd) {
  const UnitSplit split(d, Q);
  parallel_steps(split.parts, d.T + 1, [&](int64_t k, int64_t c) {
    SerialGemm whole;
    bwd(split[k], c);
  });
}

// Checks the arguments of `op` (gates = G / H) and returns (T, B, H).
Dims check_recurrence(std::string_view op, int64_t gates, const Tensor& xp, const Tensor& w_hh, const Tensor& b_hh,
                      const Tensor& h0, const Tensor& c0);

// Each of `others` (a tensor and its name) is defined and has the dtype of first (named first_name).
void check_same_dtypes(std::string_view op, const Tensor& first, const char* first_name,
                       std::initializer_list<std::pair<const Tensor*, const char*>> others);
inline Tensor contig(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
template <class S>
S* ptr(const Tensor& t) {
  return t.defined() ? t.data<S>() : nullptr;
}

// The products with the previous states h_{t-1} of the n steps from t0: rows
// t0-1.. of hs (T,B,H), and h0 (nullptr: zero) before step 0. One GEMM over
// the steps whose previous state is in hs, plus step 0's term when h0 is given.
//   add_previous_states_times: out (n,B,G) += h_{t-1} w^T, w (G,H) -- the
//     recurrent term of the pre-activations, or (w a weight's tangent) the
//     drive of a tangent recurrence;
//   add_weight_grad, its transpose: dW (G,H) += sum_t dG_t^T h_{t-1}, dG (n,B,G).
template <class S>
void add_previous_states_times(const Dims& d, int64_t G, int64_t t0, int64_t n, const S* w, const S* hs,
                               const S* h0, S* out) {
  const int64_t B = d.B, H = d.H;
  if (t0 > 0) return gemm(false, true, n * B, G, H, S(1), hs + (t0 - 1) * B * H, H, w, H, S(1), out, G);
  if (n > 1) gemm(false, true, (n - 1) * B, G, H, S(1), hs, H, w, H, S(1), out + B * G, G);
  if (h0) gemm(false, true, B, G, H, S(1), h0, H, w, H, S(1), out, G);
}
template <class S>
void add_weight_grad(const Dims& d, int64_t G, int64_t t0, int64_t n, const S* dG, const S* hs, const S* h0, S* dW) {
  const int64_t B = d.B, H = d.H;
  if (t0 > 0) return gemm(true, false, G, H, n * B, S(1), dG, G, hs + (t0 - 1) * B * H, H, S(1), dW, H);
  if (n > 1) gemm(true, false, G, H, (n - 1) * B, S(1), dG + B * G, G, hs, H, S(1), dW, H);
  if (h0) gemm(true, false, G, H, B, S(1), dG, G, h0, H, S(1), dW, H);
}

// dW (G,H) = sum over all T steps of dG_t^T h_{t-1}, dG (T,B,G).
template <class S>
Tensor weight_grad(const Dims& d, int64_t G, const S* dG, const S* hs, const S* h0, DType dtype) {
  Tensor dW = zeros({G, d.H}, dtype);
  add_weight_grad(d, G, 0, d.T, dG, hs, h0, dW.data<S>());
  return dW;
}

// ---- Recorded backward (create_graph). Each backward also has a form in
// differentiable ops, taken when it is recorded, with h_t (and c_t) read from
// the output, which is then attached to this node, and the gates from the
// activations, a side output of the node (tanh's slope needs only h_t).
// Whatever does not depend on the incoming gradient is computed for all
// steps at once; the recursion through time is one op of its
// own (gated_recurrence_grad, lstm_recurrence_grad) with a fused kernel for its
// backward, so a Hessian-vector product costs a few fused passes. Every op
// used is differentiable again, so the gradients are, to any order. Forward
// saves the inputs themselves, not its contiguous copies, so that they carry
// their graph into it; the plain backward makes them contiguous (a no-op for
// the usual contiguous weights and states).

// The states before every step, (T,B,H): the initial state (zeros when not
// given), then rows 0..T-2 of states.
Tensor previous_states(const Tensor& states, const Tensor& init);
// What a gradient D (T,B,G) of the pre-activations sends through
// h_{t-1} W^T to the previous states, one row early: row t is D_{t+1} W, the
// last row zero, (T,B,H).
Tensor into_previous_states(const Tensor& D, const Tensor& w);
// Input k's tangent in a tangent rule's tangent_in (undefined: zero).
inline Tensor tangent_at(std::span<const Tensor> tangent_in, size_t k) {
  return k < tangent_in.size() ? tangent_in[k] : Tensor();
}
// x (T,B,K) one step early: row t is x_{t+1}, the last row zero.
Tensor next_steps(const Tensor& x);
// The derivative of the sigmoid from its value s: s (1 - s).
Tensor sigmoid_slope(const Tensor& s);
// dW (G,H) = sum_t dG_t^T h_{t-1} from dG (T,B,G) and the previous states (T,B,H).
Tensor weight_grad_recorded(const Tensor& dG, const Tensor& hprev);
// u (...,H) spread over the Q = G/H gate blocks of j (...,G), times j.
Tensor spread_mul(const Tensor& u, const Tensor& j);

// gated_recurrence_grad's transpose in g, its adjoint recursion run forward
// in time (raw kernels, not recorded): U (T,B,H) with
//   U_t = du_t + a_t U_{t-1} + sum_q (U_{t-1} W^T)_q j_t,q,  U_{-1} = 0,
// a (T,B,H) or undefined, j (T,B,QH), w (QH,H). Driven by du, the part of a
// tangent that does not come through the previous state, U is the tangent
// of the states of the recurrence whose backward recursion
// gated_recurrence_grad is: the tanh RNN's and the GRU's forward mode.
Tensor gated_recurrence_transpose(const Tensor& du, const Tensor& a, const Tensor& j, const Tensor& w);

// Forward over reverse (OpSpec::backward_with_tangents): lstm_recurrence's
// gradients gin = [dxp, dW, dh0, dc0] (dW only with need_weight), and their
// tangents in gin_tangents, from the incoming gradient and what forward saved:
// w_hh, h0 and c0 (either may be undefined), the gate activations act and the output out.
void lstm_backward_tangents(const Tensor& grad, const Tensor& w, const Tensor& h0, const Tensor& c0,
                            const Tensor& act, const Tensor& out, bool need_weight, std::span<Tensor> gin,
                            std::span<Tensor> gin_tangents);

// The op table's samples of rnn_tanh_recurrence (gates 1), lstm_recurrence
// (gates 4, cell_state) and gru_recurrence (gates 3, bias_input).
std::vector<OpSample> recurrence_samples(int gates, bool bias_input, bool cell_state);

}  // namespace tg::detail::rnn
