// rnn_tanh_recurrence (see ../rnn_ops.h): the tanh RNN's kernels, recorded backward and OpDef.
#include "autograd/ops/rnn_ops.h"

#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/rnn/common.h"
#include "autograd/ops/tangent.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::row_grain;
using detail::tangent_or_zeros;
using namespace detail::rnn;

// Saves w_hh and h0 as given and the output (tanh' = 1 - h^2): the recorded backward needs nothing more.
namespace {
struct RnnTanhSaved {
  Tensor weight, h0, output;
  static constexpr std::tuple fields{
      saved_field("weight", &RnnTanhSaved::weight), saved_field("h0", &RnnTanhSaved::h0),
      saved_field("output", &RnnTanhSaved::output)};
};
}  // namespace
// Step t of part p (see forward_by_parts; z nullptr: h_t itself).
template <class S>
static void rnn_tanh_forward_step(const Dims& d, Part p, int64_t t, const S* xp, const S* w, const S* h0, S* z,
                                  S* hs) {
  const Units u = p.units;
  const int64_t B = d.B, H = d.H, n = u.n, r0 = p.rows.first, rows = p.rows.n;
  S* h = hs + t * B * H;
  const S* hprev = t > 0 ? h - B * H : h0;
  z = (z ? z : h) + r0 * n;  // the part's rows
  for (int64_t row = 0; row < rows; ++row) std::copy_n(xp + (t * B + r0 + row) * H + u.first, n, z + row * n);
  if (hprev) gemm(false, true, rows, n, H, S(1), hprev + r0 * H, H, w, H, S(1), z, n);
  parallel_for(rows, row_grain(n, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t row = row0; row < row1; ++row) {
      const S* zb = z + row * n;
      S* hb = h + (r0 + row) * H + u.first;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) hb[j] = vtanh(zb[j]);
    }
  });
}

// Call c of part p (see backward_by_parts); rec (B,H) is zero on entry.
template <class S>
static void rnn_tanh_backward_call(const Dims& d, Part p, int64_t c, const S* gout, const S* w, const S* hs,
                                   S* dA, S* rec, S* dh0) {
  const Units u = p.units;
  const int64_t T = d.T, B = d.B, H = d.H, n = u.n, r0 = p.rows.first, rows = p.rows.n;
  if (S* to = c == T ? dh0 : rec; c > 0 && to)
    gemm(false, false, rows, n, H, S(1), dA + ((T - c) * B + r0) * H, H, w + u.first, H, S(0), to + r0 * H + u.first,
         H);
  if (c == T) return;
  const int64_t at = (T - 1 - c) * B * H + u.first;
  parallel_for(rows, row_grain(n, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t b = r0 + row0; b < r0 + row1; ++b) {
      const S *h = hs + at + b * H, *g = gout + at + b * H, *dh = rec + b * H + u.first;
      S* da = dA + at + b * H;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) da[j] = (g[j] + dh[j]) * (S(1) - h[j] * h[j]);
    }
  });
}

// Recorded: with k = 1 - h_t^2, u_t = g_t + (u_{t+1} k_{t+1}) W is one gated_recurrence_grad node,
// and da = u k, dW = sum_t da_t^T h_{t-1} (one GEMM), dh0 = da_0 W.
static void rnn_tanh_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor w = n.saved_tensor(&RnnTanhSaved::weight), h0 = n.saved_tensor(&RnnTanhSaved::h0);
  const Tensor out = n.saved_tensor(&RnnTanhSaved::output);
  const Tensor k = rsub(1.0, mul(out, out));
  const Tensor dA = mul(gated_recurrence_grad(grad, Tensor(), k, w), k);
  if (n.needs(0)) gin[0] = dA;
  if (n.needs(1)) gin[1] = weight_grad_recorded(dA, previous_states(out, h0));
  if (n.needs(2)) gin[2] = matmul(select(dA, 0, 0), w);
}

