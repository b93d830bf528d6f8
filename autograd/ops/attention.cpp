// Scaled dot-product attention as one tape node. Per (batch, head):
//   forward:  S = q k^T / sqrt(D) (GEMM), P = masked softmax of S over keys,
//             out = P v (GEMM);
//   backward: P again from q and k (one more GEMM), then dv = P^T g,
//             dP = g v^T, dS = P * (dP - rowsum(dP * P)),
//             dq = dS k / sqrt(D), dk = dS^T q / sqrt(D) (four GEMMs).
// Backward recomputes P rather than saving it: the (B,H,Tq,Tk) probabilities
// are the largest activation of a transformer layer (4 MiB a layer for GPT-M,
// twice its output), and the extra GEMM costs ~1/6 of the attention's work.
// The node saves only q, k, v and the padding mask. Both passes go over a
// head's queries in blocks of rows (AttentionDims::rows_per_block), so a
// thread's scratch for P and dS is a (rows, Tk) block, not (Tq, Tk): 64 MiB
// each at T = 4096; and under the causal mask a block's GEMMs stop at the
// last key its last query sees.
// Under autocast every GEMM here reads bfloat16 operands: q, k, v and g are
// rounded once, whole, rather than by each per-head GEMM that reads them, and
// the node keeps q, k, v as those bfloat16 copies (AutocastInput), half the
// memory of the float32 projection they are views of; P and dS are rounded
// once per block. The values are those autocast's GEMMs would round to.
// Masked keys get probability exactly 0; a query that sees no key at all (a
// fully padded row, or Tq > Tk under the causal mask) gets a zero row, so its
// output and gradients are zero rather than NaN.
#include "autograd/ops/attention.h"

#include <cmath>
#include <vector>

#include "autograd/autocast.h"
#include "autograd/blas.h"
#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/nn_kernels.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/ops/softmax.h"
#include "autograd/ops/view.h"
#include "autograd/parallel.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

using detail::bf16_operand, detail::check_floating, detail::dense, detail::tangent_or_zeros;

struct AttentionAttrs {
  bool causal;
};
struct AttentionSaved {
  AutocastInput q, k, v;      // (B,H,Tq,D), (B,H,Tk,D), (B,H,Tk,Dv); bfloat16 copies under autocast
  Tensor key_padding_mask;  // (B,Tk) bool, or undefined
  static constexpr std::tuple fields{
      saved_field("q", &AttentionSaved::q), saved_field("k", &AttentionSaved::k), saved_field("v", &AttentionSaved::v),
      saved_field("key_padding_mask", &AttentionSaved::key_padding_mask)};
};

// A (B,H,T,D) tensor as B*H row-major (T,D) matrices for GEMM: row t of head
// bh = b*H + h sits at base + b*sb + h*sh + t*ld. Views with a unit last
// stride (q from a transposed (B,T,H,D) projection, k broadcast over heads)
// are used in place; anything else is copied once.
template <class T>
struct HeadMatrices {
  Tensor data;  // keeps the memory alive
  const T* base = nullptr;
  int64_t H = 1, sb = 0, sh = 0, ld = 0;
  const T* at(int64_t bh, int64_t t = 0) const { return base + bh / H * sb + bh % H * sh + t * ld; }
};
template <class T>
HeadMatrices<T> head_matrices(const Tensor& x) {
  const Shape& s = x.shape();
  const Shape& st = x.strides();
  const bool usable = (s[3] == 1 || st[3] == 1) && (s[2] == 1 || st[2] >= s[3]);
  HeadMatrices<T> m;
  m.data = usable ? x : dense(x);
  m.base = m.data.template data<T>();
  m.H = s[1];
  m.sb = m.data.strides()[0];
  m.sh = m.data.strides()[1];
  m.ld = s[2] == 1 ? s[3] : m.data.strides()[2];
  return m;
}

