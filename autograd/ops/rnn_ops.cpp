// Fused recurrences (see rnn_ops.h): forward kernel, backward kernel and OpDef
// of each cell type side by side. G is the gate width (H, 4H or 3H); every
// buffer is row-major time-major, step t of a (T,B,K) buffer at t*B*K.
#include "autograd/ops/rnn_ops.h"

#include <algorithm>
#include <cmath>

#include "autograd/blas.h"
#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
using detail::row_grain;

namespace {

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
// >= 2^18 multiply-adds a step, tens of microseconds against a barrier's one.
// With one part the RNN and the LSTM work in place, as without a split.
struct UnitSplit {
  UnitSplit(const Dims& d, int64_t Q)
      : H(d.H), parts(std::max<int64_t>(1, std::min<int64_t>({num_threads(), d.H / 16, (d.B * d.H * Q * d.H) >> 18}))) {}
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
                      const Tensor& h0, const Tensor& c0) {
  detail::check_floating(op, xp, "xp");
  detail::check_defined(op, w_hh, "w_hh");
  if (w_hh.dim() != 2 || w_hh.size(0) != gates * w_hh.size(1))
    throw ShapeError(fmt::format("{}: w_hh {} must be ({}H,H)", op, w_hh.shape(), gates));
  const int64_t H = w_hh.size(1);
  if (xp.dim() != 3 || xp.size(2) != gates * H)
    throw ShapeError(fmt::format("{}: xp {} must be (T,B,{}) for w_hh {}", op, xp.shape(), gates * H, w_hh.shape()));
  const int64_t T = xp.size(0), B = xp.size(1);
  if (T < 1) throw ShapeError(fmt::format("{}: xp {} has no time step", op, xp.shape()));
  auto check = [&](const Tensor& t, const char* name, const Shape& want) {
    if (!t.defined()) return;
    if (t.dtype() != xp.dtype())
      throw DTypeError(fmt::format("{}: {} is {}, xp is {}", op, name, dtype_name(t.dtype()), dtype_name(xp.dtype())));
    if (!(t.shape() == want)) throw ShapeError(fmt::format("{}: {} {} must be {}", op, name, t.shape(), want));
  };
  check(w_hh, "w_hh", w_hh.shape());
  check(b_hh, "b_hh", Shape{gates * H});
  check(h0, "h0", Shape{B, H});
  check(c0, "c0", Shape{B, H});
  return {T, B, H};
}

// Each of `others` (a tensor and its name) is defined and has the dtype of first (named first_name).
void check_same_dtypes(std::string_view op, const Tensor& first, const char* first_name,
                       std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  for (auto [t, name] : others) {
    detail::check_defined(op, *t, name);
    if (t->dtype() != first.dtype())
      throw DTypeError(fmt::format("{}: {} is {}, {} is {}", op, name, dtype_name(t->dtype()), first_name,
                                   dtype_name(first.dtype())));
  }
}
Tensor contig(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
template <class S>
S* ptr(const Tensor& t) {
  return t.defined() ? t.data<S>() : nullptr;
}

// dW (G,H) = sum_t dG_t^T h_{t-1}: one GEMM over steps 1..T-1 (whose previous
// states are the output rows 0..T-2) plus step 0's term when h0 is given.
template <class S>
Tensor weight_grad(const Dims& d, int64_t G, const S* dG, const S* hs, const S* h0, DType dtype) {
  const int64_t T = d.T, B = d.B, H = d.H;
  Tensor dW = zeros({G, H}, dtype);
  S* w = dW.data<S>();
  if (T > 1) gemm(true, false, G, H, (T - 1) * B, S(1), dG + B * G, G, hs, H, S(0), w, H);
  if (h0) gemm(true, false, G, H, B, S(1), dG, G, h0, H, S(1), w, H);
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
Tensor previous_states(const Tensor& states, const Tensor& init) {
  const int64_t T = states.size(0), B = states.size(1), H = states.size(2);
  const Tensor first = reshape(init.defined() ? init : zeros({B, H}, states.dtype()), {1, B, H});
  return T == 1 ? first : concat({first, narrow(states, 0, 0, T - 1)}, 0);
}
// What a gradient D (T,B,G) of the pre-activations sends through
// h_{t-1} W^T to the previous states, one row early: row t is D_{t+1} W, the
// last row zero, (T,B,H).
Tensor into_previous_states(const Tensor& D, const Tensor& w) {
  const int64_t T = D.size(0), B = D.size(1), H = w.size(1);
  const Tensor last = zeros({1, B, H}, D.dtype());
  if (T == 1) return last;
  return concat({reshape(matmul(reshape(narrow(D, 0, 1, T - 1), {(T - 1) * B, D.size(2)}), w), {T - 1, B, H}), last},
                0);
}
// The derivative of the sigmoid from its value s: s (1 - s).
Tensor sigmoid_slope(const Tensor& s) { return mul(s, rsub(1.0, s)); }
// dW (G,H) = sum_t dG_t^T h_{t-1} from dG (T,B,G) and the previous states (T,B,H).
Tensor weight_grad_recorded(const Tensor& dG, const Tensor& hprev) {
  return matmul(transpose(reshape(dG, {-1, dG.size(2)}), 0, 1), reshape(hprev, {-1, hprev.size(2)}));
}

std::vector<OpSample> recurrence_samples(int gates, bool bias_input, bool cell_state) {
  using samples::uniform;
  const int64_t T = 3, B = 2, H = 3, G = gates * H;
  auto fn = [bias_input, cell_state](bool with_state) {
    return [=](const std::vector<Tensor>& x) {
      Tensor h0 = with_state ? x[bias_input ? 3 : 2] : Tensor();
      if (cell_state) return lstm_recurrence(x[0], x[1], h0, with_state ? x[3] : Tensor());
      if (bias_input) return gru_recurrence(x[0], x[1], x[2], h0);
      return rnn_tanh_recurrence(x[0], x[1], h0);
    };
  };
  std::vector<Tensor> with_state = {uniform({T, B, G}, 201, -2, 2), uniform({G, H}, 202)};
  std::vector<Tensor> zero_state = {samples::strided({T, B, G}, 203, -2, 2), uniform({G, H}, 204)};
  if (bias_input) {
    with_state.push_back(uniform({G}, 205));
    zero_state.push_back(uniform({G}, 206));
  }
  with_state.push_back(uniform({B, H}, 207));
  if (cell_state) with_state.push_back(uniform({B, H}, 208));
  return {
      {"T=3 B=2 H=3 with initial state", with_state, fn(true)},
      {"zero initial state, non-contiguous xp", zero_state, fn(false)},
      {"one step",
       {uniform({1, B, G}, 209, -2, 2), uniform({G, H}, 210)},
       [=](const std::vector<Tensor>& x) {
         if (cell_state) return lstm_recurrence(x[0], x[1]);
         if (bias_input) return gru_recurrence(x[0], x[1]);
         return rnn_tanh_recurrence(x[0], x[1]);
       }},
  };
}

}  // namespace

// ============================ rnn_tanh_recurrence ============================
// Saves w_hh, h0 and the output (tanh' = 1 - h^2); the recorded backward needs nothing more.
namespace {
struct RnnTanhSaved {
  enum : size_t { kWeight, kH0, kOutput };  // w_hh and h0 as given (h0 may be undefined)
};
}  // namespace
// Step t of units u (see UnitSplit): w their rows of W_hh (n,H), z the
// part's scratch (B,n), nullptr for all units (h_t itself then).
template <class S>
static void rnn_tanh_forward_step(const Dims& d, Units u, int64_t t, const S* xp, const S* w, const S* h0, S* z,
                                  S* hs) {
  const int64_t B = d.B, H = d.H, n = u.n;
  S* h = hs + t * B * H;
  const S* hprev = t > 0 ? h - B * H : h0;
  if (!z) z = h;
  for (int64_t b = 0; b < B; ++b) std::copy_n(xp + (t * B + b) * H + u.first, n, z + b * n);
  if (hprev) gemm(false, true, B, n, H, S(1), hprev, H, w, H, S(1), z, n);
  parallel_for(B, row_grain(n, kGateGrain), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const S* zb = z + b * n;
      S* hb = h + b * H + u.first;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) hb[j] = tanh_gate(zb[j]);
    }
  });
}

// Call c = 0..T of units u (see UnitSplit): first, for c > 0, the GEMM of
// step t = T - c, these units of the gradient reaching h_{t-1} (rec, or dh0
// at t = 0) from all of da_t; then, for c < T, the pointwise pass of step
// t - 1 on these units. rec (B,H) is zero on entry.
template <class S>
static void rnn_tanh_backward_call(const Dims& d, Units u, int64_t c, const S* gout, const S* w, const S* hs,
                                   S* dA, S* rec, S* dh0) {
  const int64_t T = d.T, B = d.B, H = d.H, n = u.n;
  if (S* to = c == T ? dh0 : rec; c > 0 && to)
    gemm(false, false, B, n, H, S(1), dA + (T - c) * B * H, H, w + u.first, H, S(0), to + u.first, H);
  if (c == T) return;
  const int64_t at = (T - 1 - c) * B * H + u.first;
  parallel_for(B, row_grain(n, kGateGrain), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const S *h = hs + at + b * H, *g = gout + at + b * H, *dh = rec + b * H + u.first;
      S* da = dA + at + b * H;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) da[j] = (g[j] + dh[j]) * (S(1) - h[j] * h[j]);
    }
  });
}

