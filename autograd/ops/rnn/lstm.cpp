// lstm_recurrence (see ../rnn_ops.h): the LSTM's tangent kernel, recorded backward and OpDef.
#include "autograd/ops/rnn_ops.h"

#include "autograd/forward_ad.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/rnn/lstm_kernels.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::row_grain;
using namespace detail::rnn;


// Tangent, step t of part p: da_t = drive_t + dh_{t-1} W^T (the drive (T,B,4H)
// holds dxp + h_{t-1} dW^T), di = i(1-i) da_i, df, do alike, dg = (1-g^2) da_g,
// dc_t = df c_{t-1} + f dc_{t-1} + di g + i dg, dh_t = do tanh(c_t) + o (1 - tanh^2 c_t) dc_t.
// dh0 nullptr: zero; w, z as in the forward step, z nullptr for dact itself.
template <class S>
static void lstm_tangent_step(const Dims& d, Part p, int64_t t, const S* drive, const S* w, const S* dh0,
                              const S* dc0, const S* c0, const S* zero, const S* act, const S* cs, S* z, S* dact,
                              S* dhs, S* dcs) {
  const Units u = p.units;
  const int64_t B = d.B, H = d.H, n = u.n, G = 4 * H, Z = 4 * n, r0 = p.rows.first, rows = p.rows.n;
  const S* a = act + t * B * G;
  S* da = dact + t * B * G;
  S* dh = dhs + t * B * H;
  S* dc = dcs + t * B * H;
  const S* c = cs + t * B * H;
  const S* dhprev = t > 0 ? dh - B * H : dh0;
  const S* dcprev = t > 0 ? dc - B * H : dc0 ? dc0 : zero;
  const S* cprev = t > 0 ? c - B * H : c0 ? c0 : zero;
  z = (z ? z : da) + r0 * Z;  // the part's rows
  lstm_preactivations(d, p, t, drive, dhprev, w, z);
  parallel_for(rows, row_grain(Z, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t row = row0; row < row1; ++row) {
      const int64_t b = r0 + row;
      const S *zi = z + row * Z, *zf = zi + n, *zg = zf + n, *zo = zg + n;
      const S *ai = a + b * G + u.first, *af = ai + H, *ag = af + H, *ao = ag + H;
      S *di = da + b * G + u.first, *df = di + H, *dg = df + H, *dout = dg + H;
      const int64_t r = b * H + u.first;
      const S *cp = cprev + r, *dcp = dcprev + r, *cb = c + r;
      S *dcb = dc + r, *dhb = dh + r;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S i = ai[j], f = af[j], g = ag[j], o = ao[j], tc = vtanh(cb[j]);
        const S ti = i * (S(1) - i) * zi[j], tf = f * (S(1) - f) * zf[j], tg = (S(1) - g * g) * zg[j],
                to = o * (S(1) - o) * zo[j];
        di[j] = ti, df[j] = tf, dg[j] = tg, dout[j] = to;
        const S tcn = tf * cp[j] + f * dcp[j] + ti * g + i * tg;
        dcb[j] = tcn;
        dhb[j] = to * tc + o * (S(1) - tc * tc) * tcn;
      }
    }
  });
}

