// lstm_gate_slopes, lstm_recurrence_grad (see ../rnn_ops.h) and lstm_recurrence's forward over reverse.
#include "autograd/ops/rnn_ops.h"

#include <array>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/rnn/lstm_kernels.h"
#include "autograd/ops/tangent.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::row_grain;
using detail::tangent_or_zeros;
using namespace detail::rnn;

namespace {
struct LstmSlopesSaved {
  Tensor act, c, c_prev;
  static constexpr std::tuple fields{
      saved_field("act", &LstmSlopesSaved::act), saved_field("c", &LstmSlopesSaved::c),
      saved_field("c_prev", &LstmSlopesSaved::c_prev)};
};

// The slopes' local Jacobian, written once: the ten partials of s in (i, f, g, o, c, c_prev) besides
// ds_f/df = 1, at tc = tanh(c), T a scalar (the fused kernels) or a Tensor (the recorded backward).
template <class T>
struct SlopePartials {
  T k_o, k_c, ji_i, ji_g, jf_f, jf_cp, jg_i, jg_g, jo_o, jo_c;
};
template <class T>
SlopePartials<T> slope_partials(const T& i, const T& f, const T& g, const T& o, const T& tc, const T& cp) {
  const T tcc = 1 - tc * tc;
  return {tcc,         -2 * o * tc * tcc, g * (1 - 2 * i), i * (1 - i),     cp * (1 - 2 * f),
          f * (1 - f), 1 - g * g,         -2 * i * g,      tc * (1 - 2 * o), tcc * o * (1 - o)};
}
// Its transpose applied to ds = [df, dk, dji, djf, djg, djo]: the gradients of (i, f, g, o, c, c_prev).
template <class T>
std::array<T, 6> slopes_transpose(const SlopePartials<T>& p, const T& df, const T& dk, const T& dji, const T& djf,
                                  const T& djg, const T& djo) {
  return {dji * p.ji_i + djg * p.jg_i, df + djf * p.jf_f,           dji * p.ji_g + djg * p.jg_g,
          dk * p.k_o + djo * p.jo_o,   dk * p.k_c + djo * p.jo_c, djf * p.jf_cp};
}
}  // namespace

// Rows [r0, r1) of the T*B rows: act (.,4H), c and cp (.,H) -> s (.,6H).
template <class S>
static void lstm_slopes_forward(int64_t H, int64_t r0, int64_t r1, const S* act, const S* c, const S* cp, S* s) {
  for (int64_t r = r0; r < r1; ++r) {
    const S *ai = act + r * 4 * H, *af = ai + H, *ag = af + H, *ao = ag + H, *cr = c + r * H, *cpr = cp + r * H;
    S* sr = s + r * 6 * H;
#pragma omp simd
    for (int64_t q = 0; q < H; ++q) {
      const S i = ai[q], f = af[q], g = ag[q], o = ao[q], tc = vtanh(cr[q]);
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
      const auto p = slope_partials<S>(ai[q], af[q], ag[q], ao[q], vtanh(cr[q]), cpr[q]);
      const auto in = slopes_transpose<S>(p, d[q], d[H + q], d[2 * H + q], d[3 * H + q], d[4 * H + q], d[5 * H + q]);
      dar[q] = in[0], dar[H + q] = in[1], dar[2 * H + q] = in[2], dar[3 * H + q] = in[3];
      dcr[q] = in[4], dcpr[q] = in[5];
    }
  }
}

// The tangent, rows [r0, r1): dact (.,4H), dc and dcp (.,H) -> ds (.,6H), for the LSTM's forward over reverse.
template <class S>
static void lstm_slopes_tangent(int64_t H, int64_t r0, int64_t r1, const S* dact, const S* dc, const S* dcp,
                                const S* act, const S* c, const S* cp, S* ds) {
  for (int64_t r = r0; r < r1; ++r) {
    const S *ai = act + r * 4 * H, *af = ai + H, *ag = af + H, *ao = ag + H, *cr = c + r * H, *cpr = cp + r * H;
    const S *da = dact + r * 4 * H, *dcr = dc + r * H, *dcpr = dcp + r * H;
    S* d = ds + r * 6 * H;
#pragma omp simd
    for (int64_t q = 0; q < H; ++q) {
      const auto p = slope_partials<S>(ai[q], af[q], ag[q], ao[q], vtanh(cr[q]), cpr[q]);
      const S di = da[q], df = da[H + q], dg = da[2 * H + q], dout = da[3 * H + q], dct = dcr[q];
      d[q] = df;
      d[H + q] = p.k_o * dout + p.k_c * dct;
      d[2 * H + q] = p.ji_i * di + p.ji_g * dg;
      d[3 * H + q] = p.jf_f * df + p.jf_cp * dcpr[q];
      d[4 * H + q] = p.jg_i * di + p.jg_g * dg;
      d[5 * H + q] = p.jo_o * dout + p.jo_c * dct;
    }
  }
}

