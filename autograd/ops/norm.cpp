// layer_norm: one node on the tape whose backward reuses the mean and rstd
// forward saved, side outputs of the node. Kernels work on contiguous rows,
// split over threads by rows.
#include "autograd/ops/norm.h"

#include <cmath>

#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/ops/view.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
using detail::check_floating, detail::dense, detail::row_grain, detail::row_sum, detail::tangent_or_zeros;

// y = (x - mean) * rstd * w + b over the last axis (C), rstd = 1/sqrt(var + eps)
// with the biased variance. Backward (llm.c / PyTorch), per row with
// n = (x - mean) * rstd and dn = g * w:
//   dx = rstd * (dn - mean(dn) - n * mean(dn * n)),  dw = sum_rows g * n,  db = sum_rows g.
// Gradients gm, gr (R) that reached the side outputs mean and rstd add
//   dx += gm / C - gr * rstd^2 * n / C    (d mean/dx = 1/C, d rstd/dx = -rstd^3 (x - mean) / C).
// dw and db are summed per block of kLayerNormBlock rows, then over blocks in
// order, so the result does not depend on the thread count.
constexpr int64_t kLayerNormBlock = 32;

namespace {
struct LayerNormAttrs {
  double eps;
};
// bias is read only by layer_norm_recompute; weight and bias may be undefined.
struct LayerNormSaved {
  Tensor x, weight;       // (..., C), (C): made contiguous
  SideOutput mean, rstd;  // (R), R = x.numel() / C
  Tensor bias;            // (C)
  static constexpr std::tuple fields{
      saved_field("x", &LayerNormSaved::x), saved_field("weight", &LayerNormSaved::weight),
      saved_field("mean", &LayerNormSaved::mean), saved_field("rstd", &LayerNormSaved::rstd),
      saved_field("bias", &LayerNormSaved::bias)};
};
}  // namespace

// Recorded (create_graph): the same formulas in ops, on the saved mean and
// rstd, which come attached to this node as its side outputs.
static void layer_norm_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(&LayerNormSaved::x), w = n.saved_tensor(&LayerNormSaved::weight);
  const double inv_c = 1.0 / static_cast<double>(x.shape().back());
  Shape rows = x.shape();  // (..., 1)
  rows[rows.size() - 1] = 1;
  const Tensor mean = reshape(n.saved_tensor(&LayerNormSaved::mean), rows);
  const Tensor rstd = reshape(n.saved_tensor(&LayerNormSaved::rstd), rows);
  auto row_mean = [inv_c](const Tensor& t) { return mul(sum(t, {-1}, true), inv_c); };  // (..., 1)
  const Tensor xhat = mul(sub(x, mean), rstd);
  if (n.needs(0)) {
    const Tensor dn = w.defined() ? mul(g, w) : g;
    Tensor dx = mul(rstd, sub(sub(dn, row_mean(dn)), mul(xhat, row_mean(mul(dn, xhat)))));
    if (const Tensor& gm = n.side_grad(&LayerNormSaved::mean); gm.defined())
      dx = add(dx, mul(reshape(gm, rows), inv_c));
    if (const Tensor& gr = n.side_grad(&LayerNormSaved::rstd); gr.defined())
      dx = sub(dx, mul(mul(reshape(gr, rows), mul(rstd, rstd)), mul(xhat, inv_c)));
    gin[0] = dx;
  }
  if (n.needs(1)) gin[1] = sum_to(mul(g, xhat), n.edges[1].shape);
  if (n.needs(2)) gin[2] = sum_to(g, n.edges[2].shape);
}