struct AttentionDims {
  int64_t B, H, Tq, Tk, D, Dv;
  bool causal;
  AttentionDims(const Shape& q, const Shape& k, const Shape& v, bool causal)
      : B(q[0]), H(q[1]), Tq(q[2]), Tk(k[2]), D(q[3]), Dv(v[3]), causal(causal) {}
  // Keys query t may see: [0, visible(t)); causal aligns the last query with the last key.
  int64_t visible(int64_t t) const { return causal ? std::clamp<int64_t>(t + Tk - Tq + 1, 0, Tk) : Tk; }
  // Heads per parallel chunk: tiny heads are batched so threads are worth waking.
  int64_t grain() const { return std::max<int64_t>(1, 65536 / std::max<int64_t>(1, Tq * Tk * (D + Dv))); }
  // Query rows per block: a (rows, Tk) block of scores holds at most 2^18
  // values (1 MiB in float32), and never fewer than 64 rows, so the GEMMs
  // stay efficient; a head of up to 256 keys is one block.
  int64_t rows_per_block() const {
    return std::min(Tq, std::max<int64_t>(64, (int64_t{1} << 18) / std::max<int64_t>(1, Tk)));
  }
  template <class T> T scale() const { return static_cast<T>(1.0 / std::sqrt(static_cast<double>(D))); }
};

// Runs block(bh, i0, i1, kv, scratch, rounded) over the blocks of `rows`
// query rows [i0, i1) of every head bh, kv = visible(i1 - 1) the keys they
// see; scratch is the thread's nbuf buffers of rows * Tk values, one after
// another, and rounded, where the GEMMs read In = bfloat16 operands, one
// more of that size to round a block into (unused where In is T). Heads
// go to the pool's threads, each head's GEMMs whole on the thread that has it
// (splitting them too would only add waits). With fewer heads than threads,
// the heads run one after another and gemm() splits each GEMM that is worth it.
template <class T, class In = T, class F>
void for_each_block(const AttentionDims& a, int64_t rows, int nbuf, F&& block) {
  auto heads = [&](int64_t h0, int64_t h1) {
    std::vector<T> scratch(nbuf * rows * a.Tk);
    std::vector<In> rounded(std::is_same_v<In, T> ? 0 : rows * a.Tk);
    for (int64_t bh = h0; bh < h1; ++bh)
      for (int64_t i0 = 0; i0 < a.Tq; i0 += rows) {
        const int64_t i1 = std::min(a.Tq, i0 + rows);
        block(bh, i0, i1, a.visible(i1 - 1), scratch.data(), rounded.data());
      }
  };
  const int64_t n = a.B * a.H;
  if (num_threads() > 1 && n < num_threads()) return heads(0, n);
  parallel_for(n, a.grain(), [&](int64_t i0, int64_t i1) {
    SerialGemm whole;  // each head's GEMMs on the thread that has the head
    heads(i0, i1);
  });
}

// Softmax in place over the first `visible` entries of a score row, skipping
// padded keys (pad[j] != 0); everything else becomes 0. A row with no
// visible key becomes all zeros; a row with a NaN score becomes all NaN, as
// softmax(S) v gives it.
template <class T>
void masked_softmax_row(T* s, int64_t Tk, int64_t visible, const uint8_t* pad) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  if (pad) {  // padded keys to -inf: exp gives them exactly 0
#pragma omp simd
    for (int64_t j = 0; j < visible; ++j) s[j] = pad[j] ? kNegInf : s[j];
  }
  const T m = detail::row_max(s, visible);
  if (m == kNegInf) {
    // row_max's vector max drops a NaN that meets -inf, so a row that is
    // all -inf and NaN reads as one with nothing visible. A NaN beside a
    // finite score needs no check: exp(NaN - m) makes the sum NaN below.
    const bool nan = std::any_of(s, s + visible, [](T x) { return std::isnan(x); });
    std::fill(s, s + Tk, nan ? std::numeric_limits<T>::quiet_NaN() : T(0));
    return;
  }
  const T inv = T(1) / detail::exp_shifted(s, m, s, visible);
#pragma omp simd
  for (int64_t j = 0; j < visible; ++j) s[j] *= inv;
  std::fill(s + visible, s + Tk, T(0));
}