// Recorded (third and higher derivatives): the same partials in tensor ops.
static void lstm_slopes_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor act = n.saved_tensor(&LstmSlopesSaved::act), c = n.saved_tensor(&LstmSlopesSaved::c);
  const std::vector<Tensor> z = chunk(act, 4, 2), d = chunk(grad, 6, 2);
  const auto p = slope_partials<Tensor>(z[0], z[1], z[2], z[3], tanh(c), n.saved_tensor(&LstmSlopesSaved::c_prev));
  const std::array<Tensor, 6> in = slopes_transpose<Tensor>(p, d[0], d[1], d[2], d[3], d[4], d[5]);
  if (n.needs(0)) gin[0] = concat({in[0], in[1], in[2], in[3]}, 2);
  if (n.needs(1)) gin[1] = in[4];
  if (n.needs(2)) gin[2] = in[5];
}

static void lstm_gate_slopes_backward(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const auto ins = saved_contig(n, &LstmSlopesSaved::act, &LstmSlopesSaved::c, &LstmSlopesSaved::c_prev);
  const Tensor &act = ins[0], &c = ins[1], &cp = ins[2];
  const Tensor ds = grad.contiguous();
  const int64_t H = c.size(2), rows = c.size(0) * c.size(1);
  // All three in one pass (the LSTM's recorded backward needs them all).
  Tensor dact = empty(act.shape(), act.dtype()), dc = empty(c.shape(), c.dtype()), dcp = empty(cp.shape(), cp.dtype());
  dispatch_float(act.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    parallel_for(rows, row_grain(6 * H, kGateGrain), [&](int64_t r0, int64_t r1) {
      lstm_slopes_backward<S>(H, r0, r1, ds.data<S>(), act.data<S>(), c.data<S>(), cp.data<S>(), dact.data<S>(),
                              dc.data<S>(), dcp.data<S>());
    });
  });
  set_needed(n, gin, {dact, dc, dcp});
}
static const OpDef lstm_gate_slopes_op({
    .name = "lstm_gate_slopes",
    .arity = 3,
    .signature = "lstm_gate_slopes(act (T,B,4H) [i, f, g, o], c (T,B,H), c_prev (T,B,H)) -> (T,B,6H) [f, k, j]",
    .saves = saves_of<LstmSlopesSaved>(),
    .backward = lstm_gate_slopes_backward,
    .recorded_backward = lstm_slopes_backward_recorded,
    .samples = [] {
      using samples::uniform;
      const int64_t T = 3, B = 2, H = 3;
      auto fn = [](const std::vector<Tensor>& x) { return lstm_gate_slopes(x[0], x[1], x[2]); };
      return std::vector<OpSample>{
          {"T=3 B=2 H=3", {uniform({T, B, 4 * H}, 221), uniform({T, B, H}, 222, -2, 2), uniform({T, B, H}, 223)}, fn},
          {"non-contiguous act",
           {samples::strided({1, B, 4 * H}, 224), uniform({1, B, H}, 225), uniform({1, B, H}, 226)},
           fn},
      };
    },
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
  const auto ins = contig_all(act_in, c_in, cp_in);
  const Tensor &act = ins[0], &c = ins[1], &cp = ins[2];
  const int64_t H = c.size(2), rows = c.size(0) * c.size(1);
  Tensor out = empty({c.size(0), c.size(1), 6 * H}, act.dtype());
  dispatch_float(act.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    parallel_for(rows, row_grain(6 * H, kGateGrain), [&](int64_t r0, int64_t r1) {
      lstm_slopes_forward<S>(H, r0, r1, act.data<S>(), c.data<S>(), cp.data<S>(), out.data<S>());
    });
  });
  if (Node* n = record(lstm_gate_slopes_op, out, act_in, c_in, cp_in))
    n->save(LstmSlopesSaved{.act = act_in, .c = c_in, .c_prev = cp_in});
  return out;
}

