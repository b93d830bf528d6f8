#pragma once
// What the fused recurrences (../rnn_ops.h) share; not installed. G is the gate
// width (H, 4H or 3H); every buffer is time-major, step t of a (T,B,K) at t*B*K.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/blas.h"
#include "autograd/onednn.h"
#include "autograd/op.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/parallel.h"

namespace tg::detail::rnn {

using detail::vsigmoid, detail::vtanh;  // the gates' nonlinearities (nn_kernels.h; float32's vectorise)

// Elements per parallel chunk of a step's pointwise pass (split over batch
// rows): fewer than kElementwiseGrain, since each gate costs an exp or two.
constexpr int64_t kGateGrain = 8192;

struct Dims {
  int64_t T, B, H;
};

// Rows [first, first + n) of the batch (batch rows never mix in a recurrence;
// step t of a (T,B,K) buffer holds them at (t*B + first)*K), or hidden units
// [first, first + n) of the state.
struct Rows {
  int64_t first, n;
};
using Units = Rows;

// Runs body(rows) over the batch split into one part per thread, each carried through all T steps with
// one-thread GEMMs (a step's is too small to thread well), for the backward-recursion ops. A part has >= 4
// rows and ~2^16 multiply-adds; the parts depend only on B and the thread count (same results when busy).
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

// The split of the recurrences over the pool, one part per thread, by hidden units or by batch rows.
// By units (the default): a part takes n units of every batch row, a barrier between steps. Its GEMM runs
// against its Q n rows of W_hh (rows_by_part) forward, its n columns backward; splitting the batch instead
// has every thread pack all of W_hh every step (1 MiB for the LSTM LM's, a core's L2). A part has >= 16
// units (whole vectors) and >= 2^17 multiply-adds a step, ~10 us against a barrier's 1: the study's H = 576
// RNN trains 1.9x faster at 2 threads than at 1 (unsplit, 1.1x).
// By rows: under bfloat16 autocast W_hh stays packed (one copy for all threads) for products of at most
// kPackedRows rows (onednn_gemm's b_generation), so that cost is gone; a part then takes its batch rows
// through all T steps with every unit, no barrier (rows never mix), and its product reads rows its own
// pointwise pass wrote.
// Chosen there when every thread gets a part of >= kMinRows rows: the LSTM LM (B = 32) at 2 threads spends
// 10% less in its recurrence so (lm_train --profile, fastest of 8 alternating runs); with more threads
// than that, units.
struct StepSplit {
  static constexpr int64_t kMinRows = 8;
  StepSplit(const Dims& d, int64_t Q, DType dtype)
      : B(d.B), H(d.H),
        by_rows(dtype == DType::f32 && autocast_enabled() && num_threads() > 1 &&
                d.B >= num_threads() * kMinRows && d.B <= num_threads() * detail::kPackedRows),
        parts(by_rows ? num_threads()
                      : std::max<int64_t>(1, std::min<int64_t>({num_threads(), d.H / 16, d.B * d.H * Q * d.H >> 17}))) {
  }
  // Part k: its units of its rows.
  struct Part {
    Units units;
    Rows rows;
  };
  Part operator[](int64_t k) const {
    if (by_rows) return {{0, H}, {B * k / parts, B * (k + 1) / parts - B * k / parts}};
    return {{first(k), first(k + 1) - first(k)}, {0, B}};
  }
  int64_t B, H;
  bool by_rows;
  int64_t parts;