// Rows [i0, i1) of P (Tq,Tk) of head bh into S (row stride ld >= kv): scaled
// scores of keys [0, kv) by GEMM, then the masked softmax of each row, zeros
// in [kv, ld). kv must cover every key the rows see (visible(i1 - 1)).
// Forward and backward share it, so both see the same P.
template <class T, class In>
void head_probabilities(const AttentionDims& a, const HeadMatrices<In>& Q, const HeadMatrices<In>& K, int64_t bh,
                        const std::vector<uint8_t>& pad, int64_t i0, int64_t i1, int64_t kv, T* S, int64_t ld) {
  if (kv > 0) gemm(false, true, i1 - i0, kv, a.D, a.scale<T>(), Q.at(bh, i0), Q.ld, K.at(bh), K.ld, T(0), S, ld);
  const uint8_t* pb = pad.empty() ? nullptr : pad.data() + bh / a.H * a.Tk;
  for (int64_t i = i0; i < i1; ++i) masked_softmax_row(S + (i - i0) * ld, ld, std::min(a.visible(i), kv), pb);
}

// The softmax's Jacobian (symmetric, so backward and tangent alike) applied
// to m rows of x (m, kv) in place, P (m, kv) the probabilities.
template <class T>
void softmax_jacobian_rows(const T* P, T* x, int64_t m, int64_t kv) {
  for (int64_t i = 0; i < m; ++i) detail::softmax_jacobian_row(P + i * kv, x + i * kv, x + i * kv, kv);
}

// n values of a block (P, dS) as a GEMM operand of type In: x itself, or
// rounded to bfloat16 into buf.
template <class In, class T>
const In* block_operand(const T* x, int64_t n, In* buf) {
  if constexpr (std::is_same_v<In, T>) {
    return x;
  } else {
    float_to_bf16(x, buf, n);
    return buf;
  }
}

// Whether this thread's attention GEMMs on T operands run in bfloat16.
template <class T>
bool in_bf16() {
  return std::is_same_v<T, float> && autocast_enabled();
}

// The key padding mask (B,Tk) as one byte per key, 1 = padded; empty when undefined.
std::vector<uint8_t> padding_bytes(const Tensor& key_padding_mask) {
  std::vector<uint8_t> pad;
  if (!key_padding_mask.defined()) return pad;
  Tensor m = dense(key_padding_mask);
  pad.resize(m.numel());
  TG_DISPATCH_ALL(m.dtype(), "scaled_dot_product_attention", [&] {
    const scalar_t* p = m.data<scalar_t>();
    for (size_t j = 0; j < pad.size(); ++j) pad[j] = p[j] != scalar_t(0);
  });
  return pad;
}

// What every derivative of attention reads from its node: q, k, v as saved
// (bfloat16 copies under autocast) given as_saved, else in float32 or
// float64 (a bfloat16 copy's values, exactly).
struct AttentionInputs {
  Tensor q, k, v;
  AttentionDims a;
  std::vector<uint8_t> pad;
  explicit AttentionInputs(const Node& n, bool as_saved = false)
      : q(read(n, &AttentionSaved::q, as_saved)), k(read(n, &AttentionSaved::k, as_saved)),
        v(read(n, &AttentionSaved::v, as_saved)), a(q.shape(), k.shape(), v.shape(), n.attrs<AttentionAttrs>().causal),
        pad(padding_bytes(n.saved_tensor(&AttentionSaved::key_padding_mask))) {}
  static Tensor read(const Node& n, AutocastInput AttentionSaved::*field, bool as_saved) {
    Tensor t = n.saved_tensor(field);
    return as_saved || t.dtype() != DType::bf16 ? t : t.to(DType::f32);
  }
};