// Recorded: one lstm_gate_slopes node (from the side output act) and one lstm_recurrence_grad node; a
// gradient gact that reached act adds P = gact * slope to dA_t and P_t W to the gradient of h_{t-1}.
static void lstm_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor w = n.saved_tensor(&LstmSaved::weight), h0 = n.saved_tensor(&LstmSaved::h0);
  const Tensor c0 = n.saved_tensor(&LstmSaved::c0), out = n.saved_tensor(&LstmSaved::output);
  const Tensor act = n.saved_tensor(&LstmSaved::gates);
  const int64_t H = out.size(3);
  const Tensor cs = select(out, 0, 1);
  const Tensor hprev = previous_states(select(out, 0, 0), h0), cprev = previous_states(cs, c0);  // (T,B,H)
  const Tensor s = lstm_gate_slopes(act, cs, cprev);  // (T,B,6H): [f, k, j]
  Tensor gout = grad, P;
  if (const Tensor& gact = n.side_grad(&LstmSaved::gates); gact.defined()) {
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
  const auto ins =
      saved_contig(n, &LstmSaved::weight, &LstmSaved::h0, &LstmSaved::c0, &LstmSaved::gates, &LstmSaved::output);
  const Tensor &w = ins[0], &h0 = ins[1], &c0 = ins[2], &act = ins[3], &out = ins[4];
  const Tensor gact = contig(n.side_grad(&LstmSaved::gates));
  const Dims d{out.size(1), out.size(2), out.size(3)};
  const Tensor g = grad.contiguous(), dG = empty(act.shape(), out.dtype()), rec = zeros({3, d.B, d.H}, out.dtype());
  Tensor dh0 = n.needs(2) ? empty({d.B, d.H}, out.dtype()) : Tensor(), dW;
  Tensor dc0 = n.needs(3) ? empty({d.B, d.H}, out.dtype()) : Tensor();
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    const S* hs = out.data<S>();
    auto run = [&](const auto* a) {
      backward_by_parts(d, 4, out.dtype(), [&](Part p, int64_t c) {
        lstm_backward_call(d, p, c, g.data<S>(), ptr<S>(gact), w.data<S>(), ptr<S>(c0), a, hs + d.T * d.B * d.H,
                           dG.data<S>(), rec.data<S>(), ptr<S>(dh0), ptr<S>(dc0));
      });
    };
    if constexpr (std::is_same_v<S, float>)
      if (act.dtype() == DType::bf16) run(act.data<bfloat16>());
    if (act.dtype() == out.dtype()) run(act.data<S>());
    if (n.needs(1)) dW = weight_grad<S>(d, 4 * d.H, dG.data<S>(), hs, ptr<S>(h0), out.dtype());
  });
  set_needed(n, gin, {dG, dW, dh0, dc0});
}
// Tangent: lstm_tangent_step run like the forward, W's term by one GEMM; act gets its tangent dact.
static void lstm_recurrence_tangent(const Node& n, std::span<const Tensor> tin, std::span<Tensor> tout) {
  const Tensor dxp = tangent_at(tin, 0), dw = contig(tangent_at(tin, 1));
  const Tensor dh0 = contig(tangent_at(tin, 2)), dc0 = contig(tangent_at(tin, 3));
  if (!dxp.defined() && !dw.defined() && !dh0.defined() && !dc0.defined()) return;
  const auto ins =
      saved_contig(n, &LstmSaved::weight, &LstmSaved::h0, &LstmSaved::c0, &LstmSaved::gates, &LstmSaved::output);
  const Tensor &w = ins[0], &h0 = ins[1], &c0 = ins[2], act = detail::as_float(ins[3]), &out = ins[4];
  const Dims d{out.size(1), out.size(2), out.size(3)};
  const int64_t BH = d.B * d.H;
  Tensor drive = dxp.defined() ? dxp.clone() : zeros(act.shape(), act.dtype());
  Tensor dact = empty(act.shape(), act.dtype()), dout = empty(out.shape(), out.dtype());
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    S *dr = drive.data<S>(), *dhs = dout.data<S>();
    const S* hs = out.data<S>();
    if (dw.defined()) add_previous_states_times(d, 4 * d.H, 0, d.T, dw.data<S>(), hs, ptr<S>(h0), dr);
    const Tensor zero = c0.defined() && dc0.defined() ? Tensor() : zeros({d.B, d.H}, out.dtype());
    forward_by_parts<S>(d, 4, w, true, [&](Part p, int64_t t, const S* wu, S* z) {
      lstm_tangent_step(d, p, t, dr, wu, ptr<S>(dh0), ptr<S>(dc0), ptr<S>(c0), ptr<S>(zero), act.data<S>(),
                        hs + d.T * BH, z, dact.data<S>(), dhs, dhs + d.T * BH);
    });
  });
  tout[0] = dout, tout[1] = dact;
}
static const OpDef lstm_recurrence_op({.name = "lstm_recurrence", .arity = 4,
                                       .signature = "lstm_recurrence(xp (T,B,4H), w_hh (4H,H), h0 (B,H), c0 (B,H)) -> (2,T,B,H) [h_t; c_t]",
                                       .saves = saves_of<LstmSaved>(), .backward = lstm_recurrence_backward,
                                       .recorded_backward = lstm_backward_recorded,
                                       .backward_with_tangents = lstm_backward_tangents,
                                       .tangent = lstm_recurrence_tangent,
                                       .tangent_once_differentiable = true,
                                       .samples = [] { return recurrence_samples(4, false, true); }});

Tensor lstm_recurrence(const Tensor& xp_in, const Tensor& w_in, const Tensor& h0_in, const Tensor& c0_in) {
  ProfileScope prof(lstm_recurrence_op.name);
  const Dims d = check_recurrence(lstm_recurrence_op.name, 4, xp_in, w_in, Tensor(), h0_in, c0_in);
  const auto ins = contig_all(xp_in, w_in, h0_in, c0_in);
  const Tensor &xp = ins[0], &w = ins[1], &h0 = ins[2], &c0 = ins[3];
  // Under autocast the gates are written rounded to bfloat16, as a recurrence run in bfloat16 keeps
  // them (torch's oneDNN LSTM), and the node keeps them so, in half the memory; not where a forward-mode
  // level wants their tangent. Unrecorded too (an evaluation under autocast): the same blocks as training's.
  const bool round = autocast_enabled() && xp.dtype() == DType::f32 && !forward_ad_enabled();
  Tensor out = empty({2, d.T, d.B, d.H}, xp.dtype()), act = empty(xp.shape(), round ? DType::bf16 : xp.dtype());
  dispatch_float(xp.dtype(), lstm_recurrence_op.name, [&](auto tag) {
    using S = decltype(tag);
    S* hs = out.data<S>();
    const Tensor zero = c0.defined() ? Tensor() : zeros({d.B, d.H}, xp.dtype());
    auto run = [&](auto* a) {
      forward_by_parts<S>(d, 4, w, !round, [&](Part p, int64_t t, const S* wu, S* z) {
        lstm_forward_step(d, p, t, xp.data<S>(), wu, ptr<S>(h0), ptr<S>(c0), ptr<S>(zero), z, a, hs,
                          hs + d.T * d.B * d.H);
      });
    };
    if constexpr (std::is_same_v<S, float>)
      if (round) return run(act.data<bfloat16>());
    run(act.data<S>());
  });
  if (Node* n = record(lstm_recurrence_op, out, xp_in, w_in, h0_in, c0_in))
    n->save(LstmSaved{.weight = w_in, .h0 = h0_in, .c0 = c0_in, .gates = act, .output = out});
  return out;
}

}  // namespace tg