// Forward over reverse: the gradients and their tangents in one recursion. With
// k_t = 1 - h_t^2 and kt_t = -2 h_t ht_t, going t = T-1 .. 0 from e = et = 0:
//   u = g_t + e,  dA_t = u k_t,  dAt_t = (gt_t + et) k_t + u kt_t,
//   e = dA_t W,  et = dAt_t W + dA_t Wt      (into step t-1; dh0 and its tangent after step 0)
// ([dA_t; dAt_t] W one GEMM of twice the rows). dW's tangent sum_t dAt_t^T h_{t-1} + dA_t^T ht_{t-1}
// takes two GEMMs over all steps.
static bool rnn_tanh_backward_tangents(const Node& n, const Tensor& grad, std::span<Tensor> gin,
                                       std::span<Tensor> gin_tangents) {
  const Tensor w = n.saved_tensor(&RnnTanhSaved::weight), h0 = n.saved_tensor(&RnnTanhSaved::h0);
  const Tensor out = n.saved_tensor(&RnnTanhSaved::output);
  const Tensor wc = contig(w), h0c = contig(h0), hs = out.contiguous(), g = grad.contiguous();
  const Tensor wt = tangent_or_zeros(w), hts = tangent_or_zeros(out), gt = tangent_or_zeros(grad);
  const Tensor h0t = h0.defined() ? tangent_or_zeros(h0) : Tensor();
  const Dims d{out.size(0), out.size(1), out.size(2)};
  Tensor dA = empty(out.shape(), out.dtype()), dAt = empty(out.shape(), out.dtype());
  Tensor dh0 = zeros({d.B, d.H}, out.dtype()), dh0t = zeros({d.B, d.H}, out.dtype());
  Tensor dW, dWt;
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    for_batch_rows(d, d.H, [&](Rows rows) {
      const int64_t H = d.H, m = rows.n * H;
      std::vector<S> P(2 * m), E(2 * m, S(0));  // [dA_t; dAt_t] and [e; et]
      for (int64_t t = d.T; t-- > 0;) {
        const int64_t r = (t * d.B + rows.first) * H;
        const S *gr = g.data<S>() + r, *gtr = gt.data<S>() + r, *h = hs.data<S>() + r, *ht = hts.data<S>() + r;
        const S *e = E.data(), *et = E.data() + m;
        S *a = P.data(), *at = P.data() + m;
#pragma omp simd
        for (int64_t i = 0; i < m; ++i) {
          const S k = S(1) - h[i] * h[i], u = gr[i] + e[i];
          a[i] = u * k;
          at[i] = (gtr[i] + et[i]) * k - S(2) * u * h[i] * ht[i];
        }
        std::copy_n(a, m, dA.data<S>() + r);
        std::copy_n(at, m, dAt.data<S>() + r);
        gemm(false, false, 2 * rows.n, H, H, S(1), a, H, wc.data<S>(), H, S(0), E.data(), H);
        gemm(false, false, rows.n, H, H, S(1), a, H, wt.data<S>(), H, S(1), E.data() + m, H);
      }
      std::copy_n(E.data(), m, dh0.data<S>() + rows.first * H);  // E holds dh0 and its tangent after step 0
      std::copy_n(E.data() + m, m, dh0t.data<S>() + rows.first * H);
    });
    if (n.needs(1)) {
      dW = weight_grad<S>(d, d.H, dA.data<S>(), hs.data<S>(), ptr<S>(h0c), out.dtype());
      dWt = weight_grad<S>(d, d.H, dAt.data<S>(), hs.data<S>(), ptr<S>(h0c), out.dtype());
      add_weight_grad<S>(d, d.H, 0, d.T, dA.data<S>(), hts.data<S>(), ptr<S>(h0t), dWt.data<S>());
    }
  });
  gin[0] = dA, gin[1] = dW, gin[2] = dh0;
  gin_tangents[0] = dAt, gin_tangents[1] = dWt, gin_tangents[2] = dh0t;
  return true;
}