// The backward's kernel (per row a pass for the sums, one for the outputs); with
// kTangents forward over reverse's, the gradients' tangents in the same passes
// from the tangents tx, tw, tg of x, w, g (zeros where missing):
//   nt = rstd (tx - mean(tx) - n mean(n tx)),  rstd_t = -rstd^2 mean(n tx),
//   dnt = tg w + g tw,  A = mean(dn), Bn = mean(dn n), and their tangents
//   At = mean(dnt), Bnt = mean(dnt n + dn nt);
//   dx = rstd (dn - A - n Bn)  has tangent  rstd_t (dn - A - n Bn) + rstd (dnt - At - nt Bn - n Bnt),
//   dw = sum_rows g n  has  sum_rows (tg n + g nt),  db = sum_rows g  has  sum_rows tg,
// where mean(dn nt) = rstd (mean(dn tx) - mean(tx) A - mean(n tx) Bn). False
// (the recorded form serves) after a gradient reached mean or rstd, or for
// tangents without a weight or elements.
template <bool kTangents>
static bool layer_norm_grads(const Node& n, const Tensor& g, std::span<Tensor> gin, std::span<Tensor> gin_t) {
  const Tensor x = n.saved_tensor(&LayerNormSaved::x), w = n.saved_tensor(&LayerNormSaved::weight);
  if (n.side_grad(&LayerNormSaved::mean).defined() || n.side_grad(&LayerNormSaved::rstd).defined() ||
      (kTangents && (!w.defined() || x.numel() == 0)))
    return false;
  const Tensor mean = n.saved_tensor(&LayerNormSaved::mean), rstd = n.saved_tensor(&LayerNormSaved::rstd);
  const int64_t C = x.shape().back(), R = x.numel() / std::max<int64_t>(C, 1);
  const int64_t blocks = (R + kLayerNormBlock - 1) / kLayerNormBlock;
  const Tensor gc = dense(g), wc = w.defined() ? w : ones({C}, x.dtype());
  Tensor gx = empty_like(x), pw = zeros({kTangents ? 4 : 2, blocks, C}, x.dtype());  // per block: dw, db, tangents
  Tensor tx = x, tw = wc, tg = gc, tgx = gx;  // read with kTangents only
  if constexpr (kTangents) {
    tx = tangent_or_zeros(x);
    tw = tangent_or_zeros(w);
    tg = tangent_or_zeros(g);
    tgx = empty_like(x);
  }
  dispatch_float(x.dtype(), n.op->name, [&](auto tag) {
    using T = decltype(tag);
    const T *xp = x.data<T>(), *gp = gc.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>(), *wp = wc.data<T>();
    const T *txp = tx.data<T>(), *twp = tw.data<T>(), *tgp = tg.data<T>();
    T *gxp = gx.data<T>(), *tgxp = tgx.data<T>(), *pp = pw.data<T>();
    const T inv_c = T(1) / static_cast<T>(C);
    parallel_for(blocks, std::max<int64_t>(1, row_grain(C) / kLayerNormBlock), [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        T *dw = pp + b * C, *db = dw + blocks * C, *tdw = kTangents ? db + blocks * C : db, *tdb = tdw + (tdw - db);
        for (int64_t r = b * kLayerNormBlock; r < std::min(R, (b + 1) * kLayerNormBlock); ++r) {
          const T *xr = xp + r * C, *gr = gp + r * C, *txr = txp + r * C, *tgr = tgp + r * C;
          const T *wr = wp, *twr = twp;  // locals: GCC reloads captured ones per element (a gather)
          const T mu = mp[r], rs = rp[r];
          T s_dn = 0, s_dnn = 0, s_tx = 0, s_ntx = 0, s_dnt = 0, s_dntn = 0, s_dntx = 0;
#pragma omp simd reduction(+ : s_dn, s_dnn, s_tx, s_ntx, s_dnt, s_dntn, s_dntx)
          for (int64_t c = 0; c < C; ++c) {
            const T nc = (xr[c] - mu) * rs, dn = gr[c] * wr[c];
            s_dn += dn;
            s_dnn += dn * nc;
            if constexpr (kTangents) {
              const T dnt = tgr[c] * wr[c] + gr[c] * twr[c];
              s_tx += txr[c];
              s_ntx += nc * txr[c];
              s_dnt += dnt;
              s_dntn += dnt * nc;
              s_dntx += dn * txr[c];
            }
          }
          const T m_tx = s_tx * inv_c, m_ntx = s_ntx * inv_c, A = s_dn * inv_c, Bn = s_dnn * inv_c;
          const T At = s_dnt * inv_c, Bnt = s_dntn * inv_c + rs * (s_dntx * inv_c - m_tx * A - m_ntx * Bn);
          const T rst = -rs * rs * m_ntx;
          T *o = gxp + r * C, *ot = tgxp + r * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const T nc = (xr[c] - mu) * rs, inner = gr[c] * wr[c] - A - nc * Bn;
            o[c] = rs * inner;
            dw[c] += gr[c] * nc;
            db[c] += gr[c];
            if constexpr (kTangents) {
              const T dnt = tgr[c] * wr[c] + gr[c] * twr[c], nt = rs * (txr[c] - m_tx - nc * m_ntx);
              ot[c] = rst * inner + rs * (dnt - At - nt * Bn - nc * Bnt);
              tdw[c] += tgr[c] * nc + gr[c] * nt;
              tdb[c] += tgr[c];
            }
          }
        }
      }
    });
  });
  NoGradGuard plain;  // the sums over blocks: plain kernels, their tangents given to the engine
  // (C) each, in storage of its own: the engine takes a leaf's gradient over only when nothing else holds it.
  auto total = [&](int64_t k) { return sum(select(pw, 0, k), {0}); };
  if (kTangents || n.needs(0)) gin[0] = gx;
  if (kTangents || n.needs(1)) gin[1] = total(0);
  if (kTangents || n.needs(2)) gin[2] = total(1);
  if constexpr (kTangents) {
    gin_t[0] = tgx;
    gin_t[1] = total(2);
    gin_t[2] = total(3);
  }
  return true;
}

