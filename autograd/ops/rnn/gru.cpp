// gru_recurrence (see ../rnn_ops.h): the GRU's kernels, recorded backward and OpDef.
#include "autograd/ops/rnn_ops.h"

#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/rnn/common.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::row_grain;
using namespace detail::rnn;

// Saves w_hh, h0 as given, the output and act (T,B,4H): r, z, n and hn = h W_hn^T + b_hn (needed for dr), a
// side output of the node, from which the recorded backward computes its slopes.
namespace {
struct GruSaved {
  Tensor weight, h0;
  SideOutput gates;
  Tensor output;
  static constexpr std::tuple fields{
      saved_field("weight", &GruSaved::weight), saved_field("h0", &GruSaved::h0),
      saved_field("gates", &GruSaved::gates), saved_field("output", &GruSaved::output)};
};
}  // namespace

// Step t of part p (see forward_by_parts), hp the (B,3n) of its units for h_{t-1} W_hh^T (the bias is
// added in the pointwise pass); zero (>= B H and 3H elements) stands in for a missing h0 or bias.
template <class S>
static void gru_forward_step(const Dims& d, Part p, int64_t t, const S* xp, const S* w, const S* bias, const S* h0,
                             const S* zero, S* hp, S* act, S* hs) {
  const Units u = p.units;
  const int64_t B = d.B, H = d.H, n = u.n, G = 3 * H, P = 3 * n, r0 = p.rows.first, rows = p.rows.n;
  S* h = hs + t * B * H;
  const S* hprev = t > 0 ? h - B * H : h0;
  hp += r0 * P;  // the part's rows
  if (hprev)
    gemm(false, true, rows, P, H, S(1), hprev + r0 * H, H, w, H, S(0), hp, P);
  else
    std::fill_n(hp, rows * P, S(0)), hprev = zero;
  const S* x = xp + t * B * G + u.first;
  const S* bb = (bias ? bias : zero) + u.first;
  S* a = act + t * B * 4 * H + u.first;
  parallel_for(rows, row_grain(P, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t row = row0; row < row1; ++row) {
      const int64_t b = r0 + row;
      const S *xr = x + b * G, *xz = xr + H, *xn = xz + H;
      const S *pr = hp + row * P, *pz = pr + n, *pn = pz + n;
      S *ar = a + b * 4 * H, *az = ar + H, *an = az + H, *ahn = an + H;
      const S* hb = hprev + b * H + u.first;
      S* out = h + b * H + u.first;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S hn = pn[j] + bb[2 * H + j];
        const S r = vsigmoid(xr[j] + pr[j] + bb[j]), z = vsigmoid(xz[j] + pz[j] + bb[H + j]);
        const S nn = vtanh(xn[j] + r * hn);
        ar[j] = r, az[j] = z, an[j] = nn, ahn[j] = hn;
        out[j] = (S(1) - z) * nn + z * hb[j];
      }
    }
  });
}

// Fills dX (T,B,3H), the gradient of xp, and dP (T,B,3H), that of the hidden
// projection h W_hh^T + b_hh (they differ in the n gate: dP_n = r dX_n).
// Call c of part p (see backward_by_parts; the GEMM adds dP_t W to the direct
// path). rec (2,B,H) is zero on entry: the gradient reaching h_t, and h_{-1} = 0.
template <class S>
static void gru_backward_call(const Dims& d, Part p, int64_t c, const S* gout, const S* w, const S* h0, const S* act,
                              const S* hs, S* dX, S* dP, S* rec, S* dh0) {
  const Units u = p.units;
  const int64_t T = d.T, B = d.B, H = d.H, n = u.n, G = 3 * H, r0 = p.rows.first, rows = p.rows.n;
  S* dh = rec;
  const S* zero = rec + B * H;
  if (S* to = c == T ? dh0 : dh; c > 0 && to) {
    if (c == T)  // dh holds the direct path z_0 u_0 of these units
      for (int64_t b = r0; b < r0 + rows; ++b) std::copy_n(dh + b * H + u.first, n, dh0 + b * H + u.first);
    gemm(false, false, rows, n, G, S(1), dP + ((T - c) * B + r0) * G, G, w + u.first, H, S(1), to + r0 * H + u.first,
         H);
  }
  if (c == T) return;
  const int64_t t = T - 1 - c;
  const S* hprev = t > 0 ? hs + (t - 1) * B * H : h0 ? h0 : zero;
  parallel_for(rows, row_grain(3 * n, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t b = r0 + row0; b < r0 + row1; ++b) {
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
    }
  });
}