// Gradients of attention as tensor ops, for a recorded backward (create_graph):
// every op here is differentiable again, so the result is too, to any order.
// S = q k^T / sqrt(D), masked keys at -inf; P = softmax(S) over keys, rows
// that see no key set to 0; the gradients as at the top of the file.
// The masks are constants (B,1,Tq,Tk) and (B,1,Tq,1); a row that sees no key
// keeps its finite scores for the softmax and is zeroed after it, so no NaN
// reaches the gradients.
Tensor attention_probabilities_recorded(const AttentionInputs& in) {
  const AttentionDims& a = in.a;
  Tensor s = mul(matmul(in.q, transpose(in.k, 2, 3)), a.scale<double>());  // (B,H,Tq,Tk)
  std::vector<int64_t> hidden(a.B * a.Tq * a.Tk), blind(a.B * a.Tq);  // masked key; row with no visible key
  bool any_hidden = false, any_blind = false;
  for (int64_t bt = 0; bt < a.B * a.Tq; ++bt) {
    int64_t* row = hidden.data() + bt * a.Tk;
    int64_t seen = 0;
    for (int64_t j = 0; j < a.Tk; ++j) {
      row[j] = j >= a.visible(bt % a.Tq) || (!in.pad.empty() && in.pad[bt / a.Tq * a.Tk + j]);
      seen += !row[j];
    }
    if (seen == 0) std::fill_n(row, a.Tk, int64_t{0});  // its scores stay finite
    blind[bt] = seen == 0;
    any_blind |= seen == 0;
    any_hidden |= seen > 0 && seen < a.Tk;
  }
  if (any_hidden)
    s = masked_fill(s, from_vector(hidden, {a.B, 1, a.Tq, a.Tk}), -std::numeric_limits<double>::infinity());
  Tensor p = softmax(s, -1);
  return any_blind ? masked_fill(p, from_vector(blind, {a.B, 1, a.Tq, 1}), 0.0) : p;
}

}  // namespace

static void attention_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const AttentionInputs in(n);
  const double scale = in.a.scale<double>();
  const Tensor p = attention_probabilities_recorded(in);
  if (n.needs(2)) gin[2] = matmul(transpose(p, 2, 3), g);
  if (!n.needs(0) && !n.needs(1)) return;
  const Tensor ds = softmax_jvp(p, matmul(g, transpose(in.v, 2, 3)), -1);
  if (n.needs(0)) gin[0] = mul(matmul(ds, in.k), scale);
  if (n.needs(1)) gin[1] = mul(matmul(transpose(ds, 2, 3), in.q), scale);
}

// Forward mode: dS = (tq k^T + q tk^T) / sqrt(D), dP = P (dS - rowsum(dS P)),
// d out = dP v + P tv. Masked keys and blind rows have P = 0, so their dP is 0
// too. Fused as the forward is, a block of query rows at a time, so no
// (Tq, Tk) matrix beyond one block is made; recorded (the tangent
// differentiated again), the engine derives the tangent from the backward.
static void attention_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const bool tq = t[0].defined(), tk = t[1].defined(), tv = t[2].defined();
  if (!tq && !tk && !tv) return;
  const AttentionInputs in(n);
  const AttentionDims& a = in.a;
  Tensor d_out = empty({a.B, a.H, a.Tq, a.Dv}, in.q.dtype());
  dispatch_float(in.q.dtype(), n.op->name, [&](auto tag) {
    using T = decltype(tag);
    const auto Q = head_matrices<T>(in.q), K = head_matrices<T>(in.k), V = head_matrices<T>(in.v);
    HeadMatrices<T> TQ, TK, TV;
    if (tq) TQ = head_matrices<T>(t[0]);
    if (tk) TK = head_matrices<T>(t[1]);
    if (tv) TV = head_matrices<T>(t[2]);
    const T scale = a.scale<T>();
    const int64_t rows = a.rows_per_block();
    for_each_block<T>(a, rows, tq || tk ? 2 : 1, [&](int64_t bh, int64_t i0, int64_t i1, int64_t kv, T* P, T*) {
      const int64_t m = i1 - i0;
      T *dP = P + rows * a.Tk, *o = d_out.data<T>() + (bh * a.Tq + i0) * a.Dv;  // o (m, Dv)
      if (kv == 0 || a.Dv == 0) {  // no query of the block sees a key: P = 0
        std::fill(o, o + m * a.Dv, T(0));
        return;
      }
      head_probabilities(a, Q, K, bh, in.pad, i0, i1, kv, P, kv);  // (m, kv)
      if (tq || tk) {
        if (tq) gemm(false, true, m, kv, a.D, scale, TQ.at(bh, i0), TQ.ld, K.at(bh), K.ld, T(0), dP, kv);
        if (tk) gemm(false, true, m, kv, a.D, scale, Q.at(bh, i0), Q.ld, TK.at(bh), TK.ld, T(tq), dP, kv);
        softmax_jacobian_rows(P, dP, m, kv);  // dS -> dP in place
        gemm(false, false, m, a.Dv, kv, T(1), dP, kv, V.at(bh), V.ld, T(0), o, a.Dv);
      }
      if (tv) gemm(false, false, m, a.Dv, kv, T(1), P, kv, TV.at(bh), TV.ld, T(tq || tk), o, a.Dv);
    });
  });
  out[0] = d_out;
}