// Recorded: h_t = tanh(a_t), a_t = xp_t + h_{t-1} W^T; with k = 1 - h_t^2
// for all steps at once, the gradient u_t reaching h_t is one
// gated_recurrence_grad node (u_t = g_t + (u_{t+1} k_{t+1}) W), and
// da = u k, dW = sum_t da_t^T h_{t-1} (one GEMM), dh0 = da_0 W.
static void rnn_tanh_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor w = n.saved_tensor(RnnTanhSaved::kWeight), h0 = n.saved_tensor(RnnTanhSaved::kH0);
  const Tensor out = n.saved_tensor(RnnTanhSaved::kOutput);
  const Tensor k = rsub(1.0, mul(out, out));
  const Tensor dA = mul(gated_recurrence_grad(grad, Tensor(), k, w), k);
  if (n.needs(0)) gin[0] = dA;
  if (n.needs(1)) gin[1] = weight_grad_recorded(dA, previous_states(out, h0));
  if (n.needs(2)) gin[2] = matmul(select(dA, 0, 0), w);
}

static void rnn_tanh_recurrence_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  if (grad_enabled()) return rnn_tanh_backward_recorded(n, grad, gin);
  const Tensor w = contig(n.saved_tensor(RnnTanhSaved::kWeight)), h0 = contig(n.saved_tensor(RnnTanhSaved::kH0));
  const Tensor out = n.saved_tensor(RnnTanhSaved::kOutput);
  const Dims d{out.size(0), out.size(1), out.size(2)};
  Tensor g = grad.contiguous();
  Tensor dA = empty(out.shape(), out.dtype());
  Tensor dh0 = n.needs(2) ? empty({d.B, d.H}, out.dtype()) : Tensor();
  Tensor rec = zeros({d.B, d.H}, out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    backward_by_units(d, 1, [&](Units u, int64_t c) {
      rnn_tanh_backward_call(d, u, c, g.data<scalar_t>(), w.data<scalar_t>(), out.data<scalar_t>(),
                             dA.data<scalar_t>(), rec.data<scalar_t>(), ptr<scalar_t>(dh0));
    });
    if (n.needs(1))
      gin[1] = weight_grad<scalar_t>(d, d.H, dA.data<scalar_t>(), out.data<scalar_t>(), ptr<scalar_t>(h0), out.dtype());
  });
  if (n.needs(0)) gin[0] = dA;
  if (n.needs(2)) gin[2] = dh0;
}
// The recurrence ops take their tangents from their recorded backward
// (tangent_from_backward: two backward passes of the op per tangent).
static const OpDef rnn_tanh_recurrence_op("rnn_tanh_recurrence", 3,
                                          "rnn_tanh_recurrence(xp (T,B,H), w_hh (H,H), h0 (B,H)) -> (T,B,H)",
                                          "w_hh, h0, output", rnn_tanh_recurrence_backward, tangent_from_backward,
                                          [] { return recurrence_samples(1, false, false); });

Tensor rnn_tanh_recurrence(const Tensor& xp_in, const Tensor& w_in, const Tensor& h0_in) {
  ProfileScope prof(rnn_tanh_recurrence_op.name);
  const Dims d = check_recurrence(rnn_tanh_recurrence_op.name, 1, xp_in, w_in, Tensor(), h0_in, Tensor());
  Tensor xp, w, h0;
  {
    NoGradGuard ng;
    xp = contig(xp_in), w = contig(w_in), h0 = contig(h0_in);
  }
  Tensor out = empty({d.T, d.B, d.H}, xp.dtype());
  dispatch_float(xp.dtype(), rnn_tanh_recurrence_op.name, [&](auto tag) {
    using scalar_t = decltype(tag);
    forward_by_units<scalar_t>(d, 1, w, true, [&](Units u, int64_t t, const scalar_t* wu, scalar_t* z) {
      rnn_tanh_forward_step(d, u, t, xp.data<scalar_t>(), wu, ptr<scalar_t>(h0), z, out.data<scalar_t>());
    });
  });
  if (Node* n = record(rnn_tanh_recurrence_op, out, xp_in, w_in, h0_in)) {
    n->save(w_in);   // RnnTanhSaved::kWeight
    n->save(h0_in);  // kH0
    n->save(out);    // kOutput
  }
  return out;
}

// ============================ gated_recurrence_grad ============================
// The backward recursion through time of a recurrence with one state, the
// tanh RNN's and the GRU's, as an op of its own (see lstm_recurrence_grad for
// why). With g (T,B,H) the gradient of the output, a (T,B,H) the state's
// direct carry (the GRU's z; none for the RNN) and j (T,B,G) the slopes of the
// G = Q H projected pre-activations, going t = T-1 .. 0:
//   u_t = g_t + a_{t+1} u_{t+1} + P_{t+1} W,  P_t = u_t j_t  (B,G)
// u_t spread over the Q gate blocks of j_t. The output is u (T,B,H), the
// gradient reaching h_t. Its backward, t = 0 .. T-1, with U_t the total
// gradient of u_t and R_t = U_{t-1} W^T (B,G) (both zero at t = 0):
//   U_t = du_t + a_t U_{t-1} + sum_q R_t,q j_t,q
// gives d g_t = U_t, d a_t = U_{t-1} u_t, d j_t,q = R_t,q u_t, dW = sum_{t>0} P_t^T U_{t-1}.
namespace {
struct GatedGradSaved {
  enum : size_t { kCarry, kSlopes, kWeight, kOutput, kP };  // a may be undefined; P (T,B,G) from forward
};
}  // namespace

template <class S>
static void gated_grad_forward(const Dims& d, int64_t G, Rows rows, const S* g, const S* a, const S* j, const S* w,
                               S* us, S* ps, S* eh) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, Q = G / H;
  S* e = eh + rows.first * H;  // P_{t+1} W
  for (int64_t t = T; t-- > 0;) {
    const int64_t r = t * B + rows.first;
    const S *gt = g + r * H, *jt = j + r * G;
    const S* an = t + 1 < T && a ? a + (r + B) * H : nullptr;  // a_{t+1}
    S *u = us + r * H, *P = ps + r * G;
    const S* un = t + 1 < T ? u + B * H : nullptr;  // u_{t+1}
#pragma omp simd
    for (int64_t i = 0; i < n * H; ++i) u[i] = gt[i] + (un ? e[i] + (an ? an[i] * un[i] : S(0)) : S(0));
    for (int64_t b = 0; b < n; ++b)
      for (int64_t q = 0; q < Q; ++q) {
        const S *ub = u + b * H, *jb = jt + b * G + q * H;
        S* pb = P + b * G + q * H;
#pragma omp simd
        for (int64_t i = 0; i < H; ++i) pb[i] = ub[i] * jb[i];
      }
    if (t > 0) gemm(false, false, n, H, G, S(1), P, G, w, H, S(0), e, H);
  }
}

// rt (B,G) is scratch.
template <class S>
static void gated_grad_adjoint(const Dims& d, int64_t G, Rows rows, const S* gy, const S* a, const S* j, const S* w,
                               const S* us, S* dg, S* da, S* dj, S* rt) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, Q = G / H;
  S* R = rt + rows.first * G;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = t * B + rows.first;
    const S *jt = j + r * G, *u = us + r * H, *at = a ? a + r * H : nullptr;
    S *U = dg + r * H, *dat = da ? da + r * H : nullptr, *djt = dj + r * G;
    std::copy_n(gy + r * H, n * H, U);
    if (t == 0) {
      if (dat) std::fill_n(dat, n * H, S(0));
      std::fill_n(djt, n * G, S(0));
      continue;
    }
    const S* Up = U - B * H;  // U_{t-1}
    gemm(false, true, n, G, H, S(1), Up, H, w, H, S(0), R, G);
    for (int64_t b = 0; b < n; ++b) {
      const int64_t x = b * H;
      for (int64_t q = 0; q < Q; ++q) {
        const S *Rb = R + b * G + q * H, *jb = jt + b * G + q * H;
        S* djb = djt + b * G + q * H;
#pragma omp simd
        for (int64_t i = 0; i < H; ++i) {
          U[x + i] += Rb[i] * jb[i];
          djb[i] = Rb[i] * u[x + i];
        }
      }
      if (at) {
#pragma omp simd
        for (int64_t i = 0; i < H; ++i) {
          U[x + i] += at[x + i] * Up[x + i];
          dat[x + i] = Up[x + i] * u[x + i];
        }
      }
    }
  }
}

// u (...,H) spread over the Q = G/H gate blocks of j (...,G), times j.
Tensor spread_mul(const Tensor& u, const Tensor& j) {
  const int64_t H = u.size(-1), Q = j.size(-1) / H;
  Shape us = u.shape(), js = u.shape();  // (...,1,H) and (...,Q,H)
  us.insert(us.size() - 1, 1);
  js.insert(js.size() - 1, Q);
  return reshape(mul(reshape(u, us), reshape(j, js)), j.shape());
}
// sum_q R_q j_q over the Q gate blocks of R, j (...,G) -> (...,H).
Tensor gate_sum(const Tensor& R, const Tensor& j, int64_t H) {
  Shape s = R.shape();  // (...,Q,H)
  s[s.size() - 1] = R.size(-1) / H;
  s.push_back(H);
  return sum(reshape(mul(R, j), s), {static_cast<int64_t>(s.size()) - 2});
}