// Recorded: with p = h_{t-1} W^T + b_hh (hn = p_n), c = (1 - z)(1 - n^2) and
// the slopes of p, j = [c hn r(1-r), (h_{t-1} - n) z(1-z), c r], the gradient
// u_t reaching h_t is one gated_recurrence_grad node (carry z), and dp = u j,
// dxp = [dp_r, dp_z, u c], dW = sum_t dp_t^T h_{t-1}, db_hh = sum dp,
// dh0 = z_0 u_0 + dp_0 W. A gradient gact = [g_r, g_z, g_n, g_hn] that reached
// the activations, with A_n = g_n (1-n^2), A_r = (g_r + A_n hn) r(1-r),
// A_z = g_z z(1-z), adds [A_r, A_z, A_n] to dxp, Q = [A_r, A_z, g_hn + A_n r]
// to dp, and Q_t W to the gradient of h_{t-1}.
static void gru_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor w = n.saved_tensor(&GruSaved::weight), h0 = n.saved_tensor(&GruSaved::h0);
  const Tensor out = n.saved_tensor(&GruSaved::output), act = n.saved_tensor(&GruSaved::gates);
  const int64_t H = out.size(2), G = w.size(0);
  const Tensor hprev = previous_states(out, h0);
  const std::vector<Tensor> a = chunk(act, 4, 2);
  const Tensor &r = a[0], &z = a[1], &nn = a[2], &hn = a[3];
  const Tensor c = mul(rsub(1.0, z), rsub(1.0, mul(nn, nn)));
  const Tensor j = concat({mul(mul(c, hn), sigmoid_slope(r)), mul(sub(hprev, nn), sigmoid_slope(z)), mul(c, r)}, 2);
  Tensor g = grad, Qx, Q;
  if (const Tensor& gact = n.side_grad(&GruSaved::gates); gact.defined()) {
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
  // A gradient that reached the gates (second order, off the hot paths): the tensor-op form takes it.
  if (n.side_grad(&GruSaved::gates).defined()) return gru_backward_recorded(n, grad, gin);
  const auto ins = saved_contig(n, &GruSaved::weight, &GruSaved::h0, &GruSaved::gates, &GruSaved::output);
  const Tensor &w = ins[0], &h0 = ins[1], &act = ins[2], &out = ins[3];
  const Tensor g = grad.contiguous();
  const Dims d{out.size(0), out.size(1), out.size(2)};
  const int64_t G = 3 * d.H;
  Tensor dX = empty({d.T, d.B, G}, out.dtype()), dP = empty({d.T, d.B, G}, out.dtype()), dW, db;
  Tensor dh0 = n.needs(3) ? empty({d.B, d.H}, out.dtype()) : Tensor(), rec = zeros({2, d.B, d.H}, out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    backward_by_parts(d, 3, out.dtype(), [&](Part p, int64_t c) {
      gru_backward_call(d, p, c, g.data<S>(), w.data<S>(), ptr<S>(h0), act.data<S>(), out.data<S>(), dX.data<S>(),
                        dP.data<S>(), rec.data<S>(), ptr<S>(dh0));
    });
    if (n.needs(1)) dW = weight_grad<S>(d, G, dP.data<S>(), out.data<S>(), ptr<S>(h0), out.dtype());
  });
  if (n.needs(2)) db = sum(dP.view({d.T * d.B, G}), {0});
  set_needed(n, gin, {dX, dW, db, dh0});
}
static const OpDef gru_recurrence_op({.name = "gru_recurrence", .arity = 4,
                                      .signature = "gru_recurrence(xp (T,B,3H), w_hh (3H,H), b_hh (3H), h0 (B,H)) -> (T,B,H)",
                                      .saves = saves_of<GruSaved>(), .backward = gru_recurrence_backward,
                                      .recorded_backward = gru_backward_recorded,
                                      .samples = [] { return recurrence_samples(3, true, false); }});

Tensor gru_recurrence(const Tensor& xp_in, const Tensor& w_in, const Tensor& b_in, const Tensor& h0_in) {
  ProfileScope prof(gru_recurrence_op.name);
  const Dims d = check_recurrence(gru_recurrence_op.name, 3, xp_in, w_in, b_in, h0_in, Tensor());
  const auto ins = contig_all(xp_in, w_in, b_in, h0_in);
  const Tensor &xp = ins[0], &w = ins[1], &b = ins[2], &h0 = ins[3];
  Tensor out = empty({d.T, d.B, d.H}, xp.dtype()), act = empty({d.T, d.B, 4 * d.H}, xp.dtype());
  dispatch_float(xp.dtype(), gru_recurrence_op.name, [&](auto tag) {
    using S = decltype(tag);
    const Tensor zero = zeros({std::max(d.B, int64_t{3}) * d.H}, xp.dtype());
    forward_by_parts<S>(d, 3, w, false, [&](Part p, int64_t t, const S* wu, S* hp) {
      gru_forward_step(d, p, t, xp.data<S>(), wu, ptr<S>(b), ptr<S>(h0), zero.data<S>(), hp, act.data<S>(),
                       out.data<S>());
    });
  });
  if (Node* n = record(gru_recurrence_op, out, xp_in, w_in, b_in, h0_in))
    n->save(GruSaved{.weight = w_in, .h0 = h0_in, .gates = act, .output = out});
  return out;
}

}  // namespace tg