// lstm_recurrence's forward over reverse: the gradients and their tangents in
// one recursion. Per step, the slopes s_t and their tangents ds_t of the
// step's rows, then with u, v the gradients of h_t, c_t and ut, vt their tangents:
//   u = gh_t + e,  v = gc_t + v_{t+1} f_{t+1} + u k_t,  D_t = [v j_i, v j_f, v j_g, u j_o]
//   ut = tgh_t + et,  vt = tgc_t + vt_{t+1} f_{t+1} + v_{t+1} df_{t+1} + ut k_t + u dk_t,
//   Dt_t = [vt j_i + v dj_i, .., ut j_o + u dj_o]
//   e = D_t W,  et = Dt_t W + D_t Wt      ([D_t; Dt_t] W one GEMM of twice the rows)
// and after step 0: dh0 = e, dc0 = v_0 f_0 and their tangents; dW and its tangent after, as the RNN's.
bool detail::rnn::lstm_backward_tangents(const Node& n, const Tensor& grad, std::span<Tensor> gin,
                                         std::span<Tensor> gin_tangents) {
  if (n.side_grad(&LstmSaved::gates).defined()) return false;  // a second-order pass: the recorded form
  const Tensor w = n.saved_tensor(&LstmSaved::weight), h0 = n.saved_tensor(&LstmSaved::h0);
  const Tensor c0 = n.saved_tensor(&LstmSaved::c0), act = as_float(n.saved_tensor(&LstmSaved::gates));
  const Tensor out = n.saved_tensor(&LstmSaved::output);
  const Dims d{out.size(1), out.size(2), out.size(3)};
  const int64_t T = d.T, B = d.B, H = d.H, G = 4 * H, L = 6 * H, TBH = T * B * H;
  const Tensor g = grad.contiguous(), gt = tangent_or_zeros(grad), a = act.contiguous(), at = tangent_or_zeros(act);
  const Tensor o = out.contiguous(), ot = tangent_or_zeros(out), wc = w.contiguous(), wt = tangent_or_zeros(w);
  const Tensor h0c = contig(h0), h0t = h0.defined() ? tangent_or_zeros(h0) : Tensor();
  const Tensor c0c = c0.defined() ? c0.contiguous() : zeros({d.B, d.H}, out.dtype());
  const Tensor c0t = c0.defined() ? tangent_or_zeros(c0) : zeros({d.B, d.H}, out.dtype());
  Tensor dA = empty(act.shape(), act.dtype()), dAt = empty(act.shape(), act.dtype());
  Tensor dh0 = empty({d.B, d.H}, out.dtype()), dh0t = empty({d.B, d.H}, out.dtype());
  Tensor dc0 = empty({d.B, d.H}, out.dtype()), dc0t = empty({d.B, d.H}, out.dtype());
  Tensor dW, dWt;
  dispatch_float(out.dtype(), "lstm_recurrence", [&](auto tag) {
    using S = decltype(tag);
    // the gradient and [h; c] (2,T,B,H), the gate activations (T,B,4H), and their tangents
    const S *pg = g.data<S>(), *pgt = gt.data<S>(), *pa = a.data<S>(), *pat = at.data<S>(), *po = o.data<S>();
    const S *pot = ot.data<S>(), *w = wc.data<S>(), *wd = wt.data<S>();
    for_batch_rows(d, G, [&](Rows rows) {
      const int64_t n = rows.n;
      std::vector<S> s(n * L), ds(n * L), P(2 * n * G), E(2 * n * H, S(0)), V(n * H), Vt(n * H);
      for (int64_t t = T; t-- > 0;) {
        const int64_t r = t * B + rows.first;
        const S *c = po + TBH + r * H, *ct = pot + TBH + r * H;
        const S *cp = t > 0 ? c - B * H : c0c.data<S>() + rows.first * H;
        const S *cpt = t > 0 ? ct - B * H : c0t.data<S>() + rows.first * H;
        lstm_slopes_forward<S>(H, 0, n, pa + r * G, c, cp, s.data());
        lstm_slopes_tangent<S>(H, 0, n, pat + r * G, ct, cpt, pa + r * G, c, cp, ds.data());
        const bool next = t + 1 < T;
        for (int64_t b = 0; b < n; ++b) {
          const int64_t x = (r + b) * H;
          const S *gh = pg + x, *gc = pg + TBH + x, *tgh = pgt + x, *tgc = pgt + TBH + x;
          const S *fn = next ? pa + (r + B + b) * G + H : nullptr, *dfn = next ? pat + (r + B + b) * G + H : nullptr;
          const S *sb = s.data() + b * L, *dsb = ds.data() + b * L, *e = E.data() + b * H, *et = E.data() + (n + b) * H;
          S *D = P.data() + b * G, *Dt = P.data() + (n + b) * G, *vb = V.data() + b * H, *vtb = Vt.data() + b * H;
#pragma omp simd
          for (int64_t q = 0; q < H; ++q) {
            const S k = sb[H + q], dk = dsb[H + q];
            const S u = gh[q] + e[q], ut = tgh[q] + et[q];
            const S v = gc[q] + (fn ? vb[q] * fn[q] : S(0)) + u * k;
            const S vt = tgc[q] + (fn ? vtb[q] * fn[q] + vb[q] * dfn[q] : S(0)) + ut * k + u * dk;
            for (int64_t j = 0; j < 3; ++j) {
              D[j * H + q] = v * sb[(2 + j) * H + q];
              Dt[j * H + q] = vt * sb[(2 + j) * H + q] + v * dsb[(2 + j) * H + q];
            }
            D[3 * H + q] = u * sb[5 * H + q];
            Dt[3 * H + q] = ut * sb[5 * H + q] + u * dsb[5 * H + q];
            vb[q] = v;
            vtb[q] = vt;
          }
        }
        std::copy_n(P.data(), n * G, dA.data<S>() + r * G);
        std::copy_n(P.data() + n * G, n * G, dAt.data<S>() + r * G);
        gemm(false, false, 2 * n, H, G, S(1), P.data(), G, w, H, S(0), E.data(), H);
        gemm(false, false, n, H, G, S(1), P.data(), G, wd, H, S(1), E.data() + n * H, H);
      }
      // After step 0: E = [dh0; dh0t], V and Vt hold v_0 and vt_0, s and ds step 0's slopes.
      const int64_t at0 = rows.first * H;
      std::copy_n(E.data(), n * H, dh0.data<S>() + at0);
      std::copy_n(E.data() + n * H, n * H, dh0t.data<S>() + at0);
      for (int64_t i = 0; i < n * H; ++i) {
        const S f = s[i / H * L + i % H], df = ds[i / H * L + i % H];
        dc0.data<S>()[at0 + i] = V[i] * f;
        dc0t.data<S>()[at0 + i] = Vt[i] * f + V[i] * df;
      }
    });
    if (n.needs(1)) {  // the h part of out (and of its tangent) holds h_t
      dW = weight_grad<S>(d, G, dA.data<S>(), po, ptr<S>(h0c), out.dtype());
      dWt = weight_grad<S>(d, G, dAt.data<S>(), po, ptr<S>(h0c), out.dtype());
      add_weight_grad<S>(d, G, 0, d.T, dA.data<S>(), pot, ptr<S>(h0t), dWt.data<S>());
    }
  });
  gin[0] = dA, gin[1] = dW, gin[2] = dh0, gin[3] = dc0;
  gin_tangents[0] = dAt, gin_tangents[1] = dWt, gin_tangents[2] = dh0t, gin_tangents[3] = dc0t;
  return true;
}