// Recorded (third and higher derivatives): the adjoint above in tensor ops,
// step by step; P recomputed from the output.
static void gated_grad_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor a = n.saved_tensor(GatedGradSaved::kCarry), j = n.saved_tensor(GatedGradSaved::kSlopes);
  const Tensor w = n.saved_tensor(GatedGradSaved::kWeight), u = n.saved_tensor(GatedGradSaved::kOutput);
  const int64_t T = u.size(0), H = u.size(2);
  const Tensor wt = transpose(w, 0, 1);
  std::vector<Tensor> dg(T), da(T), dj(T);
  for (int64_t t = 0; t < T; ++t) {
    const Tensor ut = select(u, 0, t), jt = select(j, 0, t);
    if (t == 0) {
      dg[0] = select(grad, 0, 0);
      da[0] = mul(ut, 0.0);  // zero, kept in the graph
      dj[0] = mul(jt, 0.0);
      continue;
    }
    const Tensor R = matmul(dg[t - 1], wt);
    dg[t] = add(select(grad, 0, t), gate_sum(R, jt, H));
    if (a.defined()) dg[t] = add(dg[t], mul(select(a, 0, t), dg[t - 1]));
    da[t] = mul(dg[t - 1], ut);
    dj[t] = spread_mul(ut, R);
  }
  const Tensor dU = stack(dg, 0);
  if (n.needs(0)) gin[0] = dU;
  if (n.needs(1)) gin[1] = stack(da, 0);
  if (n.needs(2)) gin[2] = stack(dj, 0);
  if (n.needs(3))  // zero for one step, as a product so that it stays in the graph
    gin[3] = T > 1 ? weight_grad_recorded(spread_mul(narrow(u, 0, 1, T - 1), narrow(j, 0, 1, T - 1)),
                                          narrow(dU, 0, 0, T - 1))
                   : mul(w, 0.0);
}

static void gated_recurrence_grad_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  if (grad_enabled()) return gated_grad_backward_recorded(n, grad, gin);
  const Tensor a = contig(n.saved_tensor(GatedGradSaved::kCarry)), j = contig(n.saved_tensor(GatedGradSaved::kSlopes));
  const Tensor w = contig(n.saved_tensor(GatedGradSaved::kWeight)), u = n.saved_tensor(GatedGradSaved::kOutput);
  const Tensor P = n.saved_tensor(GatedGradSaved::kP);
  const Dims d{u.size(0), u.size(1), u.size(2)};
  const int64_t G = j.size(2);
  const Tensor gy = grad.contiguous();
  Tensor dg = empty(u.shape(), u.dtype()), dj = empty(j.shape(), u.dtype());
  Tensor da = a.defined() ? empty(u.shape(), u.dtype()) : Tensor();
  Tensor scratch = empty({d.B, G}, u.dtype());
  dispatch_float(u.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    for_batch_rows(d, G, [&](Rows rows) {
      gated_grad_adjoint<scalar_t>(d, G, rows, gy.data<scalar_t>(), ptr<scalar_t>(a), j.data<scalar_t>(),
                                   w.data<scalar_t>(), u.data<scalar_t>(), dg.data<scalar_t>(), ptr<scalar_t>(da),
                                   dj.data<scalar_t>(), scratch.data<scalar_t>());
    });
    if (n.needs(3)) {
      // dW (G,H) = sum_{t>0} P_t^T U_{t-1}.
      Tensor dW = zeros({G, d.H}, u.dtype());
      if (d.T > 1)
        gemm(true, false, G, d.H, (d.T - 1) * d.B, scalar_t(1), P.data<scalar_t>() + d.B * G, G,
             dg.data<scalar_t>(), d.H, scalar_t(0), dW.data<scalar_t>(), d.H);
      gin[3] = dW;
    }
  });
  if (n.needs(0)) gin[0] = dg;
  if (n.needs(1)) gin[1] = da;
  if (n.needs(2)) gin[2] = dj;
}
static const OpDef gated_recurrence_grad_op(
    "gated_recurrence_grad", 4,
    "gated_recurrence_grad(g (T,B,H), a (T,B,H) or undefined, j (T,B,QH), w_hh (QH,H)) -> u (T,B,H)",
    "a, j, w_hh, output, P = u j (T,B,QH)", gated_recurrence_grad_backward, tangent_from_backward, [] {
      using samples::uniform;
      const int64_t T = 3, B = 2, H = 3;
      return std::vector<OpSample>{
          {"GRU-shaped, Q=3",
           {uniform({T, B, H}, 221), uniform({T, B, H}, 222, 0, 1), uniform({T, B, 3 * H}, 223),
            uniform({3 * H, H}, 224)},
           [](const std::vector<Tensor>& x) { return gated_recurrence_grad(x[0], x[1], x[2], x[3]); }},
          {"RNN-shaped, no carry, Q=1",
           {uniform({T, B, H}, 225), uniform({T, B, H}, 226, 0, 1), uniform({H, H}, 227)},
           [](const std::vector<Tensor>& x) { return gated_recurrence_grad(x[0], Tensor(), x[1], x[2]); }},
          {"one step, non-contiguous j",
           {uniform({1, B, H}, 228), uniform({1, B, H}, 229, 0, 1), samples::strided({1, B, 2 * H}, 230),
            uniform({2 * H, H}, 231)},
           [](const std::vector<Tensor>& x) { return gated_recurrence_grad(x[0], x[1], x[2], x[3]); }},
      };
    });

Tensor gated_recurrence_grad(const Tensor& g_in, const Tensor& a_in, const Tensor& j_in, const Tensor& w_in) {
  ProfileScope prof(gated_recurrence_grad_op.name);
  const std::string_view op = gated_recurrence_grad_op.name;
  detail::check_floating(op, g_in, "g");
  check_same_dtypes(op, g_in, "g", {{&j_in, "j"}, {&w_in, "w_hh"}});
  if (a_in.defined()) check_same_dtypes(op, g_in, "g", {{&a_in, "a"}});
  if (g_in.dim() != 3 || g_in.size(0) < 1 || g_in.size(2) < 1)
    throw ShapeError(fmt::format("{}: g {} must be (T,B,H) with T, H >= 1", op, g_in.shape()));
  const int64_t T = g_in.size(0), B = g_in.size(1), H = g_in.size(2);
  const int64_t G = j_in.dim() == 3 ? j_in.size(2) : 0;
  if ((a_in.defined() && !(a_in.shape() == g_in.shape())) || j_in.dim() != 3 || j_in.size(0) != T ||
      j_in.size(1) != B || G < H || G % H != 0 || !(w_in.shape() == Shape{G, H}))
    throw ShapeError(fmt::format("{}: for g {}, a {} must be (T,B,H), j {} (T,B,QH) and w_hh {} (QH,H)", op,
                                 g_in.shape(), a_in.defined() ? a_in.shape() : Shape{}, j_in.shape(), w_in.shape()));
  Tensor g, a, j, w;
  {
    NoGradGuard ng;
    g = g_in.contiguous(), a = contig(a_in), j = j_in.contiguous(), w = w_in.contiguous();
  }
  const Dims d{T, B, H};
  Tensor u = empty({T, B, H}, g.dtype()), P = empty({T, B, G}, g.dtype()), eh = zeros({B, H}, g.dtype());
  dispatch_float(g.dtype(), op, [&](auto tag) {
    using scalar_t = decltype(tag);
    for_batch_rows(d, G, [&](Rows rows) {
      gated_grad_forward<scalar_t>(d, G, rows, g.data<scalar_t>(), ptr<scalar_t>(a), j.data<scalar_t>(),
                                   w.data<scalar_t>(), u.data<scalar_t>(), P.data<scalar_t>(), eh.data<scalar_t>());
    });
  });
  if (Node* n = record(gated_recurrence_grad_op, u, g_in, a_in, j_in, w_in)) {
    n->save(a_in);  // GatedGradSaved::kCarry
    n->save(j_in);  // kSlopes
    n->save(w_in);  // kWeight
    n->save(u);     // kOutput
    n->save(P);     // kP
  }
  return u;
}

// ============================ lstm_recurrence ============================
// act (T,B,4H) keeps the gate activations sig(i), sig(f), tanh(g), sig(o);
// out (2,T,B,H) holds h_t then c_t, so backward finds c_{t-1} there. act is
// a side output of the node: the recorded backward computes its slopes from
// it, and a second-order pass sends their gradient back here, where the
// fused backward adds it to the gates' gradient before the step's GEMM.
namespace {
struct LstmSaved {
  enum : size_t { kWeight, kH0, kC0, kGates, kOutput };  // w_hh, h0, c0 as given
};
}  // namespace

// Step t of units u (see UnitSplit): w their rows of W_hh (4n,H), z the
// part's scratch (B,4n), nullptr for all units (the step's act itself then).
// zero (B,H) stands in for a missing c0.
template <class S>
static void lstm_forward_step(const Dims& d, Units u, int64_t t, const S* xp, const S* w, const S* h0, const S* c0,
                              const S* zero, S* z, S* act, S* hs, S* cs) {
  const int64_t B = d.B, H = d.H, n = u.n, G = 4 * H, Z = 4 * n;
  S* a = act + t * B * G;
  S* h = hs + t * B * H;
  S* c = cs + t * B * H;
  const S* hprev = t > 0 ? h - B * H : h0;
  const S* cprev = t > 0 ? c - B * H : c0 ? c0 : zero;
  if (!z) z = a;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t q = 0; q < 4; ++q) std::copy_n(xp + (t * B + b) * G + q * H + u.first, n, z + b * Z + q * n);
  if (hprev) gemm(false, true, B, Z, H, S(1), hprev, H, w, H, S(1), z, Z);
  parallel_for(B, row_grain(Z, kGateGrain), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const S *zi = z + b * Z, *zf = zi + n, *zg = zf + n, *zo = zg + n;
      S *ai = a + b * G + u.first, *af = ai + H, *ag = af + H, *ao = ag + H;
      const int64_t r = b * H + u.first;
      const S* cp = cprev + r;
      S *cb = c + r, *hb = h + r;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S i = sigmoid_gate(zi[j]), f = sigmoid_gate(zf[j]), g = tanh_gate(zg[j]), o = sigmoid_gate(zo[j]);
        ai[j] = i, af[j] = f, ag[j] = g, ao[j] = o;
        const S cn = i * g + f * cp[j];
        cb[j] = cn;
        hb[j] = o * tanh_gate(cn);
      }
    }
  });
}