static void layer_norm_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (!layer_norm_grads<false>(n, g, gin, {})) layer_norm_backward_recorded(n, g, gin);
}

// The same forward on the saved input: the output bit for bit.
static Tensor layer_norm_recompute(const Node& n) {
  return layer_norm(n.saved_tensor(&LayerNormSaved::x), n.saved_tensor(&LayerNormSaved::weight),
                    n.saved_tensor(&LayerNormSaved::bias), n.attrs<LayerNormAttrs>().eps);
}
// Forward mode, per row with xhat = (x - mean) * rstd:
//   d mean = mean(tx),  d rstd = -rstd^2 mean(xhat tx),
//   d xhat = rstd (tx - mean(tx) - xhat mean(xhat tx))  (backward's dx formula: the Jacobian is symmetric),
//   d y = d xhat * w + xhat * tw + tb; mean and rstd get their tangents as side outputs.
// One pass per row, no (..., C) temporary; recorded, the engine derives it.
static void layer_norm_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  if (n.out_shape.numel() == 0) return;  // an empty tangent: zero
  const Tensor x = n.saved_tensor(&LayerNormSaved::x), w = n.saved_tensor(&LayerNormSaved::weight);
  const Tensor mean = n.saved_tensor(&LayerNormSaved::mean), rstd = n.saved_tensor(&LayerNormSaved::rstd);
  const int64_t C = x.shape().back(), R = x.numel() / C;
  // A missing weight is ones, a missing tangent zeros: one loop for every case.
  auto dense_or = [&](const Tensor& v, Shape s, double k) { return v.defined() ? dense(v) : full(s, k, x.dtype()); };
  const Tensor wc = dense_or(w, {C}, 1), tx = dense_or(t[0], x.shape(), 0);
  const Tensor tw = dense_or(t[1], {C}, 0), tb = dense_or(t[2], {C}, 0);
  Tensor y = empty_like(x);
  Tensor d_mean = empty({R}, x.dtype()), d_rstd = empty({R}, x.dtype());
  dispatch_float(x.dtype(), n.op->name, [&](auto tag) {
    using T = decltype(tag);
    const T *xp = x.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>(), *wp = wc.data<T>();
    const T *txp = tx.data<T>(), *twp = tw.data<T>(), *tbp = tb.data<T>();
    T *yp = y.data<T>(), *dmp = d_mean.data<T>(), *drp = d_rstd.data<T>();
    parallel_for(R, row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T *xr = xp + r * C, *tr = txp + r * C;
        const T mu = mp[r], rs = rp[r];
        T a = 0, b = 0;  // mean(tx), mean(xhat tx)
#pragma omp simd reduction(+ : a, b)
        for (int64_t c = 0; c < C; ++c) {
          a += tr[c];
          b += (xr[c] - mu) * rs * tr[c];
        }
        a /= static_cast<T>(C), b /= static_cast<T>(C);
        dmp[r] = a;
        drp[r] = -rs * rs * b;
        T* o = yp + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const T xh = (xr[c] - mu) * rs;
          o[c] = rs * (tr[c] - a - xh * b) * wp[c] + xh * twp[c] + tbp[c];
        }
      }
    });
  });
  out[0] = y;
  out[side_output(&LayerNormSaved::mean)] = d_mean;
  out[side_output(&LayerNormSaved::rstd)] = d_rstd;
}

