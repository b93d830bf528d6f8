#pragma once
// The LSTM's node and step kernels, shared by lstm.cpp, lstm_grad.cpp and lstm_recompute.cpp (chunk by
// chunk). Static: each file inlines its own copy into its loops.
#include "autograd/ops/rnn/common.h"

namespace tg::detail::rnn {

// lstm_recurrence's node: w_hh, h0, c0 as given, the output (2,T,B,H) [h_t; c_t] and act (T,B,4H), the
// gate activations [sig(i), sig(f), tanh(g), sig(o)], a side output: the recorded backward computes its
// slopes from it, and the fused backward adds a gradient a second-order pass sent into it. Under
// autocast act is kept in bfloat16 (see lstm_recurrence), read back as float32 where grad mode is on.
struct LstmSaved {
  Tensor weight, h0, c0;
  SideOutput gates;
  Tensor output;
  static constexpr std::tuple fields{
      saved_field("weight", &LstmSaved::weight), saved_field("h0", &LstmSaved::h0), saved_field("c0", &LstmSaved::c0),
      saved_field("gates", &LstmSaved::gates), saved_field("output", &LstmSaved::output)};
};

// The part's gate pre-activations of step t: z (its rows, 4n) = in_t (its rows, its units of each gate)
// + prev (its rows) W^T, W the part's rows of W_hh (4n,H); prev nullptr: in_t alone.
template <class S>
static void lstm_preactivations(const Dims& d, Part p, int64_t t, const S* in, const S* prev, const S* w, S* z) {
  const int64_t B = d.B, H = d.H, n = p.units.n, G = 4 * H, Z = 4 * n, r0 = p.rows.first;
  for (int64_t row = 0; row < p.rows.n; ++row)
    for (int64_t q = 0; q < 4; ++q)
      std::copy_n(in + (t * B + r0 + row) * G + q * H + p.units.first, n, z + row * Z + q * n);
  if (prev) gemm(false, true, p.rows.n, Z, H, S(1), prev + r0 * H, H, w, H, S(1), z, Z);
}

// Step t of part p (see forward_by_parts; z nullptr: the step's act itself); zero (B,H) stands in for a
// missing c0. act is S, or bfloat16 (z then given): the gates are computed in z and rounded into act.
template <class S, class A>
static void lstm_forward_step(const Dims& d, Part p, int64_t t, const S* xp, const S* w, const S* h0, const S* c0,
                              const S* zero, S* z, A* act, S* hs, S* cs) {
  constexpr bool in_act = std::is_same_v<A, S>;
  const Units u = p.units;
  const int64_t B = d.B, H = d.H, n = u.n, G = 4 * H, Z = 4 * n, r0 = p.rows.first, rows = p.rows.n;
  A* a = act + t * B * G;
  S* h = hs + t * B * H;
  S* c = cs + t * B * H;
  const S* hprev = t > 0 ? h - B * H : h0;
  const S* cprev = t > 0 ? c - B * H : c0 ? c0 : zero;
  if constexpr (in_act) z = z ? z : a;
  z += r0 * Z;  // the part's rows
  lstm_preactivations(d, p, t, xp, hprev, w, z);
  parallel_for(rows, row_grain(Z, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t row = row0; row < row1; ++row) {
      const int64_t b = r0 + row;
      S *zi = z + row * Z, *zf = zi + n, *zg = zf + n, *zo = zg + n;
      const int64_t r = b * H + u.first;
      const S* cp = cprev + r;
      S *cb = c + r, *hb = h + r;
      // The gates go to act (S), or back into z, to be rounded into act below.
      S *ai = zi, *af = zf, *ag = zg, *ao = zo;
      if constexpr (in_act) ai = a + b * G + u.first, af = ai + H, ag = af + H, ao = ag + H;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S i = vsigmoid(zi[j]), f = vsigmoid(zf[j]), g = vtanh(zg[j]), o = vsigmoid(zo[j]);
        ai[j] = i, af[j] = f, ag[j] = g, ao[j] = o;
        const S cn = i * g + f * cp[j];
        cb[j] = cn;
        hb[j] = o * vtanh(cn);
      }
      if constexpr (!in_act)
        for (int64_t q = 0; q < 4; ++q) float_to_bf16(zi + q * n, a + b * G + q * H + u.first, n);
    }
  });
}

// gout (2,T,B,H) is the gradient of [h_t; c_t]; fills dG (T,B,4H), the
// gradient of the pre-activation gates (= of xp), and dh0 / dc0 if given.
// Call c of part p (see backward_by_parts). rec (3,B,H) is zero on entry: the gradients reaching h_t and
// c_t from step t+1, and c_{-1} = 0. gact (T,B,4H), the gradient that reached the activations, joins dG_t.
// act is S, or bfloat16 where the node kept the gates rounded (autocast), read as float.
template <class S, class A>
static void lstm_backward_call(const Dims& d, Part p, int64_t c, const S* gout, const S* gact, const S* w,
                               const S* c0, const A* act, const S* cs, S* dG, S* rec, S* dh0, S* dc0) {
  const Units u = p.units;
  const int64_t T = d.T, B = d.B, H = d.H, n = u.n, G = 4 * H, r0 = p.rows.first, rows = p.rows.n;
  S* dh = rec;
  S* dc = dh + B * H;
  const S* zero = dc + B * H;
  if (S* to = c == T ? dh0 : dh; c > 0 && to)
    gemm(false, false, rows, n, G, S(1), dG + ((T - c) * B + r0) * G, G, w + u.first, H, S(0),
         to + r0 * H + u.first, H);
  if (c == T) {
    if (dc0)
      for (int64_t b = r0; b < r0 + rows; ++b) std::copy_n(dc + b * H + u.first, n, dc0 + b * H + u.first);
    return;
  }
  const int64_t t = T - 1 - c;
  const S* cprev = t > 0 ? cs + (t - 1) * B * H : c0 ? c0 : zero;
  parallel_for(rows, row_grain(4 * n, kGateGrain), [&](int64_t row0, int64_t row1) {
    for (int64_t b = r0 + row0; b < r0 + row1; ++b) {
      const int64_t r = b * H + u.first, at = t * B * H + r;
      const A *ai = act + t * B * G + b * G + u.first, *af = ai + H, *ag = af + H, *ao = ag + H;
      S *di = dG + t * B * G + b * G + u.first, *df = di + H, *dgg = df + H, *dout = dgg + H;
      const S *gh = gout + at, *gc = gout + T * B * H + at, *ct = cs + at, *cp = cprev + r;
      S *dhb = dh + r, *dcb = dc + r;
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) {
        const S i = S(ai[j]), f = S(af[j]), g = S(ag[j]), o = S(ao[j]);
        const S tc = vtanh(ct[j]);
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
        const S i = S(ai[j]), f = S(af[j]), g = S(ag[j]), o = S(ao[j]);
        di[j] += gi[j] * i * (S(1) - i);
        df[j] += gf[j] * f * (S(1) - f);
        dgg[j] += gg[j] * (S(1) - g * g);
        dout[j] += go[j] * o * (S(1) - o);
      }
    }
  });
}

}  // namespace tg::detail::rnn