// gout (2,T,B,H) is the gradient of [h_t; c_t]; fills dG (T,B,4H), the
// gradient of the pre-activation gates (= of xp), and dh0 / dc0 if given.
// Call c = 0..T of units u (see UnitSplit): first, for c > 0, the GEMM of
// step t = T - c, these units of the gradient reaching h_{t-1} (or dh0) from
// all of dG_t; then, for c < T, the pointwise pass of step t - 1 on these
// units. rec (3,B,H) is zero on entry: the gradients reaching h_t and c_t
// from step t+1, and c_{-1} = 0.
//
// gact (T,B,4H), when given, is the gradient that reached the activations
// (the side output act); it joins dG_t through the gates' slopes.
template <class S>
static void lstm_backward_call(const Dims& d, Units u, int64_t c, const S* gout, const S* gact, const S* w,
                               const S* c0, const S* act, const S* cs, S* dG, S* rec, S* dh0, S* dc0) {
  const int64_t T = d.T, B = d.B, H = d.H, n = u.n, G = 4 * H;
  S* dh = rec;
  S* dc = dh + B * H;
  const S* zero = dc + B * H;
  if (S* to = c == T ? dh0 : dh; c > 0 && to)
    gemm(false, false, B, n, G, S(1), dG + (T - c) * B * G, G, w + u.first, H, S(0), to + u.first, H);
  if (c == T) {
    if (dc0)
      for (int64_t b = 0; b < B; ++b) std::copy_n(dc + b * H + u.first, n, dc0 + b * H + u.first);
    return;
  }
  const int64_t t = T - 1 - c;
  const S* cprev = t > 0 ? cs + (t - 1) * B * H : c0 ? c0 : zero;
  parallel_for(B, row_grain(4 * n, kGateGrain), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r = b * H + u.first, at = t * B * H + r;
      const S *ai = act + t * B * G + b * G + u.first, *af = ai + H, *ag = af + H, *ao = ag + H;
      S *di = dG + t * B * G + b * G + u.first, *df = di + H, *dgg = df + H, *dout = dgg + H;
      const S *gh = gout + at, *gc = gout + T * B * H + at, *ct = cs + at, *cp = cprev + r;
      S *dhb = dh + r, *dcb = dc + r;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S i = ai[j], f = af[j], g = ag[j], o = ao[j];
        const S tc = tanh_gate(ct[j]);
        const S dht = gh[j] + dhb[j];
        const S dct = gc[j] + dcb[j] + dht * o * (S(1) - tc * tc);
        di[j] = dct * g * i * (S(1) - i);
        df[j] = dct * cp[j] * f * (S(1) - f);
        dgg[j] = dct * i * (S(1) - g * g);
        dout[j] = dht * tc * o * (S(1) - o);
        dcb[j] = dct * f;
      }
      if (!gact) continue;
      const S *gi = gact + t * B * G + b * G + u.first, *gf = gi + H, *gg = gf + H, *go = gg + H;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        di[j] += gi[j] * ai[j] * (S(1) - ai[j]);
        df[j] += gf[j] * af[j] * (S(1) - af[j]);
        dgg[j] += gg[j] * (S(1) - ag[j] * ag[j]);
        dout[j] += go[j] * ao[j] * (S(1) - ao[j]);
      }
    }
  });
}

// Recorded: a_t = xp_t + h_{t-1} W^T = [a_i a_f a_g a_o], i f o = sig(a_i a_f a_o),
// g = tanh(a_g), c_t = f c_{t-1} + i g, h_t = o tanh(c_t). Everything that
// does not depend on the gradient flowing back is computed for all steps at
// once: the slopes, from the activations (the side output, so their
// gradient in the next pass comes back to this node's fused backward) in
// one lstm_gate_slopes node; the recursion through time itself is one
// lstm_recurrence_grad node. When this backward is itself differentiated
// with create_graph, a gradient gact has reached the activations: it adds
// P = gact * slope to dA_t and P_t W to the gradient of h_{t-1}.
static void lstm_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor w = n.saved_tensor(LstmSaved::kWeight), h0 = n.saved_tensor(LstmSaved::kH0);
  const Tensor c0 = n.saved_tensor(LstmSaved::kC0), out = n.saved_tensor(LstmSaved::kOutput);
  const Tensor act = n.saved_tensor(LstmSaved::kGates);
  const int64_t H = out.size(3);
  const Tensor cs = select(out, 0, 1);
  const Tensor hprev = previous_states(select(out, 0, 0), h0), cprev = previous_states(cs, c0);  // (T,B,H)
  const Tensor s = lstm_gate_slopes(act, cs, cprev);  // (T,B,6H): [f, k, j]
  Tensor gout = grad, P;
  if (const Tensor& gact = n.side_grad(1); gact.defined()) {
    const std::vector<Tensor> q = chunk(act, 4, 2);
    P = mul(gact, concat({sigmoid_slope(q[0]), sigmoid_slope(q[1]), rsub(1.0, mul(q[2], q[2])), sigmoid_slope(q[3])},
                         2));  // (T,B,4H)
    gout = stack({add(select(grad, 0, 0), into_previous_states(P, w)), select(grad, 0, 1)}, 0);
  }
  const Tensor e = lstm_recurrence_grad(gout, s, w);  // (T,B,5H): [dA_t; dc_t]
  const Tensor dA = P.defined() ? add(narrow(e, 2, 0, 4 * H), P) : narrow(e, 2, 0, 4 * H);
  if (n.needs(0)) gin[0] = dA;
  if (n.needs(1)) gin[1] = weight_grad_recorded(dA, hprev);
  if (n.needs(2)) gin[2] = matmul(select(dA, 0, 0), w);
  if (n.needs(3)) gin[3] = mul(narrow(select(e, 0, 0), 1, 4 * H, H), narrow(select(s, 0, 0), 1, 0, H));
}

static void lstm_recurrence_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  if (grad_enabled()) return lstm_backward_recorded(n, grad, gin);
  const Tensor w = contig(n.saved_tensor(LstmSaved::kWeight)), h0 = contig(n.saved_tensor(LstmSaved::kH0));
  const Tensor c0 = contig(n.saved_tensor(LstmSaved::kC0));
  const Tensor act = n.saved_tensor(LstmSaved::kGates), out = n.saved_tensor(LstmSaved::kOutput);
  const Tensor gact = n.side_grad(1).defined() ? n.side_grad(1).contiguous() : Tensor();
  const Dims d{out.size(1), out.size(2), out.size(3)};
  const int64_t BH = d.B * d.H;
  Tensor g = grad.contiguous();
  Tensor dG = empty(act.shape(), act.dtype());
  Tensor dh0 = n.needs(2) ? empty({d.B, d.H}, out.dtype()) : Tensor();
  Tensor dc0 = n.needs(3) ? empty({d.B, d.H}, out.dtype()) : Tensor();
  Tensor rec = zeros({3, d.B, d.H}, out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* hs = out.data<scalar_t>();
    backward_by_units(d, 4, [&](Units u, int64_t c) {
      lstm_backward_call(d, u, c, g.data<scalar_t>(), ptr<scalar_t>(gact), w.data<scalar_t>(), ptr<scalar_t>(c0),
                         act.data<scalar_t>(),
                         hs + d.T * BH, dG.data<scalar_t>(), rec.data<scalar_t>(), ptr<scalar_t>(dh0),
                         ptr<scalar_t>(dc0));
    });
    if (n.needs(1)) gin[1] = weight_grad<scalar_t>(d, 4 * d.H, dG.data<scalar_t>(), hs, ptr<scalar_t>(h0), out.dtype());
  });
  if (n.needs(0)) gin[0] = dG;
  if (n.needs(2)) gin[2] = dh0;
  if (n.needs(3)) gin[3] = dc0;
}
static const OpDef lstm_recurrence_op(
    "lstm_recurrence", 4, "lstm_recurrence(xp (T,B,4H), w_hh (4H,H), h0 (B,H), c0 (B,H)) -> (2,T,B,H) [h_t; c_t]",
    "w_hh, h0, c0, gate activations (T,B,4H) as a side output, output", lstm_recurrence_backward, tangent_from_backward,
    [] { return recurrence_samples(4, false, true); });