// The backward (see the top of the file), a block of query rows at a time;
// given gin_tangents (OpSpec::backward_with_tangents, forward over reverse),
// also the tangents of the gradients in the same pass. With
// Pt = P (St - rowsum(St P)), St = (tq k^T + q tk^T) / sqrt(D) the tangent of
// P, the tangents of
//   dv = P^T g                            are  Pt^T g + P^T tg
//   dP = g v^T                                 dPt = tg v^T + g tv^T
//   dS = P (dP - r), r = rowsum(dP P)          dSt = Pt (dP - r) + P (dPt - rt),
//                                                    rt = rowsum(dPt P + dP Pt)
//   dq = dS k / sqrt(D)                        (dSt k + dS tk) / sqrt(D)
//   dk = dS^T q / sqrt(D)                      (dSt^T q + dS^T tq) / sqrt(D)
// Fifteen GEMMs of a block's size where the backward has five, as many as
// the recorded form's ops run, but no (B,H,Tq,Tk) tensor and no pass over
// one. A missing tangent is taken as zeros (not a case worth its own path).
static bool attention_backward_with_tangents(const Node& n, const Tensor& g, std::span<Tensor> gin,
                                             std::span<Tensor> gin_tangents) {
  const bool fwd = !gin_tangents.empty(), need_q = n.needs(0), need_k = n.needs(1), need_v = n.needs(2);
  const AttentionInputs in(n, /*as_saved=*/!fwd);
  const AttentionDims& a = in.a;
  const Tensor &q = in.q, &k = in.k, &v = in.v;
  Tensor tq, tk, tv, tg;
  if (fwd) tq = tangent_or_zeros(q), tk = tangent_or_zeros(k), tv = tangent_or_zeros(v), tg = tangent_or_zeros(g);
  auto grad = [&](bool need, const Shape& shape) { return need ? empty(shape, g.dtype()) : Tensor(); };
  Tensor dq = grad(need_q, q.shape()), dk = grad(need_k, k.shape()), dv = grad(need_v, v.shape());
  Tensor tdq = grad(fwd && need_q, q.shape()), tdk = grad(fwd && need_k, k.shape());
  Tensor tdv = grad(fwd && need_v, v.shape());
  if (a.B * a.H * a.Tq * a.Tk * a.Dv == 0) {  // empty attention: nothing flows back
    for (Tensor* t : {&dq, &dk, &dv, &tdq, &tdk, &tdv})
      if (t->defined()) t->zero_();
  } else {
    dispatch_float(g.dtype(), n.op->name, [&](auto tag) {
      using T = decltype(tag);
      const T scale = a.scale<T>();
      const int64_t rows = a.rows_per_block(), size = rows * a.Tk;
      auto at = [](Tensor& t, int64_t offset) { return t.defined() ? t.data<T>() + offset : nullptr; };
      // The GEMMs read In operands: T, or bfloat16 under autocast (never with tangents).
      auto run = [&]<class In>(const Tensor& qi, const Tensor& ki, const Tensor& vi, const Tensor& gi) {
        constexpr bool plain = std::is_same_v<In, T>;
        const auto Q = head_matrices<In>(qi), K = head_matrices<In>(ki), V = head_matrices<In>(vi);
        const auto G = head_matrices<In>(gi);
        HeadMatrices<T> TQ, TK, TV, TG;
        if constexpr (plain)
          if (fwd)
            TQ = head_matrices<T>(tq), TK = head_matrices<T>(tk), TV = head_matrices<T>(tv), TG = head_matrices<T>(tg);
        for_each_block<T, In>(a, rows, fwd ? 4 : 2, [&](int64_t bh, int64_t i0, int64_t i1, int64_t kv, T* P, In* buf) {
          const int64_t m = i1 - i0, qoff = (bh * a.Tq + i0) * a.D;
          // Per block (m, kv): P and dP -> dS; with tangents, their tangents Pt and dPt -> dSt.
          T *dS = P + size, *Pt = dS + size, *dSt = Pt + size, *dqb = at(dq, qoff), *tdqb = at(tdq, qoff);
          T *dkh = at(dk, bh * a.Tk * a.D), *tdkh = at(tdk, bh * a.Tk * a.D);
          T *dvh = at(dv, bh * a.Tk * a.Dv), *tdvh = at(tdv, bh * a.Tk * a.Dv);
          if (i0 == 0) {  // dk, dv and their tangents sum over the head's query blocks
            for (T* h : {dkh, tdkh})
              if (h) std::fill(h, h + a.Tk * a.D, T(0));
            for (T* h : {dvh, tdvh})
              if (h) std::fill(h, h + a.Tk * a.Dv, T(0));
          }
          if (kv == 0) {  // no query of the block sees a key: P = 0, dq = 0
            for (T* b : {dqb, tdqb})
              if (b) std::fill(b, b + m * a.D, T(0));
            return;
          }
          const In *qb = Q.at(bh, i0), *gb = G.at(bh, i0);
          {
            RecomputedWork again;  // the forward's P: not the model's work a second time
            head_probabilities<T>(a, Q, K, bh, in.pad, i0, i1, kv, P, kv);
          }
          if constexpr (plain) {
            if (fwd) {
              gemm(false, true, m, kv, a.D, scale, TQ.at(bh, i0), TQ.ld, K.at(bh), K.ld, T(0), Pt, kv);
              gemm(false, true, m, kv, a.D, scale, qb, Q.ld, TK.at(bh), TK.ld, T(1), Pt, kv);
              softmax_jacobian_rows(P, Pt, m, kv);  // St -> Pt in place
            }
          }
          if (need_v) {
            gemm(true, false, kv, a.Dv, m, T(1), block_operand(P, m * kv, buf), kv, gb, G.ld, T(1), dvh, a.Dv);
            if constexpr (plain) {
              if (fwd) {
                gemm(true, false, kv, a.Dv, m, T(1), Pt, kv, gb, G.ld, T(1), tdvh, a.Dv);
                gemm(true, false, kv, a.Dv, m, T(1), P, kv, TG.at(bh, i0), TG.ld, T(1), tdvh, a.Dv);
              }
            }
          }
          if (!need_q && !need_k) return;
          gemm(false, true, m, kv, a.Dv, T(1), gb, G.ld, V.at(bh), V.ld, T(0), dS, kv);
          bool jacobian_applied = false;
          if constexpr (plain) {
            if (fwd) {
              const T* tgb = TG.at(bh, i0);
              gemm(false, true, m, kv, a.Dv, T(1), tgb, TG.ld, V.at(bh), V.ld, T(0), dSt, kv);
              gemm(false, true, m, kv, a.Dv, T(1), gb, G.ld, TV.at(bh), TV.ld, T(1), dSt, kv);
              for (int64_t i = 0; i < m; ++i) {  // dP -> dS and dPt -> dSt, row by row
                T *d = dS + i * kv, *dt = dSt + i * kv;
                const T *p = P + i * kv, *pt = Pt + i * kv;
                const T r = detail::row_dot(d, p, kv), rt = detail::row_dot(dt, p, kv) + detail::row_dot(d, pt, kv);
#pragma omp simd
                for (int64_t j = 0; j < kv; ++j) {
                  const T x = d[j] - r;
                  dt[j] = pt[j] * x + p[j] * (dt[j] - rt);
                  d[j] = p[j] * x;
                }
              }
              jacobian_applied = true;
            }
          }
          if (!jacobian_applied) softmax_jacobian_rows(P, dS, m, kv);  // dP -> dS in place
          const In* dSb = block_operand(dS, m * kv, buf);
          if (need_q) {
            gemm(false, false, m, a.D, kv, scale, dSb, kv, K.at(bh), K.ld, T(0), dqb, a.D);
            if constexpr (plain) {
              if (fwd) {
                gemm(false, false, m, a.D, kv, scale, dSt, kv, K.at(bh), K.ld, T(0), tdqb, a.D);
                gemm(false, false, m, a.D, kv, scale, dS, kv, TK.at(bh), TK.ld, T(1), tdqb, a.D);
              }
            }
          }
          if (need_k) {
            gemm(true, false, kv, a.D, m, scale, dSb, kv, qb, Q.ld, T(1), dkh, a.D);
            if constexpr (plain) {
              if (fwd) {
                gemm(true, false, kv, a.D, m, scale, dSt, kv, qb, Q.ld, T(1), tdkh, a.D);
                gemm(true, false, kv, a.D, m, scale, dS, kv, TQ.at(bh, i0), TQ.ld, T(1), tdkh, a.D);
              }
            }
          }
        });
      };
      if constexpr (std::is_same_v<T, float>) {
        if (!fwd && in_bf16<T>())
          return run.template operator()<bfloat16>(bf16_operand(q), bf16_operand(k), bf16_operand(v), bf16_operand(g));
      }
      run.template operator()<T>(q, k, v, g);
    });
  }
  gin[0] = dq, gin[1] = dk, gin[2] = dv;
  if (fwd) gin_tangents[0] = tdq, gin_tangents[1] = tdk, gin_tangents[2] = tdv;
  return true;
}
static void attention_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  attention_backward_with_tangents(n, g, gin, {});
}