// lstm_recurrence_grad: one node for the recursion, not a dozen per step. With gout = [gh; gc] and
// s_t = [f_t, k_t, j_t], going t = T-1 .. 0 with e_h = e_c = 0:
//   u_t = gh_t + e_h,  v_t = gc_t + e_c + u_t k_t             (dh_t, dc_t)
//   D_t = [v_t j_i, v_t j_f, v_t j_g, u_t j_o]                (dA_t, (B,4H))
//   e_h = D_t W,  e_c = v_t f_t                               (into step t-1)
// The output is [D_t; v_t] (T,B,5H). Its backward runs the adjoint of that
// recursion forward in time (see lstm_grad_adjoint).
namespace {
// gout, s and w_hh as given, the output, and u_t (T,B,H) computed by forward
struct LstmGradSaved {
  Tensor gout, slopes, weight, output, u;
  static constexpr std::tuple fields{
      saved_field("gout", &LstmGradSaved::gout), saved_field("slopes", &LstmGradSaved::slopes),
      saved_field("weight", &LstmGradSaved::weight), saved_field("output", &LstmGradSaved::output),
      saved_field("u", &LstmGradSaved::u)};
};
}  // namespace

// gh and gc (T,B,H), the halves of gout; s (T,B,6H) row r holds f at r*6H, k at +H and j at +2H.
template <class S>
static void lstm_grad_forward(const Dims& d, Rows rows, const S* ghs, const S* gcs, const S* s, const S* w, S* out,
                              S* us, S* eh) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, G = 4 * H, O = 5 * H, L = 6 * H;
  S* e = eh + rows.first * H;  // D_{t+1} W, zero for t = T-1
  for (int64_t t = T; t-- > 0;) {
    const int64_t r = t * B + rows.first;
    const S *gh = ghs + r * H, *gc = gcs + r * H, *st = s + r * L;
    const S* sn = t + 1 < T ? st + B * L : nullptr;             // f_{t+1} in s_{t+1}
    const S* vn = t + 1 < T ? out + (r + B) * O + G : nullptr;  // v_{t+1}
    S* ot = out + r * O;
    for (int64_t b = 0; b < n; ++b) {
      const int64_t x = (r + b) * H;
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
        us[x + q] = u;
        ob[G + q] = v;
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
  const Tensor gout = n.saved_tensor(&LstmGradSaved::gout), s = n.saved_tensor(&LstmGradSaved::slopes);
  const Tensor w = n.saved_tensor(&LstmGradSaved::weight), out = n.saved_tensor(&LstmGradSaved::output);
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
  const auto ins =
      saved_contig(n, &LstmGradSaved::slopes, &LstmGradSaved::weight, &LstmGradSaved::output, &LstmGradSaved::u);
  const Tensor &s = ins[0], &w = ins[1], &out = ins[2], &us = ins[3];
  const Dims d{out.size(0), out.size(1), out.size(2) / 5};
  const int64_t G = 4 * d.H, O = 5 * d.H;
  const Tensor gy = grad.contiguous(), dgout = empty({2, d.T, d.B, d.H}, out.dtype()), ds = empty(s.shape(), s.dtype());
  const Tensor scratch = empty({d.B, G}, s.dtype()), dW = n.needs(2) ? zeros({G, d.H}, s.dtype()) : Tensor();
  dispatch_float(out.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    for_batch_rows(d, G, [&](Rows rows) {
      lstm_grad_adjoint<S>(d, rows, gy.data<S>(), s.data<S>(), w.data<S>(), out.data<S>(), us.data<S>(),
                           dgout.data<S>(), ds.data<S>(), scratch.data<S>());
    });
    // dW (4H,H) = sum_{t>0} D_t^T U_{t-1}: D_t rows of the output (stride 5H), U the first half of dgout.
    if (dW.defined() && d.T > 1)
      gemm(true, false, G, d.H, (d.T - 1) * d.B, S(1), out.data<S>() + d.B * O, O, dgout.data<S>(), d.H, S(0),
           dW.data<S>(), d.H);
  });
  set_needed(n, gin, {dgout, ds, dW});
}
static const OpDef lstm_recurrence_grad_op({
    .name = "lstm_recurrence_grad",
    .arity = 3,
    .signature = "lstm_recurrence_grad(gout (2,T,B,H), s (T,B,6H) [f, k, j], w_hh (4H,H)) -> (T,B,5H) [dA_t; dc_t]",
    .saves = saves_of<LstmGradSaved>(),
    .backward = lstm_recurrence_grad_backward,
    .recorded_backward = lstm_grad_backward_recorded,
    .samples = [] {
      using samples::uniform;
      const int64_t T = 3, B = 2, H = 3;
      auto fn = [](const std::vector<Tensor>& x) { return lstm_recurrence_grad(x[0], x[1], x[2]); };
      return std::vector<OpSample>{
          {"T=3 B=2 H=3", {uniform({2, T, B, H}, 211), uniform({T, B, 6 * H}, 212), uniform({4 * H, H}, 215)}, fn},
          {"one step, non-contiguous s",
           {uniform({2, 1, B, H}, 216), samples::strided({1, B, 6 * H}, 219), uniform({4 * H, H}, 220)},
           fn},
      };
    },
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
  const auto ins = contig_all(gout_in, s_in, w_in);
  const Tensor &gout = ins[0], &s = ins[1], &w = ins[2];
  Tensor out = empty({T, B, 5 * H}, s.dtype()), us = empty({T, B, H}, s.dtype()), eh = zeros({B, H}, s.dtype());
  dispatch_float(s.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    for_batch_rows({T, B, H}, 4 * H, [&](Rows rows) {
      lstm_grad_forward<S>({T, B, H}, rows, gout.data<S>(), gout.data<S>() + T * B * H, s.data<S>(), w.data<S>(),
                           out.data<S>(), us.data<S>(), eh.data<S>());
    });
  });
  if (Node* n = record(lstm_recurrence_grad_op, out, gout_in, s_in, w_in))
    n->save(LstmGradSaved{.gout = gout_in, .slopes = s_in, .weight = w_in, .output = out, .u = us});
  return out;
}

}  // namespace tg