Tensor lstm_recurrence(const Tensor& xp_in, const Tensor& w_in, const Tensor& h0_in, const Tensor& c0_in) {
  ProfileScope prof(lstm_recurrence_op.name);
  const Dims d = check_recurrence(lstm_recurrence_op.name, 4, xp_in, w_in, Tensor(), h0_in, c0_in);
  Tensor xp, w, h0, c0;
  {
    NoGradGuard ng;
    xp = contig(xp_in), w = contig(w_in), h0 = contig(h0_in), c0 = contig(c0_in);
  }
  Tensor out = empty({2, d.T, d.B, d.H}, xp.dtype());
  Tensor act = empty(xp.shape(), xp.dtype());
  dispatch_float(xp.dtype(), lstm_recurrence_op.name, [&](auto tag) {
    using scalar_t = decltype(tag);
    scalar_t* hs = out.data<scalar_t>();
    const Tensor zero = c0.defined() ? Tensor() : zeros({d.B, d.H}, xp.dtype());
    forward_by_units<scalar_t>(d, 4, w, true, [&](Units u, int64_t t, const scalar_t* wu, scalar_t* z) {
      lstm_forward_step(d, u, t, xp.data<scalar_t>(), wu, ptr<scalar_t>(h0), ptr<scalar_t>(c0), ptr<scalar_t>(zero),
                        z, act.data<scalar_t>(), hs, hs + d.T * d.B * d.H);
    });
  });
  if (Node* n = record(lstm_recurrence_op, out, xp_in, w_in, h0_in, c0_in)) {
    n->save(w_in);   // LstmSaved::kWeight
    n->save(h0_in);  // kH0
    n->save(c0_in);  // kC0
    n->save_side_output(act);  // kGates
    n->save(out);              // kOutput
  }
  return out;
}

// ============================ lstm_gate_slopes ============================
// What the LSTM's backward recursion reads of each step, for all steps at
// once in one pointwise pass (not a dozen ops on (T,B,4H) tensors), from the
// gate activations act = [i, f, g, o] and tc = tanh(c_t):
//   s = [f, k, j_i, j_f, j_g, j_o] (T,B,6H),
//   k = o (1-tc^2), j_i = g i(1-i), j_f = c_{t-1} f(1-f), j_g = i (1-g^2), j_o = tc o(1-o).
// Its backward, with si = i(1-i), sf, so alike, tg = 1-g^2, tcc = 1-tc^2:
//   di = dj_i g (1-2i) + dj_g tg          df = df + dj_f c_{t-1} (1-2f)
//   dg = dj_i si - 2 dj_g i g             do = dk tcc + dj_o tc (1-2o)
//   dc_t = tcc (dj_o so - 2 dk o tc)      dc_{t-1} = dj_f sf
namespace {
struct LstmSlopesSaved {
  enum : size_t { kAct, kC, kCPrev };
};
}  // namespace

// Rows [r0, r1) of the T*B rows: act (.,4H), c and cp (.,H) -> s (.,6H).
template <class S>
static void lstm_slopes_forward(int64_t H, int64_t r0, int64_t r1, const S* act, const S* c, const S* cp, S* s) {
  for (int64_t r = r0; r < r1; ++r) {
    const S *ai = act + r * 4 * H, *af = ai + H, *ag = af + H, *ao = ag + H, *cr = c + r * H, *cpr = cp + r * H;
    S* sr = s + r * 6 * H;
#pragma omp simd
    for (int64_t q = 0; q < H; ++q) {
      const S i = ai[q], f = af[q], g = ag[q], o = ao[q], tc = tanh_gate(cr[q]);
      sr[q] = f;
      sr[H + q] = o * (S(1) - tc * tc);
      sr[2 * H + q] = g * i * (S(1) - i);
      sr[3 * H + q] = cpr[q] * f * (S(1) - f);
      sr[4 * H + q] = i * (S(1) - g * g);
      sr[5 * H + q] = tc * o * (S(1) - o);
    }
  }
}

// Rows [r0, r1): ds (.,6H) -> dact (.,4H), dc and dcp (.,H).
template <class S>
static void lstm_slopes_backward(int64_t H, int64_t r0, int64_t r1, const S* ds, const S* act, const S* c,
                                 const S* cp, S* dact, S* dc, S* dcp) {
  for (int64_t r = r0; r < r1; ++r) {
    const S *ai = act + r * 4 * H, *af = ai + H, *ag = af + H, *ao = ag + H, *cr = c + r * H, *cpr = cp + r * H;
    const S* d = ds + r * 6 * H;
    S *dar = dact + r * 4 * H, *dcr = dc + r * H, *dcpr = dcp + r * H;
#pragma omp simd
    for (int64_t q = 0; q < H; ++q) {
      const S i = ai[q], f = af[q], g = ag[q], o = ao[q], tc = tanh_gate(cr[q]);
      const S si = i * (S(1) - i), sf = f * (S(1) - f), so = o * (S(1) - o);
      const S tg = S(1) - g * g, tcc = S(1) - tc * tc;
      const S df = d[q], dk = d[H + q], dji = d[2 * H + q], djf = d[3 * H + q], djg = d[4 * H + q], djo = d[5 * H + q];
      dar[q] = dji * g * (S(1) - S(2) * i) + djg * tg;
      dar[H + q] = df + djf * cpr[q] * (S(1) - S(2) * f);
      dar[2 * H + q] = dji * si - S(2) * djg * i * g;
      dar[3 * H + q] = dk * tcc + djo * tc * (S(1) - S(2) * o);
      dcr[q] = tcc * (djo * so - S(2) * dk * o * tc);
      dcpr[q] = djf * sf;
    }
  }
}

// Recorded (third and higher derivatives of the LSTM): the formulas above in tensor ops.
static void lstm_slopes_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor act = n.saved_tensor(LstmSlopesSaved::kAct), c = n.saved_tensor(LstmSlopesSaved::kC);
  const Tensor cp = n.saved_tensor(LstmSlopesSaved::kCPrev);
  const std::vector<Tensor> z = chunk(act, 4, 2), d = chunk(grad, 6, 2);
  const Tensor &i = z[0], &f = z[1], &g = z[2], &o = z[3], tc = tanh(c);
  const Tensor tg = rsub(1.0, mul(g, g)), tcc = rsub(1.0, mul(tc, tc));
  const Tensor &df = d[0], &dk = d[1], &dji = d[2], &djf = d[3], &djg = d[4], &djo = d[5];
  if (n.needs(0))
    gin[0] = concat({add(mul(mul(dji, g), rsub(1.0, mul(i, 2.0))), mul(djg, tg)),
                     add(df, mul(mul(djf, cp), rsub(1.0, mul(f, 2.0)))),
                     sub(mul(dji, sigmoid_slope(i)), mul(mul(djg, mul(i, g)), 2.0)),
                     add(mul(dk, tcc), mul(mul(djo, tc), rsub(1.0, mul(o, 2.0))))},
                    2);
  if (n.needs(1)) gin[1] = mul(tcc, sub(mul(djo, sigmoid_slope(o)), mul(mul(dk, mul(o, tc)), 2.0)));
  if (n.needs(2)) gin[2] = mul(djf, sigmoid_slope(f));
}

static void lstm_gate_slopes_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  if (grad_enabled()) return lstm_slopes_backward_recorded(n, grad, gin);
  const Tensor act = contig(n.saved_tensor(LstmSlopesSaved::kAct)), c = contig(n.saved_tensor(LstmSlopesSaved::kC));
  const Tensor cp = contig(n.saved_tensor(LstmSlopesSaved::kCPrev));
  const Tensor ds = grad.contiguous();
  const int64_t H = c.size(2), rows = c.size(0) * c.size(1);
  // All three in one pass (the LSTM's recorded backward needs them all).
  Tensor dact = empty(act.shape(), act.dtype()), dc = empty(c.shape(), c.dtype()), dcp = empty(cp.shape(), cp.dtype());
  dispatch_float(act.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    parallel_for(rows, row_grain(6 * H, kGateGrain), [&](int64_t r0, int64_t r1) {
      lstm_slopes_backward<scalar_t>(H, r0, r1, ds.data<scalar_t>(), act.data<scalar_t>(), c.data<scalar_t>(),
                                     cp.data<scalar_t>(), dact.data<scalar_t>(), dc.data<scalar_t>(),
                                     dcp.data<scalar_t>());
    });
  });
  if (n.needs(0)) gin[0] = dact;
  if (n.needs(1)) gin[1] = dc;
  if (n.needs(2)) gin[2] = dcp;
}
static const OpDef lstm_gate_slopes_op(
    "lstm_gate_slopes", 3, "lstm_gate_slopes(act (T,B,4H) [i, f, g, o], c (T,B,H), c_prev (T,B,H)) -> (T,B,6H) [f, k, j]",
    "act, c, c_prev", lstm_gate_slopes_backward, tangent_from_backward, [] {
      using samples::uniform;
      const int64_t T = 3, B = 2, H = 3;
      auto fn = [](const std::vector<Tensor>& x) { return lstm_gate_slopes(x[0], x[1], x[2]); };
      return std::vector<OpSample>{
          {"T=3 B=2 H=3", {uniform({T, B, 4 * H}, 221), uniform({T, B, H}, 222, -2, 2), uniform({T, B, H}, 223)}, fn},
          {"non-contiguous act",
           {samples::strided({1, B, 4 * H}, 224), uniform({1, B, H}, 225), uniform({1, B, H}, 226)},
           fn},
      };
    });

