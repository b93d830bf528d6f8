// gated_recurrence_grad (see ../rnn_ops.h): the tanh RNN's and the GRU's backward recursion as an op.
#include "autograd/ops/rnn_ops.h"

#include "autograd/ops/elementwise.h"
#include "autograd/ops/loop.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/rnn/common.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::row_grain;
using namespace detail::rnn;

// The backward of u_t = g_t + a_{t+1} u_{t+1} + P_{t+1} W, P_t = u_t j_t (B,G), runs t = 0 .. T-1:
// with U_t the total gradient of u_t and R_t = U_{t-1} W^T (zero at t = 0),
//   U_t = du_t + a_t U_{t-1} + sum_q R_t,q j_t,q
// gives d g_t = U_t, d a_t = U_{t-1} u_t, d j_t,q = R_t,q u_t, dW = sum_{t>0} P_t^T U_{t-1}.
namespace {
// a (T,B,H) may be undefined; j (T,B,QH), w_hh (QH,H), output u (T,B,H), p = u j (T,B,QH) from forward
struct GatedGradSaved {
  Tensor carry, slopes, weight, output, p;
  static constexpr std::tuple fields{
      saved_field("carry", &GatedGradSaved::carry), saved_field("slopes", &GatedGradSaved::slopes),
      saved_field("weight", &GatedGradSaved::weight), saved_field("output", &GatedGradSaved::output),
      saved_field("p", &GatedGradSaved::p)};
};
}  // namespace

// ps holds P for every step (T,B,G) when keep_p, else one step's (B,G).
template <class S>
static void gated_grad_forward(const Dims& d, int64_t G, Rows rows, const S* g, const S* a, const S* j, const S* w,
                               S* us, S* ps, bool keep_p, S* eh) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, Q = G / H;
  S* e = eh + rows.first * H;  // P_{t+1} W
  for (int64_t t = T; t-- > 0;) {
    const int64_t r = t * B + rows.first;
    const S *gt = g + r * H, *jt = j + r * G;
    const S* an = t + 1 < T && a ? a + (r + B) * H : nullptr;  // a_{t+1}
    S *u = us + r * H, *P = ps + ((keep_p ? t * B : 0) + rows.first) * G;
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

// rt (B,G) is scratch. da, dj and a may be nullptr (us is read only for da, dj):
// U alone is gated_recurrence_transpose.
template <class S>
static void gated_grad_adjoint(const Dims& d, int64_t G, Rows rows, const S* gy, const S* a, const S* j, const S* w,
                               const S* us, S* dg, S* da, S* dj, S* rt) {
  const int64_t T = d.T, B = d.B, H = d.H, n = rows.n, Q = G / H;
  S* R = rt + rows.first * G;
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = t * B + rows.first;
    const S *jt = j + r * G, *u = us ? us + r * H : nullptr, *at = a ? a + r * H : nullptr;
    S *U = dg + r * H, *dat = a && da ? da + r * H : nullptr, *djt = dj ? dj + r * G : nullptr;
    std::copy_n(gy + r * H, n * H, U);
    if (t == 0) {
      if (dat) std::fill_n(dat, n * H, S(0));
      if (djt) std::fill_n(djt, n * G, S(0));
      continue;
    }
    const S* Up = U - B * H;  // U_{t-1}
    gemm(false, true, n, G, H, S(1), Up, H, w, H, S(0), R, G);
    for (int64_t b = 0; b < n; ++b) {
      const int64_t x = b * H;
      for (int64_t q = 0; q < Q; ++q) {
        const S *Rb = R + b * G + q * H, *jb = jt + b * G + q * H;
#pragma omp simd
        for (int64_t i = 0; i < H; ++i) U[x + i] += Rb[i] * jb[i];
        if (!djt) continue;
        S* djb = djt + b * G + q * H;
#pragma omp simd
        for (int64_t i = 0; i < H; ++i) djb[i] = Rb[i] * u[x + i];
      }
      if (!at) continue;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) U[x + i] += at[x + i] * Up[x + i];
      if (!dat) continue;
#pragma omp simd
      for (int64_t i = 0; i < H; ++i) dat[x + i] = Up[x + i] * u[x + i];
    }
  }
}

Tensor detail::rnn::gated_recurrence_transpose(const Tensor& du, const Tensor& a, const Tensor& j, const Tensor& w) {
  const Dims d{du.size(0), du.size(1), du.size(2)};
  const int64_t G = j.size(2);
  const Tensor g = du.contiguous(), ac = contig(a), jc = j.contiguous(), wc = w.contiguous();
  Tensor U = empty(du.shape(), du.dtype()), scratch = empty({d.B, G}, du.dtype());
  dispatch_float(du.dtype(), "gated_recurrence_grad", [&](auto tag) {
    using S = decltype(tag);
    for_batch_rows(d, G, [&](Rows rows) {
      gated_grad_adjoint<S>(d, G, rows, g.data<S>(), ptr<S>(ac), jc.data<S>(), wc.data<S>(), nullptr, U.data<S>(),
                            nullptr, nullptr, scratch.data<S>());
    });
  });
  return U;
}