static const OpDef layer_norm_op({
    .name = "layer_norm",
    .arity = 3,
    .signature = "layer_norm(x (...,C), weight (C) or none, bias (C) or none, eps) over the last axis",
    .saves = saves_of<LayerNormSaved>(),
    .backward = layer_norm_backward,
    .recorded_backward = layer_norm_backward_recorded,
    .backward_with_tangents = layer_norm_grads<true>,
    .tangent = layer_norm_tangent,
    .tangent_once_differentiable = true,
    .samples = [] {
      using samples::uniform;
      auto ln = [](auto& x) {
        return layer_norm(x[0], x.size() > 1 ? x[1] : Tensor(), x.size() > 2 ? x[2] : Tensor());
      };
      auto in = [](Shape s, uint64_t seed, int params) {  // x, then as many of weight and bias
        std::vector<Tensor> v{uniform(s, seed, -2, 2)};
        if (params > 0) v.push_back(uniform({s.back()}, seed + 1, 0.5, 1.5));
        if (params > 1) v.push_back(uniform({s.back()}, seed + 2));
        return v;
      };
      return std::vector<OpSample>{
          {"(3,5) affine", in({3, 5}, 321, 2), ln},
          {"(2,3,4) affine", in({2, 3, 4}, 324, 2), ln},
          {"(4,6) no affine", in({4, 6}, 327, 0), ln},
          {"(3,4) weight only", in({3, 4}, 328, 1), ln},
          {"non-contiguous (3,4) affine", {samples::strided({3, 4}, 330, -2, 2), uniform({4}, 331), uniform({4}, 332)},
           ln},
          {"(70,3) affine, more rows than a block", in({70, 3}, 333, 2), ln},
          {"(3,5) affine, squared: mul saves the output by reference", in({3, 5}, 336, 2), [ln](auto& x) {
             Tensor y = ln(x);
             return mul(y, y);
           }},
      };
    },
    .recompute = layer_norm_recompute,
});

Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps) {
  const std::string_view op = layer_norm_op.name;
  ProfileScope prof(op);
  check_floating(op, x, "input");
  if (x.dim() == 0) throw ShapeError(fmt::format("{}: input () has no feature axis to normalise", op));
  if (!(eps > 0)) throw ValueError(fmt::format("{}: eps must be positive, got {}", op, eps));
  const int64_t C = x.shape().back(), R = x.numel() / std::max<int64_t>(C, 1);
  for (const Tensor* p : {&weight, &bias}) {
    if (!p->defined()) continue;
    const char* what = p == &weight ? "weight" : "bias";
    if (!(p->shape() == Shape{C}))
      throw ShapeError(fmt::format("{}: {} {} does not match input {} ({} features)", op, what, p->shape(),
                                   x.shape(), C));
    if (p->dtype() != x.dtype())
      throw DTypeError(fmt::format("{}: {} is {}, input {} is {}", op, what, dtype_name(p->dtype()), x.shape(),
                                   dtype_name(x.dtype())));
  }
  // x and weight are saved: a strided one's copy is recorded (a clone node), so
  // that a recorded backward differentiates through it back to the original.
  Tensor xc = x.contiguous(), wc = weight.defined() ? weight.contiguous() : Tensor();
  Tensor bc = bias.defined() ? dense(bias) : Tensor();
  const Tensor wk = wc.defined() ? wc : ones({C}, x.dtype()), bk = bc.defined() ? bc : zeros({C}, x.dtype());
  Tensor out = empty_like(x);
  Tensor mean = empty({R}, x.dtype()), rstd = empty({R}, x.dtype());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T *xp = xc.data<T>(), *wp = wk.data<T>(), *bp = bk.data<T>();
    T *yp = out.data<T>(), *mp = mean.data<T>(), *rp = rstd.data<T>();
    parallel_for(R, row_grain(C), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* xr = xp + r * C;
        T* yr = yp + r * C;
        const T mu = row_sum(xr, C) / static_cast<T>(C);
        T ss = 0;  // two passes: no cancellation for rows with a large mean
#pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
        const T rs = T(1) / std::sqrt(ss / static_cast<T>(C) + static_cast<T>(eps));
        mp[r] = mu;
        rp[r] = rs;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = (xr[c] - mu) * rs * wp[c] + bp[c];
      }
    });
  });
  if (Node* n = record(layer_norm_op, out, x, weight, bias)) {
    n->attrs<LayerNormAttrs>() = {.eps = eps};
    n->save(LayerNormSaved{.x = xc, .weight = wc, .mean = mean, .rstd = rstd, .bias = bc});
  }
  return out;
}

}  // namespace tg