 private:
  int64_t first(int64_t k) const { return k == parts ? H : H * k / parts / 16 * 16; }
};
using Part = StepSplit::Part;

// W_hh (QH,H) with each part's Q blocks of n rows next to each other; W_hh itself with one part or by rows.
template <class S>
Tensor rows_by_part(const Tensor& w, int64_t Q, const StepSplit& split) {
  if (split.parts == 1 || split.by_rows) return w;
  const int64_t H = split.H;
  Tensor out = empty({Q * H, H}, w.dtype());
  const S* from = w.data<S>();
  S* to = out.data<S>();
  for (int64_t k = 0; k < split.parts; ++k) {
    const Units u = split[k].units;
    for (int64_t q = 0; q < Q; ++q, to += u.n * H) std::copy_n(from + (q * H + u.first) * H, u.n * H, to);
  }
  return out;
}

// Runs every part's steps: by units step(part, s) for s = 0..steps-1 with a barrier after each, by rows
// each part's steps one after another on its own thread.
template <class F>
void run_parts(const StepSplit& split, int64_t steps, F&& step) {
  if (split.by_rows) {
    parallel_steps(split.parts, 1, [&](int64_t k, int64_t) {
      SerialGemm whole;  // the part's GEMMs on its own thread
      for (int64_t s = 0; s < steps; ++s) step(split[k], s);
    });
    return;
  }
  parallel_steps(split.parts, steps, [&](int64_t k, int64_t s) {
    SerialGemm whole;
    step(split[k], s);
  });
}

// Runs fwd(part, t, w, z) for the steps t of every part: w the part's rows of W_hh (Q n, H), z the
// scratch (B, Q n) of its units (its rows at z + rows.first * Q n), nullptr with one part by units and
// in_place (the kernel works in its output).
template <class S, class F>
void forward_by_parts(const Dims& d, int64_t Q, const Tensor& w, bool in_place, F&& fwd) {
  const StepSplit split(d, Q, w.dtype());
  const Tensor rows = rows_by_part<S>(w, Q, split);
  // By units the rows are a new tensor, not the parameter whose bfloat16 copy
  // autocast keeps; by rows W_hh may be a computed tensor autocast does not
  // keep: either is rounded once here, not by every step's GEMM.
  const detail::RoundOnce once(rows);
  const bool scratch_needed = !in_place || (split.parts > 1 && !split.by_rows);
  const Tensor scratch = scratch_needed ? empty({d.B, Q * d.H}, w.dtype()) : Tensor();
  run_parts(split, d.T, [&](Part p, int64_t t) {
    fwd(p, t, rows.data<S>() + Q * p.units.first * d.H,
        scratch.defined() ? scratch.data<S>() + d.B * Q * p.units.first : nullptr);
  });
}

// Runs bwd(part, c) for the calls c = 0..T of every part: first, for c > 0, the part's GEMM of step
// t = T - c into the gradient reaching h_{t-1} (or dh0); then, for c < T, the pointwise pass of step t - 1.
template <class F>
void backward_by_parts(const Dims& d, int64_t Q, DType dtype, F&& bwd) {
  run_parts(StepSplit(d, Q, dtype), d.T + 1, bwd);
}

// Checks the arguments of `op` (gates = G / H; w_ih for lstm_recompute) and returns (T, B, H).
Dims check_recurrence(std::string_view op, int64_t gates, const Tensor& xp, const Tensor& w_hh, const Tensor& b_hh,
                      const Tensor& h0, const Tensor& c0, const Tensor& w_ih = Tensor());

// Each of `others` (a tensor and its name) is defined and has first's dtype.
void check_same_dtypes(std::string_view op, const Tensor& first, const char* first_name,
                       std::initializer_list<std::pair<const Tensor*, const char*>> others);
inline Tensor contig(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
// The contiguous inputs of a forward, unrecorded (it saves the inputs as given). Callers name the
// elements by reference, not by structured binding: clang 14 lambdas cannot capture those.
template <class... Ts>
std::array<Tensor, sizeof...(Ts)> contig_all(const Ts&... t) {
  NoGradGuard ng;
  return {contig(t)...};
}
// contig() of the node's saved tensors in `fields`.
template <class... F>
std::array<Tensor, sizeof...(F)> saved_contig(const Node& n, F... fields) {
  return {contig(n.saved_tensor(fields))...};
}
// gin[k] = grads[k] for each input k that needs a gradient.
inline void set_needed(const Node& n, std::span<Tensor> gin, std::initializer_list<Tensor> grads) {
  size_t k = 0;
  for (const Tensor& g : grads)
    if (n.needs(k++)) gin[k - 1] = g;
}
template <class S>
S* ptr(const Tensor& t) {
  return t.defined() ? t.data<S>() : nullptr;
}

// Products with h_{t-1} of the n steps from t0 (rows t0-1.. of hs (T,B,H), h0 or nullptr before step 0):
// out (n,B,G) += h_{t-1} w^T, w (G,H), and its transpose dW (G,H) += sum_t dG_t^T h_{t-1}, dG (n,B,G).
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

// ---- Recorded backwards (create_graph): differentiable ops, what does not
// depend on the incoming gradient computed for all steps at once.

// The states before every step, (T,B,H): init (zeros when not given), then rows 0..T-2 of states.
Tensor previous_states(const Tensor& states, const Tensor& init);
// What a gradient D (T,B,G) of the pre-activations sends to the previous states: row t is D_{t+1} W, the last 0.
Tensor into_previous_states(const Tensor& D, const Tensor& w);
// Input k's tangent in a tangent rule's tangent_in (undefined: zero).
inline Tensor tangent_at(std::span<const Tensor> tangent_in, size_t k) {
  return k < tangent_in.size() ? tangent_in[k] : Tensor();
}
// The derivative of the sigmoid from its value s: s (1 - s).
Tensor sigmoid_slope(const Tensor& s);
// dW (G,H) = sum_t dG_t^T h_{t-1} from dG (T,B,G) and the previous states (T,B,H).
Tensor weight_grad_recorded(const Tensor& dG, const Tensor& hprev);
// u (...,H) spread over the Q = G/H gate blocks of j (...,G), times j.
Tensor spread_mul(const Tensor& u, const Tensor& j);

// gated_recurrence_grad's transpose in g, run forward in time (not recorded): U (T,B,H) with
//   U_t = du_t + a_t U_{t-1} + sum_q (U_{t-1} W^T)_q j_t,q,  U_{-1} = 0,
// a (T,B,H) or undefined, j (T,B,QH), w (QH,H): the tanh RNN's tangent, driven by du.
Tensor gated_recurrence_transpose(const Tensor& du, const Tensor& a, const Tensor& j, const Tensor& w);

// lstm_recurrence's backward_with_tangents (lstm_grad.cpp), fused; not where a gradient reached the gates.
bool lstm_backward_tangents(const Node& n, const Tensor& grad, std::span<Tensor> gin, std::span<Tensor> gin_tangents);

// The samples of rnn_tanh_recurrence (gates 1), lstm_recurrence (4, cell_state) and gru_recurrence (3, bias_input).
std::vector<OpSample> recurrence_samples(int gates, bool bias_input, bool cell_state);

}  // namespace tg::detail::rnn