Tensor lstm_gate_slopes(const Tensor& act_in, const Tensor& c_in, const Tensor& cp_in) {
  ProfileScope prof(lstm_gate_slopes_op.name);
  const std::string_view op = lstm_gate_slopes_op.name;
  detail::check_floating(op, act_in, "act");
  check_same_dtypes(op, act_in, "act", {{&c_in, "c"}, {&cp_in, "c_prev"}});
  if (c_in.dim() != 3 || !(cp_in.shape() == c_in.shape()) ||
      !(act_in.shape() == Shape{c_in.size(0), c_in.size(1), 4 * c_in.size(2)}))
    throw ShapeError(fmt::format("{}: c {} and c_prev {} must be (T,B,H) and act {} (T,B,4H)", op, c_in.shape(),
                                 cp_in.shape(), act_in.shape()));
  Tensor act, c, cp;
  {
    NoGradGuard ng;
    act = act_in.contiguous(), c = c_in.contiguous(), cp = cp_in.contiguous();
  }
  const int64_t H = c.size(2), rows = c.size(0) * c.size(1);
  Tensor out = empty({c.size(0), c.size(1), 6 * H}, act.dtype());
  dispatch_float(act.dtype(), op, [&](auto tag) {
    using scalar_t = decltype(tag);
    parallel_for(rows, row_grain(6 * H, kGateGrain), [&](int64_t r0, int64_t r1) {
      lstm_slopes_forward<scalar_t>(H, r0, r1, act.data<scalar_t>(), c.data<scalar_t>(), cp.data<scalar_t>(),
                                    out.data<scalar_t>());
    });
  });
  if (Node* n = record(lstm_gate_slopes_op, out, act_in, c_in, cp_in)) {
    n->save(act_in);  // LstmSlopesSaved::kAct
    n->save(c_in);    // kC
    n->save(cp_in);   // kCPrev
  }
  return out;
}

// ============================ lstm_recurrence_grad ============================
// The LSTM's backward recursion through time as an op of its own, so that a
// recorded LSTM backward is one node for the recursion (not a dozen per
// step) and its own backward is one fused kernel. With gh_t, gc_t the
// gradients of h_t, c_t (gout (2,T,B,H)), and the slopes s_t = [f_t, k_t, j_t]
// of lstm_gate_slopes, going t = T-1 .. 0 with e_h = e_c = 0:
//   u_t = gh_t + e_h,  v_t = gc_t + e_c + u_t k_t             (dh_t, dc_t)
//   D_t = [v_t j_i, v_t j_f, v_t j_g, u_t j_o]                (dA_t, (B,4H))
//   e_h = D_t W,  e_c = v_t f_t                               (into step t-1)
// The output is [D_t; v_t] (T,B,5H). Its backward runs the adjoint of that
// recursion forward in time (see lstm_grad_adjoint).
namespace {
struct LstmGradSaved {
  enum : size_t { kGout, kSlopes, kWeight, kOutput, kU };  // u_t (T,B,H), computed by forward
};
}  // namespace

// s (T,B,6H) row r holds f at r*6H, k at +H and j at +2H.
template <class S>
static void lstm_grad_forward(const Dims& d, Rows rows, const S* gout, const S* s, const S* w, S* out, S* us, S* eh) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, G = 4 * H, O = 5 * H, L = 6 * H;
  S* e = eh + rows.first * H;  // D_{t+1} W, zero for t = T-1
  for (int64_t t = T; t-- > 0;) {
    const int64_t r = t * B + rows.first;
    const S *gh = gout + r * H, *gc = gout + (T * B + r) * H, *st = s + r * L;
    const S* sn = t + 1 < T ? st + B * L : nullptr;             // f_{t+1} in s_{t+1}
    const S* vn = t + 1 < T ? out + (r + B) * O + G : nullptr;  // v_{t+1}
    S *ot = out + r * O, *ut = us + r * H;
    for (int64_t b = 0; b < n; ++b) {
      const S *kb = st + b * L + H, *jb = kb + H, *fn = sn ? sn + b * L : nullptr;
      S* ob = ot + b * O;
#pragma omp simd
      for (int64_t q = 0; q < H; ++q) {
        const S u = gh[b * H + q] + e[b * H + q];
        const S v = gc[b * H + q] + (fn ? vn[b * O + q] * fn[q] : S(0)) + u * kb[q];
        ob[q] = v * jb[q];
        ob[H + q] = v * jb[H + q];
        ob[2 * H + q] = v * jb[2 * H + q];
        ob[3 * H + q] = u * jb[3 * H + q];
        ob[G + q] = v;
        ut[b * H + q] = u;
      }
    }
    if (t > 0) gemm(false, false, n, H, G, S(1), ot, O, w, H, S(0), e, H);
  }
}

// The adjoint, t = 0 .. T-1, given the output's gradient [dD_t; dv_t]; with
// U_t, V_t the total gradients of u_t, v_t (U_{-1} = V_{-1} = 0):
//   D~_t = dD_t + U_{t-1} W^T
//   V_t = dv_t + V_{t-1} f_t + D~_i j_i + D~_f j_f + D~_g j_g,  U_t = D~_o j_o + V_t k_t
// and the inputs' gradients: d gh_t = U_t, d gc_t = V_t, and into ds (T,B,6H)
// d f_t = V_{t-1} v_t, d k_t = V_t u_t, d j_t = [D~_i v_t, D~_f v_t, D~_g v_t, D~_o u_t];
// dW = sum_{t>0} D_t^T U_{t-1} (one GEMM, after). dt (B,4H) is scratch.
template <class S>
static void lstm_grad_adjoint(const Dims& d, Rows rows, const S* gy, const S* s, const S* w, const S* out,
                              const S* us, S* dgout, S* ds, S* dt) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, G = 4 * H, O = 5 * H, L = 6 * H;
  S* dtil = dt + rows.first * G;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = t * B + rows.first;
    const S *gyt = gy + r * O, *st = s + r * L, *ot = out + r * O, *ut = us + r * H;
    S *U = dgout + r * H, *V = dgout + (T * B + r) * H, *dst = ds + r * L;
    const S* Up = t > 0 ? U - B * H : nullptr;  // U_{t-1}, V_{t-1}
    const S* Vp = t > 0 ? V - B * H : nullptr;
    for (int64_t b = 0; b < n; ++b) std::copy_n(gyt + b * O, G, dtil + b * G);
    if (Up) gemm(false, true, n, G, H, S(1), Up, H, w, H, S(1), dtil, G);
    for (int64_t b = 0; b < n; ++b) {
      const S *fb = st + b * L, *kb = fb + H, *jb = kb + H, *ob = ot + b * O, *db = dtil + b * G;
      S *dfb = dst + b * L, *dkb = dfb + H, *djb = dkb + H;
      const int64_t x = b * H;
#pragma omp simd
      for (int64_t q = 0; q < H; ++q) {
        const S v = ob[G + q], u = ut[x + q];
        const S Vt = gyt[b * O + G + q] + (Vp ? Vp[x + q] * fb[q] : S(0)) + db[q] * jb[q] + db[H + q] * jb[H + q] +
                     db[2 * H + q] * jb[2 * H + q];
        const S Ut = db[3 * H + q] * jb[3 * H + q] + Vt * kb[q];
        dfb[q] = Vp ? Vp[x + q] * v : S(0);
        dkb[q] = Vt * u;
        djb[q] = db[q] * v;
        djb[H + q] = db[H + q] * v;
        djb[2 * H + q] = db[2 * H + q] * v;
        djb[3 * H + q] = db[3 * H + q] * u;
        U[x + q] = Ut;
        V[x + q] = Vt;
      }
    }
  }
}

// Recorded (third and higher derivatives of the LSTM): the adjoint above in
// tensor ops, step by step, with u_t recomputed from the output.
static void lstm_grad_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor gout = n.saved_tensor(LstmGradSaved::kGout), s = n.saved_tensor(LstmGradSaved::kSlopes);
  const Tensor w = n.saved_tensor(LstmGradSaved::kWeight), out = n.saved_tensor(LstmGradSaved::kOutput);
  const int64_t T = out.size(0), H = out.size(2) / 5, G = 4 * H;
  const Tensor f = narrow(s, 2, 0, H), k = narrow(s, 2, H, H), j = narrow(s, 2, 2 * H, G);
  const Tensor D = narrow(out, 2, 0, G), v = narrow(out, 2, G, H);
  // u_t = gh_t + D_{t+1} W (no D_T).
  const Tensor u = add(select(gout, 0, 0), into_previous_states(D, w));
  const Tensor wt = transpose(w, 0, 1);
  std::vector<Tensor> dgh(T), dgc(T), ds(T);
  for (int64_t t = 0; t < T; ++t) {
    Tensor dtil = narrow(select(grad, 0, t), 1, 0, G);
    if (t > 0) dtil = add(dtil, matmul(dgh[t - 1], wt));
    const std::vector<Tensor> dd = chunk(dtil, 4, 1), jj = chunk(select(j, 0, t), 4, 1);
    const Tensor vt = select(v, 0, t), ut = select(u, 0, t);
    Tensor V = add(narrow(select(grad, 0, t), 1, G, H), add(add(mul(dd[0], jj[0]), mul(dd[1], jj[1])), mul(dd[2], jj[2])));
    if (t > 0) V = add(V, mul(dgc[t - 1], select(f, 0, t)));
    dgh[t] = add(mul(dd[3], jj[3]), mul(V, select(k, 0, t)));
    const Tensor df = t > 0 ? mul(dgc[t - 1], vt) : mul(vt, 0.0);  // zero at t = 0, kept in the graph
    dgc[t] = V;
    ds[t] = concat({df, mul(V, ut), mul(dd[0], vt), mul(dd[1], vt), mul(dd[2], vt), mul(dd[3], ut)}, 1);
  }
  const Tensor dU = stack(dgh, 0);
  if (n.needs(0)) gin[0] = stack({dU, stack(dgc, 0)}, 0);
  if (n.needs(1)) gin[1] = stack(ds, 0);
  if (n.needs(2))  // zero for one step, as a product so that it stays in the graph
    gin[2] = T > 1 ? weight_grad_recorded(narrow(D, 0, 1, T - 1), narrow(dU, 0, 0, T - 1)) : mul(w, 0.0);
}