static void rnn_tanh_recurrence_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const auto ins = saved_contig(n, &RnnTanhSaved::weight, &RnnTanhSaved::h0);
  const Tensor &w = ins[0], &h0 = ins[1];
  const Tensor out = n.saved_tensor(&RnnTanhSaved::output), g = grad.contiguous();
  const Dims d{out.size(0), out.size(1), out.size(2)};
  Tensor dA = empty(out.shape(), out.dtype()), dW;
  Tensor dh0 = n.needs(2) ? empty({d.B, d.H}, out.dtype()) : Tensor(), rec = zeros({d.B, d.H}, out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    backward_by_parts(d, 1, out.dtype(), [&](Part p, int64_t c) {
      rnn_tanh_backward_call(d, p, c, g.data<S>(), w.data<S>(), out.data<S>(), dA.data<S>(), rec.data<S>(),
                             ptr<S>(dh0));
    });
    if (n.needs(1)) dW = weight_grad<S>(d, d.H, dA.data<S>(), out.data<S>(), ptr<S>(h0), out.dtype());
  });
  set_needed(n, gin, {dA, dW, dh0});
}
// Tangent: dh_t = k_t (c_t + dh_{t-1} W^T), k_t = 1 - h_t^2, c_t = dxp_t +
// h_{t-1} dW^T (and dh0 W^T at t = 0; one GEMM for all steps): the transpose
// of the backward recursion (gated_recurrence_grad with j = k, no carry) applied to k c.
static void rnn_tanh_recurrence_tangent(const Node& n, std::span<const Tensor> tin, std::span<Tensor> tout) {
  const Tensor dxp = tangent_at(tin, 0), dw = contig(tangent_at(tin, 1)), dh0 = contig(tangent_at(tin, 2));
  if (!dxp.defined() && !dw.defined() && !dh0.defined()) return;
  const auto ins = saved_contig(n, &RnnTanhSaved::weight, &RnnTanhSaved::h0);
  const Tensor &w = ins[0], &h0 = ins[1];
  const Tensor out = n.saved_tensor(&RnnTanhSaved::output);
  const Dims d{out.size(0), out.size(1), out.size(2)};
  Tensor c = dxp.defined() ? dxp.clone() : zeros(out.shape(), out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    if (dw.defined()) add_previous_states_times(d, d.H, 0, d.T, dw.data<S>(), out.data<S>(), ptr<S>(h0), c.data<S>());
    if (dh0.defined()) gemm(false, true, d.B, d.H, d.H, S(1), dh0.data<S>(), d.H, w.data<S>(), d.H, S(1), c.data<S>(), d.H);
  });
  const Tensor k = rsub(1.0, mul(out, out));
  tout[0] = gated_recurrence_transpose(mul(k, c), Tensor(), k, w);
}

static const OpDef rnn_tanh_recurrence_op({.name = "rnn_tanh_recurrence", .arity = 3,
                                           .signature = "rnn_tanh_recurrence(xp (T,B,H), w_hh (H,H), h0 (B,H)) -> (T,B,H)",
                                           .saves = saves_of<RnnTanhSaved>(), .backward = rnn_tanh_recurrence_backward,
                                           .recorded_backward = rnn_tanh_backward_recorded,
                                           .backward_with_tangents = rnn_tanh_backward_tangents,
                                           .tangent = rnn_tanh_recurrence_tangent,
                                           .tangent_once_differentiable = true,
                                           .samples = [] { return recurrence_samples(1, false, false); }});

Tensor rnn_tanh_recurrence(const Tensor& xp_in, const Tensor& w_in, const Tensor& h0_in) {
  ProfileScope prof(rnn_tanh_recurrence_op.name);
  const Dims d = check_recurrence(rnn_tanh_recurrence_op.name, 1, xp_in, w_in, Tensor(), h0_in, Tensor());
  const auto ins = contig_all(xp_in, w_in, h0_in);
  const Tensor &xp = ins[0], &w = ins[1], &h0 = ins[2];
  Tensor out = empty({d.T, d.B, d.H}, xp.dtype());
  dispatch_float(xp.dtype(), rnn_tanh_recurrence_op.name, [&](auto tag) {
    using S = decltype(tag);
    forward_by_parts<S>(d, 1, w, true, [&](Part p, int64_t t, const S* wu, S* z) {
      rnn_tanh_forward_step(d, p, t, xp.data<S>(), wu, ptr<S>(h0), z, out.data<S>());
    });
  });
  if (Node* n = record(rnn_tanh_recurrence_op, out, xp_in, w_in, h0_in))
    n->save(RnnTanhSaved{.weight = w_in, .h0 = h0_in, .output = out});
  return out;
}

}  // namespace tg