// Recorded (third and higher derivatives): the adjoint above in tensor ops,
// step by step; P recomputed from the output.
static void gated_grad_backward_recorded(const Node& n, const Tensor& grad, std::span<Tensor> gin) {
  const Tensor a = n.saved_tensor(&GatedGradSaved::carry), j = n.saved_tensor(&GatedGradSaved::slopes);
  const Tensor w = n.saved_tensor(&GatedGradSaved::weight), u = n.saved_tensor(&GatedGradSaved::output);
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
    dg[t] = add(select(grad, 0, t), sum(reshape(mul(R, jt), {R.size(0), -1, H}), {1}));  // sum_q R_q j_q
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
  const auto ins = saved_contig(n, &GatedGradSaved::carry, &GatedGradSaved::slopes, &GatedGradSaved::weight,
                                &GatedGradSaved::output, &GatedGradSaved::p);
  const Tensor &a = ins[0], &j = ins[1], &w = ins[2], &u = ins[3], &P = ins[4];
  const Dims d{u.size(0), u.size(1), u.size(2)};
  const int64_t G = j.size(2);
  const Tensor gy = grad.contiguous(), dg = empty(u.shape(), u.dtype()), dj = empty(j.shape(), u.dtype());
  const Tensor da = a.defined() ? empty(u.shape(), u.dtype()) : Tensor(), scratch = empty({d.B, G}, u.dtype());
  Tensor dW = n.needs(3) ? zeros({G, d.H}, u.dtype()) : Tensor();
  dispatch_float(u.dtype(), n.op->name, [&](auto tag) {
    using S = decltype(tag);
    for_batch_rows(d, G, [&](Rows rows) {
      gated_grad_adjoint<S>(d, G, rows, gy.data<S>(), ptr<S>(a), j.data<S>(), w.data<S>(), u.data<S>(), dg.data<S>(),
                            ptr<S>(da), dj.data<S>(), scratch.data<S>());
    });
    if (dW.defined() && d.T > 1)  // dW (G,H) = sum_{t>0} P_t^T U_{t-1}
      gemm(true, false, G, d.H, (d.T - 1) * d.B, S(1), P.data<S>() + d.B * G, G, dg.data<S>(), d.H, S(0),
           dW.data<S>(), d.H);
  });
  set_needed(n, gin, {dg, da, dj, dW});
}
static const OpDef gated_recurrence_grad_op({
    .name = "gated_recurrence_grad",
    .arity = 4,
    .signature = "gated_recurrence_grad(g (T,B,H), a (T,B,H) or undefined, j (T,B,QH), w_hh (QH,H)) -> u (T,B,H)",
    .saves = saves_of<GatedGradSaved>(),
    .backward = gated_recurrence_grad_backward,
    .recorded_backward = gated_grad_backward_recorded,
    .samples = [] {
      using samples::uniform;
      const int64_t T = 3, B = 2, H = 3;
      auto fn = [](const std::vector<Tensor>& x) {  // x = [g, a (none: no carry), j, w_hh]
        return x.size() == 4 ? gated_recurrence_grad(x[0], x[1], x[2], x[3])
                             : gated_recurrence_grad(x[0], Tensor(), x[1], x[2]);
      };
      return std::vector<OpSample>{
          {"GRU-shaped, Q=3",
           {uniform({T, B, H}, 221), uniform({T, B, H}, 222, 0, 1), uniform({T, B, 3 * H}, 223),
            uniform({3 * H, H}, 224)},
           fn},
          {"RNN-shaped, no carry, Q=1",
           {uniform({T, B, H}, 225), uniform({T, B, H}, 226, 0, 1), uniform({H, H}, 227)}, fn},
          {"one step, non-contiguous j",
           {uniform({1, B, H}, 228), uniform({1, B, H}, 229, 0, 1), samples::strided({1, B, 2 * H}, 230),
            uniform({2 * H, H}, 231)},
           fn},
      };
    },
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
  const auto ins = contig_all(g_in, a_in, j_in, w_in);
  const Tensor &g = ins[0], &a = ins[1], &j = ins[2], &w = ins[3];
  // P (T,B,G) is saved for the backward only when a node may be recorded; else one step's is scratch.
  const bool keep_p = may_record(g_in, a_in, j_in, w_in);
  Tensor u = empty({T, B, H}, g.dtype()), eh = zeros({B, H}, g.dtype());
  const Tensor P = keep_p ? empty({T, B, G}, g.dtype()) : empty({B, G}, g.dtype());
  dispatch_float(g.dtype(), op, [&](auto tag) {
    using S = decltype(tag);
    for_batch_rows({T, B, H}, G, [&](Rows rows) {
      gated_grad_forward<S>({T, B, H}, G, rows, g.data<S>(), ptr<S>(a), j.data<S>(), w.data<S>(), u.data<S>(),
                            P.data<S>(), keep_p, eh.data<S>());
    });
  });
  if (Node* n = record(gated_recurrence_grad_op, u, g_in, a_in, j_in, w_in))
    n->save(GatedGradSaved{.carry = a_in, .slopes = j_in, .weight = w_in, .output = u, .p = P});
  return u;
}

}  // namespace tg