static void lstm_recurrence_grad_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  if (grad_enabled()) return lstm_grad_backward_recorded(n, grad, gin);
  const Tensor s = contig(n.saved_tensor(LstmGradSaved::kSlopes)), w = contig(n.saved_tensor(LstmGradSaved::kWeight));
  const Tensor out = n.saved_tensor(LstmGradSaved::kOutput), us = n.saved_tensor(LstmGradSaved::kU);
  const Dims d{out.size(0), out.size(1), out.size(2) / 5};
  const Tensor gy = grad.contiguous();
  Tensor dgout = empty({2, d.T, d.B, d.H}, out.dtype()), ds = empty(s.shape(), out.dtype());
  Tensor scratch = empty({d.B, 4 * d.H}, out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    for_batch_rows(d, 4 * d.H, [&](Rows rows) {
      lstm_grad_adjoint<scalar_t>(d, rows, gy.data<scalar_t>(), s.data<scalar_t>(), w.data<scalar_t>(),
                                  out.data<scalar_t>(), us.data<scalar_t>(), dgout.data<scalar_t>(),
                                  ds.data<scalar_t>(), scratch.data<scalar_t>());
    });
    if (n.needs(2)) {
      // dW (4H,H) = sum_{t>0} D_t^T U_{t-1}: D_t rows of the output (stride 5H), U the first half of dgout.
      const int64_t G = 4 * d.H;
      Tensor dW = zeros({G, d.H}, out.dtype());
      if (d.T > 1)
        gemm(true, false, G, d.H, (d.T - 1) * d.B, scalar_t(1), out.data<scalar_t>() + d.B * 5 * d.H, 5 * d.H,
             dgout.data<scalar_t>(), d.H, scalar_t(0), dW.data<scalar_t>(), d.H);
      gin[2] = dW;
    }
  });
  if (n.needs(0)) gin[0] = dgout;
  if (n.needs(1)) gin[1] = ds;
}
static const OpDef lstm_recurrence_grad_op(
    "lstm_recurrence_grad", 3,
    "lstm_recurrence_grad(gout (2,T,B,H), s (T,B,6H) [f, k, j], w_hh (4H,H)) -> (T,B,5H) [dA_t; dc_t]",
    "gout, s, w_hh, output, u (T,B,H)", lstm_recurrence_grad_backward, tangent_from_backward, [] {
      using samples::uniform;
      const int64_t T = 3, B = 2, H = 3;
      auto fn = [](const std::vector<Tensor>& x) { return lstm_recurrence_grad(x[0], x[1], x[2]); };
      return std::vector<OpSample>{
          {"T=3 B=2 H=3", {uniform({2, T, B, H}, 211), uniform({T, B, 6 * H}, 212), uniform({4 * H, H}, 215)}, fn},
          {"one step, non-contiguous s",
           {uniform({2, 1, B, H}, 216), samples::strided({1, B, 6 * H}, 219), uniform({4 * H, H}, 220)},
           fn},
      };
    });

Tensor lstm_recurrence_grad(const Tensor& gout_in, const Tensor& s_in, const Tensor& w_in) {
  ProfileScope prof(lstm_recurrence_grad_op.name);
  const std::string_view op = lstm_recurrence_grad_op.name;
  detail::check_floating(op, gout_in, "gout");
  check_same_dtypes(op, gout_in, "gout", {{&s_in, "s"}, {&w_in, "w_hh"}});
  if (gout_in.dim() != 4 || gout_in.size(0) != 2 || gout_in.size(1) < 1)
    throw ShapeError(fmt::format("{}: gout {} must be (2,T,B,H) with T >= 1", op, gout_in.shape()));
  const int64_t T = gout_in.size(1), B = gout_in.size(2), H = gout_in.size(3);
  if (!(s_in.shape() == Shape{T, B, 6 * H}) || !(w_in.shape() == Shape{4 * H, H}))
    throw ShapeError(fmt::format("{}: for gout {}, s {} must be (T,B,6H) and w_hh {} (4H,H)", op, gout_in.shape(),
                                 s_in.shape(), w_in.shape()));
  Tensor gout, s, w;
  {
    NoGradGuard ng;
    gout = gout_in.contiguous(), s = s_in.contiguous(), w = w_in.contiguous();
  }
  const Dims d{T, B, H};
  Tensor out = empty({T, B, 5 * H}, gout.dtype()), us = empty({T, B, H}, gout.dtype());
  Tensor eh = zeros({B, H}, gout.dtype());
  dispatch_float(gout.dtype(), op, [&](auto tag) {
    using scalar_t = decltype(tag);
    for_batch_rows(d, 4 * H, [&](Rows rows) {
      lstm_grad_forward<scalar_t>(d, rows, gout.data<scalar_t>(), s.data<scalar_t>(), w.data<scalar_t>(),
                                  out.data<scalar_t>(), us.data<scalar_t>(), eh.data<scalar_t>());
    });
  });
  if (Node* n = record(lstm_recurrence_grad_op, out, gout_in, s_in, w_in)) {
    n->save(gout_in);  // LstmGradSaved::kGout
    n->save(s_in);     // kSlopes
    n->save(w_in);     // kWeight
    n->save(out);      // kOutput
    n->save(us);       // kU
  }
  return out;
}

// ============================ gru_recurrence ============================
// act (T,B,4H) keeps r, z, n and hn = h W_hn^T + b_hn (needed for dr). It
// is a side output of the node: the recorded backward computes its slopes
// from it, and what a second-order pass sends into it comes back to the
// fused backward, which adds it to dX and dP before the step's GEMM.
namespace {
struct GruSaved {
  enum : size_t { kWeight, kH0, kGates, kOutput };  // w_hh, h0 as given
};
}  // namespace

// Step t of units u (see UnitSplit): w their rows of W_hh (3n,H), hp the
// part's (B,3n) for h_{t-1} W_hh^T (the bias is added in the pointwise pass).
// zero (>= B H and 3H elements) stands in for a missing h0 or bias.
template <class S>
static void gru_forward_step(const Dims& d, Units u, int64_t t, const S* xp, const S* w, const S* bias, const S* h0,
                             const S* zero, S* hp, S* act, S* hs) {
  const int64_t B = d.B, H = d.H, n = u.n, G = 3 * H, P = 3 * n;
  S* h = hs + t * B * H;
  const S* hprev = t > 0 ? h - B * H : h0;
  if (hprev)
    gemm(false, true, B, P, H, S(1), hprev, H, w, H, S(0), hp, P);
  else
    std::fill_n(hp, B * P, S(0)), hprev = zero;
  const S* x = xp + t * B * G + u.first;
  const S* bb = (bias ? bias : zero) + u.first;
  S* a = act + t * B * 4 * H + u.first;
  parallel_for(B, row_grain(P, kGateGrain), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const S *xr = x + b * G, *xz = xr + H, *xn = xz + H;
      const S *pr = hp + b * P, *pz = pr + n, *pn = pz + n;
      S *ar = a + b * 4 * H, *az = ar + H, *an = az + H, *ahn = an + H;
      const S* hb = hprev + b * H + u.first;
      S* out = h + b * H + u.first;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S hn = pn[j] + bb[2 * H + j];
        const S r = sigmoid_gate(xr[j] + pr[j] + bb[j]), z = sigmoid_gate(xz[j] + pz[j] + bb[H + j]);
        const S nn = tanh_gate(xn[j] + r * hn);
        ar[j] = r, az[j] = z, an[j] = nn, ahn[j] = hn;
        out[j] = (S(1) - z) * nn + z * hb[j];
      }
    }
  });
}