static const OpDef attention_op({
    .name = "scaled_dot_product_attention",
    .arity = 3,
    .signature = "scaled_dot_product_attention(q (B,H,Tq,D), k (B,H,Tk,D), v (B,H,Tk,Dv), causal, "
                 "key_padding_mask (B,Tk))",
    .saves = saves_of<AttentionSaved>(),
    .backward = attention_backward,
    .recorded_backward = attention_backward_recorded,
    .backward_with_tangents = attention_backward_with_tangents,
    .tangent = attention_tangent,
    .tangent_once_differentiable = true,
    .samples = [] {
      using samples::uniform;
      auto attend = [](bool causal, Tensor mask = Tensor()) {
        return [=](const std::vector<Tensor>& x) {
          return scaled_dot_product_attention(x[0], x[1], x[2], causal, mask);
        };
      };
      auto qkv = [](int64_t B, int64_t H, int64_t Tq, int64_t Tk, int64_t D, uint64_t seed) {
        return std::vector<Tensor>{uniform({B, H, Tq, D}, seed), uniform({B, H, Tk, D}, seed + 1),
                                   uniform({B, H, Tk, D}, seed + 2)};
      };
      // Batch 0 pads its last key; batch 1 pads every key (a fully masked row).
      Tensor padding = from_vector(std::vector<int64_t>{0, 0, 1, 1, 1, 1}, {2, 3});
      return std::vector<OpSample>{
          {"(1,2,3,4) self-attention", qkv(1, 2, 3, 3, 4, 351), attend(false)},
          {"(2,1,4,3) causal", qkv(2, 1, 4, 4, 3, 354), attend(true)},
          {"(2,2,3,4) key padding mask, one row fully masked", qkv(2, 2, 3, 3, 4, 357), attend(false, padding)},
          {"(1,2,2,3) cross-attention Tq=2 Tk=5", qkv(1, 2, 2, 5, 3, 360), attend(false)},
          {"(1,1,3,2) causal Tq=3 Tk=5", qkv(1, 1, 3, 5, 2, 363), attend(true)},
          {"(2,1,3,2) causal with padding", qkv(2, 1, 3, 3, 2, 366), attend(true, padding)},
          {"q from a transposed (B,T,H,D) view",
           {uniform({1, 3, 2, 4}, 369), uniform({1, 2, 3, 4}, 370), uniform({1, 2, 3, 4}, 371)},
           [](const std::vector<Tensor>& x) { return scaled_dot_product_attention(x[0].transpose(1, 2), x[1], x[2]); }},
          {"non-contiguous k (1,1,3,2)",
           {uniform({1, 1, 3, 2}, 372), samples::strided({1, 1, 3, 2}, 373), uniform({1, 1, 3, 2}, 374)},
           attend(false)},
      };
    },
});

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    const Tensor& key_padding_mask, Tensor* attn_weights) {
  const std::string_view op = attention_op.name;
  ProfileScope prof(op);
  check_floating(op, q, "q");
  check_floating(op, k, "k");
  check_floating(op, v, "v");
  const Shape &qs = q.shape(), &ks = k.shape(), &vs = v.shape();
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype())
    throw DTypeError(fmt::format("{}: q, k, v dtypes differ: q {} {}, k {} {}, v {} {}", op, qs,
                                 dtype_name(q.dtype()), ks, dtype_name(k.dtype()), vs, dtype_name(v.dtype())));
  if (qs.size() != 4 || ks.size() != 4 || vs.size() != 4 || qs[0] != ks[0] || qs[0] != vs[0] || qs[1] != ks[1] ||
      qs[1] != vs[1] || qs[3] != ks[3] || ks[2] != vs[2])
    throw ShapeError(fmt::format("{}: expected q (B,H,Tq,D), k (B,H,Tk,D), v (B,H,Tk,Dv); got q {}, k {}, v {}", op,
                                 qs, ks, vs));
  const AttentionDims a(qs, ks, vs, causal);
  if (a.D == 0) throw ShapeError(fmt::format("{}: head size D is 0 (q {}, k {})", op, qs, ks));
  if (key_padding_mask.defined() && !(key_padding_mask.shape() == Shape{a.B, a.Tk}))
    throw ShapeError(fmt::format("{}: key_padding_mask {} must be (B,Tk) = ({},{}) for q {}, k {}", op,
                                 key_padding_mask.shape(), a.B, a.Tk, qs, ks));
  const std::vector<uint8_t> pad = padding_bytes(key_padding_mask);
  // The full (B,H,Tq,Tk) probabilities are kept only when the caller asks for
  // them, written whole rows at a time; otherwise each thread reuses one
  // (rows, Tk) scratch block.
  const bool keep_probs = attn_weights != nullptr;
  Tensor probs = keep_probs ? empty({a.B, a.H, a.Tq, a.Tk}, q.dtype()) : Tensor();
  Tensor out = empty({a.B, a.H, a.Tq, a.Dv}, q.dtype());
  Tensor qb, kb, vb;  // under autocast: q, k, v rounded once for every GEMM (and kept by the node)
  if (a.B * a.H * a.Tq > 0) {
    dispatch_float(q.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      auto attend = [&]<class In>(const Tensor& qi, const Tensor& ki, const Tensor& vi) {
        const auto Q = head_matrices<In>(qi), K = head_matrices<In>(ki), V = head_matrices<In>(vi);
        const int64_t rows = keep_probs ? a.Tq : a.rows_per_block();
        for_each_block<T, In>(a, rows, !keep_probs,
                              [&](int64_t bh, int64_t i0, int64_t i1, int64_t kv, T* scratch, In* rounded_p) {
                                const int64_t ld = keep_probs ? a.Tk : kv, m = i1 - i0;
                                T* S = keep_probs ? probs.data<T>() + (bh * a.Tq + i0) * a.Tk : scratch;
                                head_probabilities<T>(a, Q, K, bh, pad, i0, i1, kv, S, ld);
                                T* o = out.data<T>() + (bh * a.Tq + i0) * a.Dv;
                                if (kv > 0 && a.Dv > 0)
                                  gemm(false, false, m, a.Dv, kv, T(1), block_operand(S, m * ld, rounded_p), ld,
                                       V.at(bh), V.ld, T(0), o, a.Dv);
                                else
                                  std::fill(o, o + m * a.Dv, T(0));
                              });
      };
      if constexpr (std::is_same_v<T, float>) {
        if (in_bf16<T>()) {
          qb = bf16_operand(q), kb = bf16_operand(k), vb = bf16_operand(v);
          return attend.template operator()<bfloat16>(qb, kb, vb);
        }
      }
      attend.template operator()<T>(q, k, v);
    });
  }
  if (attn_weights) *attn_weights = probs;
  if (Node* n = record(attention_op, out, q, k, v)) {
    n->attrs<AttentionAttrs>() = {.causal = causal};
    n->save(AttentionSaved{.q = {q, qb}, .k = {k, kb}, .v = {v, vb}, .key_padding_mask = key_padding_mask});
  }
  return out;
}

}  // namespace tg