// Fills dX (T,B,3H), the gradient of xp, and dP (T,B,3H), that of the hidden
// projection h W_hh^T + b_hh (they differ in the n gate: dP_n = r dX_n).
// Call c = 0..T of units u (see UnitSplit): first, for c > 0, the GEMM of
// step t = T - c, which adds these units' share of dP_t W to the gradient
// reaching h_{t-1} (rec, or dh0 at t = 0); then, for c < T, the pointwise
// pass of step t - 1 on these units. rec (2,B,H) is zero on entry: the
// gradient reaching h_t from step t+1, and h_{-1} = 0. gact (T,B,4H), when
// given, is the gradient that reached the activations [r, z, n, hn].
template <class S>
static void gru_backward_call(const Dims& d, Units u, int64_t c, const S* gout, const S* gact, const S* w,
                              const S* h0, const S* act, const S* hs, S* dX, S* dP, S* rec, S* dh0) {
  const int64_t T = d.T, B = d.B, H = d.H, n = u.n, G = 3 * H;
  S* dh = rec;
  const S* zero = rec + B * H;
  if (S* to = c == T ? dh0 : dh; c > 0 && to) {
    if (c == T)  // dh holds the direct path z_0 u_0 of these units
      for (int64_t b = 0; b < B; ++b) std::copy_n(dh + b * H + u.first, n, dh0 + b * H + u.first);
    gemm(false, false, B, n, G, S(1), dP + (T - c) * B * G, G, w + u.first, H, S(1), to + u.first, H);
  }
  if (c == T) return;
  const int64_t t = T - 1 - c;
  const S* hprev = t > 0 ? hs + (t - 1) * B * H : h0 ? h0 : zero;
  parallel_for(B, row_grain(3 * n, kGateGrain), [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const S *ar = act + (t * B + b) * 4 * H + u.first, *az = ar + H, *an = az + H, *ahn = an + H;
      S *dxr = dX + (t * B + b) * G + u.first, *dxz = dxr + H, *dxn = dxz + H;
      S *dpr = dP + (t * B + b) * G + u.first, *dpz = dpr + H, *dpn = dpz + H;
      const int64_t k = b * H + u.first;
      const S *g = gout + t * B * H + k, *hp = hprev + k;
      S* dhb = dh + k;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S r = ar[j], z = az[j], nn = an[j], hn = ahn[j];
        const S dht = g[j] + dhb[j];
        const S dan = dht * (S(1) - z) * (S(1) - nn * nn);
        const S dar = dan * hn * r * (S(1) - r);
        const S daz = dht * (hp[j] - nn) * z * (S(1) - z);
        dxr[j] = dpr[j] = dar;
        dxz[j] = dpz[j] = daz;
        dxn[j] = dan;
        dpn[j] = dan * r;
        dhb[j] = dht * z;  // the direct path z h_{t-1}; the next call's GEMM adds the rest
      }
      if (!gact) continue;
      const S *gr = gact + (t * B + b) * 4 * H + u.first, *gz = gr + H, *gn = gz + H, *ghn = gn + H;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S r = ar[j], z = az[j], nn = an[j];
        const S dan = gn[j] * (S(1) - nn * nn);
        const S dar = (gr[j] + dan * ahn[j]) * r * (S(1) - r);
        const S daz = gz[j] * z * (S(1) - z);
        dxr[j] += dar, dpr[j] += dar;
        dxz[j] += daz, dpz[j] += daz;
        dxn[j] += dan;
        dpn[j] += ghn[j] + dan * r;
      }
    }
  });
}

// Recorded: p = h_{t-1} W^T + b_hh = [p_r p_z p_n], r, z = sig(xp_rz + p_rz),
// n = tanh(xp_n + r p_n), h_t = (1 - z) n + z h_{t-1}, with r, z, n and
// hn = p_n read from the activations (the side output); with
// c = (1 - z)(1 - n^2) and the slopes of p,
//   j = [c hn r(1-r), (h_{t-1} - n) z(1-z), c r],
// the gradient u_t reaching h_t is one gated_recurrence_grad node
// (u_t = g_t + z_{t+1} u_{t+1} + (u_{t+1} j_{t+1}) W), and
// dp = u j, dxp = [dp_r, dp_z, u c], dW = sum_t dp_t^T h_{t-1}, db_hh = sum dp,
// dh0 = z_0 u_0 + dp_0 W. When this backward is itself differentiated with
// create_graph, a gradient gact = [g_r, g_z, g_n, g_hn] has reached the
// activations: with A_n = g_n (1-n^2), A_r = (g_r + A_n hn) r(1-r),
// A_z = g_z z(1-z), it adds [A_r, A_z, A_n] to dxp, Q = [A_r, A_z, g_hn + A_n r]
// to dp, and Q_t W to the gradient of h_{t-1}.
static void gru_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor w = n.saved_tensor(GruSaved::kWeight), h0 = n.saved_tensor(GruSaved::kH0);
  const Tensor out = n.saved_tensor(GruSaved::kOutput), act = n.saved_tensor(GruSaved::kGates);
  const int64_t H = out.size(2), G = w.size(0);
  const Tensor hprev = previous_states(out, h0);
  const std::vector<Tensor> a = chunk(act, 4, 2);
  const Tensor &r = a[0], &z = a[1], &nn = a[2], &hn = a[3];
  const Tensor c = mul(rsub(1.0, z), rsub(1.0, mul(nn, nn)));
  const Tensor j = concat({mul(mul(c, hn), sigmoid_slope(r)), mul(sub(hprev, nn), sigmoid_slope(z)), mul(c, r)}, 2);
  Tensor g = grad, Qx, Q;
  if (const Tensor& gact = n.side_grad(1); gact.defined()) {
    const std::vector<Tensor> ga = chunk(gact, 4, 2);
    const Tensor An = mul(ga[2], rsub(1.0, mul(nn, nn)));
    const Tensor Ar = mul(add(ga[0], mul(An, hn)), sigmoid_slope(r)), Az = mul(ga[1], sigmoid_slope(z));
    Qx = concat({Ar, Az, An}, 2);
    Q = concat({Ar, Az, add(ga[3], mul(An, r))}, 2);  // (T,B,3H)
    g = add(grad, into_previous_states(Q, w));
  }
  const Tensor u = gated_recurrence_grad(g, z, j, w);
  Tensor dP = spread_mul(u, j);  // (T,B,3H)
  Tensor dX = concat({narrow(dP, 2, 0, 2 * H), mul(u, c)}, 2);
  if (Q.defined()) dP = add(dP, Q), dX = add(dX, Qx);
  if (n.needs(0)) gin[0] = dX;
  if (n.needs(1)) gin[1] = weight_grad_recorded(dP, hprev);
  if (n.needs(2)) gin[2] = sum(reshape(dP, {-1, G}), {0});
  if (n.needs(3)) gin[3] = add(mul(select(z, 0, 0), select(u, 0, 0)), matmul(select(dP, 0, 0), w));
}

static void gru_recurrence_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  if (grad_enabled()) return gru_backward_recorded(n, grad, gin);
  const Tensor w = contig(n.saved_tensor(GruSaved::kWeight)), h0 = contig(n.saved_tensor(GruSaved::kH0));
  const Tensor act = n.saved_tensor(GruSaved::kGates), out = n.saved_tensor(GruSaved::kOutput);
  const Tensor gact = n.side_grad(1).defined() ? n.side_grad(1).contiguous() : Tensor();
  const Dims d{out.size(0), out.size(1), out.size(2)};
  const int64_t G = 3 * d.H;
  Tensor g = grad.contiguous();
  Tensor dX = empty({d.T, d.B, G}, out.dtype());
  Tensor dP = empty({d.T, d.B, G}, out.dtype());
  Tensor dh0 = n.needs(3) ? empty({d.B, d.H}, out.dtype()) : Tensor();
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* hs = out.data<scalar_t>();
    Tensor rec = zeros({2, d.B, d.H}, out.dtype());
    backward_by_units(d, 3, [&](Units u, int64_t c) {
      gru_backward_call(d, u, c, g.data<scalar_t>(), ptr<scalar_t>(gact), w.data<scalar_t>(), ptr<scalar_t>(h0),
                        act.data<scalar_t>(),
                        hs, dX.data<scalar_t>(), dP.data<scalar_t>(), rec.data<scalar_t>(), ptr<scalar_t>(dh0));
    });
    if (n.needs(1)) gin[1] = weight_grad<scalar_t>(d, G, dP.data<scalar_t>(), hs, ptr<scalar_t>(h0), out.dtype());
  });
  if (n.needs(2)) gin[2] = sum(dP.view({d.T * d.B, G}), {0});
  if (n.needs(0)) gin[0] = dX;
  if (n.needs(3)) gin[3] = dh0;
}
static const OpDef gru_recurrence_op("gru_recurrence", 4,
                                     "gru_recurrence(xp (T,B,3H), w_hh (3H,H), b_hh (3H), h0 (B,H)) -> (T,B,H)",
                                     "w_hh, h0, gates r, z, n and h W_hn^T + b_hn (T,B,4H) as a side output, output",
                                     gru_recurrence_backward, tangent_from_backward, [] { return recurrence_samples(3, true, false); });

Tensor gru_recurrence(const Tensor& xp_in, const Tensor& w_in, const Tensor& b_in, const Tensor& h0_in) {
  ProfileScope prof(gru_recurrence_op.name);
  const Dims d = check_recurrence(gru_recurrence_op.name, 3, xp_in, w_in, b_in, h0_in, Tensor());
  Tensor xp, w, b, h0;
  {
    NoGradGuard ng;
    xp = contig(xp_in), w = contig(w_in), b = contig(b_in), h0 = contig(h0_in);
  }
  Tensor out = empty({d.T, d.B, d.H}, xp.dtype());
  Tensor act = empty({d.T, d.B, 4 * d.H}, xp.dtype());
  dispatch_float(xp.dtype(), gru_recurrence_op.name, [&](auto tag) {
    using scalar_t = decltype(tag);
    const Tensor zero = zeros({std::max(d.B, int64_t{3}) * d.H}, xp.dtype());
    forward_by_units<scalar_t>(d, 3, w, false, [&](Units u, int64_t t, const scalar_t* wu, scalar_t* hp) {
      gru_forward_step(d, u, t, xp.data<scalar_t>(), wu, ptr<scalar_t>(b), ptr<scalar_t>(h0), zero.data<scalar_t>(),
                       hp, act.data<scalar_t>(), out.data<scalar_t>());
    });
  });
  if (Node* n = record(gru_recurrence_op, out, xp_in, w_in, b_in, h0_in)) {
    n->save(w_in);             // GruSaved::kWeight
    n->save(h0_in);            // kH0
    n->save_side_output(act);  // kGates
    n->save(out);              // kOutput
  }
  return out;
}

}  // namespace tg
