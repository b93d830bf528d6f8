// Scaled dot-product attention as one tape node. Per (batch, head):
//   forward:  S = q k^T / sqrt(D) (GEMM), P = masked softmax of S over keys,
//             out = P v (GEMM);
//   backward: P (kept, or again from q and k: one more GEMM), then
//             dv = P^T g, dP = g v^T, dS = P * (dP - rowsum(dP * P)),
//             dq = dS k / sqrt(D), dk = dS^T q / sqrt(D) (four GEMMs).
// The node keeps P while it is no larger than q, k, v and the output
// together (AttentionDims::keeps_probabilities: up to 256 keys at D = 64), as
// torch's attention keeps its softmax's output; past that, backward computes
// P again rather than hold (B,H,Tq,Tk) values, so that memory grows with T,
// not T^2. The node saves q, k, v, the padding mask and that P. Both passes
// go over a head's queries in blocks of rows (AttentionDims::rows_per_block),
// so a thread's scratch for P and dS is a block of (Tk, rows), not (Tk, Tq):
// 64 MiB each at T = 4096; and under the causal mask a block's GEMMs stop at
// the last key its last query sees. A block holds P and dS transposed, a row
// per key (S^T = k q^T): the softmax and its Jacobian reduce over keys, so in
// this layout they are vector loops across queries, with no horizontal sums
// and no row tails (a row of 64 keys or fewer, common here, is mostly tail).
// Under autocast every GEMM here reads bfloat16 operands: q, k, v and g are
// rounded once, whole, rather than by each per-head GEMM that reads them, and
// the node keeps q, k, v as those bfloat16 copies (AutocastInput), half the
// memory of the float32 projection they are views of; P and dS are rounded
// to bfloat16 in the pass that makes them (a kept P once more in backward).
// The values are those autocast's GEMMs would round to.
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
  Tensor probabilities;     // (B*H, Tq*Tk): the forward's P^T blocks (see keeps_probabilities), or undefined
  static constexpr std::tuple fields{
      saved_field("q", &AttentionSaved::q), saved_field("k", &AttentionSaved::k), saved_field("v", &AttentionSaved::v),
      saved_field("key_padding_mask", &AttentionSaved::key_padding_mask),
      saved_field("probabilities", &AttentionSaved::probabilities)};
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
  // stay efficient; without a mask, a head of up to 256 keys is one block.
  // Under the causal mask 64 rows (past 4096 keys, more than 2^18 values): a
  // block's GEMMs stop at the last key its last query sees, so smaller
  // blocks skip more of the masked triangle
  // (forward and backward 15-17% faster at T = 128, 33% at 512, 6% at 1024,
  // D = 64, bfloat16 on a Zen 4; 32 rows were slower).
  int64_t rows_per_block() const {
    if (causal) return std::min<int64_t>(Tq, 64);
    return std::min(Tq, std::max<int64_t>(64, (int64_t{1} << 18) / std::max<int64_t>(1, Tk)));
  }
  template <class T> T scale() const { return static_cast<T>(1.0 / std::sqrt(static_cast<double>(D))); }
  // Whether the node keeps the forward's probabilities for backward rather
  // than computing them again: while they take no more than q, k, v and the
  // output together (Tk up to 2 (D + Dv) for self-attention: 256 keys at D =
  // 64), as torch's attention keeps its softmax. Longer sequences recompute
  // them, so that memory grows with T, not T^2.
  bool keeps_probabilities() const { return Tq * Tk <= (Tq + Tk) * (D + Dv); }
  // Where the P^T (kv, m) block of queries [i0, ...) of head bh sits in the
  // kept probabilities (B*H, Tq*Tk).
  int64_t probabilities_at(int64_t bh, int64_t i0) const { return (bh * Tq + i0) * Tk; }
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

// Queries per pass of the softmax and its Jacobian: their running maxima and
// sums stay on the stack.
constexpr int64_t kQueryChunk = 64;

// Row j of a (kv, m) block, columns [c0, c0 + w), rounded to bfloat16 into
// the same place of `rounded`, where the GEMMs read bfloat16 (In is not T)
// and the caller wants the block rounded.
template <class T, class In>
void round_block_row(const T* row, In* rounded, int64_t j, int64_t m, int64_t c0, int64_t w) {
  if constexpr (!std::is_same_v<In, T>) {
    if (!rounded) return;
    uint16_t* out = &rounded[j * m + c0].bits;
#pragma omp simd
    for (int64_t c = 0; c < w; ++c) out[c] = bfloat16::round(row[c]);
  }
}

// A block as its GEMMs read it: the block itself, or its bfloat16 rounding
// where they read bfloat16.
template <class In, class T>
const In* block_operand(const T* block, const In* rounded) {
  if constexpr (std::is_same_v<In, T>)
    return block;
  else
    return rounded;
}

// Softmax over keys in place, for queries [i0, i0 + m) whose scaled scores
// are S^T (kv, m): P^T. Masked keys (past the causal limit or padded) get
// exactly 0. A query that sees no key gets a zero column, or a NaN column if
// one of the scores it sees is NaN; a NaN beside finite scores makes the
// column NaN through the sum, as softmax(S) v gives it. Given `rounded`,
// P^T is also written there in bfloat16.
template <class T, class In>
void softmax_over_keys(const AttentionDims& a, T* PT, int64_t kv, int64_t i0, int64_t m, const uint8_t* pad,
                       In* rounded) {
  constexpr T kNegInf = -std::numeric_limits<T>::infinity();
  for (int64_t c0 = 0; c0 < m; c0 += kQueryChunk) {
    const int64_t w = std::min(kQueryChunk, m - c0);
    T mx[kQueryChunk], sum[kQueryChunk], inv[kQueryChunk], blind[kQueryChunk];
    int64_t visible[kQueryChunk];
    for (int64_t c = 0; c < w; ++c) mx[c] = kNegInf, sum[c] = 0, visible[c] = a.visible(i0 + c0 + c);
    for (int64_t j = 0; j < kv; ++j) {
      T* row = PT + j * m + c0;
      const bool padded = pad && pad[j];
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        const T x = padded || j >= visible[c] ? kNegInf : row[c];
        row[c] = x;
        mx[c] = mx[c] > x ? mx[c] : x;  // vmaxps; a NaN it drops is caught below or by the sum
      }
    }
    // A max of -inf: the query sees no key, or only NaN beside -inf. Its
    // column is filled last, with 0 or NaN.
    bool any_blind = false;
    for (int64_t c = 0; c < w; ++c) {
      if (mx[c] != kNegInf) continue;
      any_blind = true;
      blind[c] = 0;
      for (int64_t j = 0; j < kv; ++j)
        if (std::isnan(PT[j * m + c0 + c])) blind[c] = std::numeric_limits<T>::quiet_NaN();
    }
    for (int64_t j = 0; j < kv; ++j) {
      T* row = PT + j * m + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) {
        const T e = detail::vexp(row[c] - mx[c]);
        row[c] = e;
        sum[c] += e;
      }
    }
    for (int64_t c = 0; c < w; ++c) inv[c] = T(1) / sum[c];
    for (int64_t j = 0; j < kv; ++j) {
      T* row = PT + j * m + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) row[c] *= inv[c];
      if (any_blind)
        for (int64_t c = 0; c < w; ++c)
          if (mx[c] == kNegInf) row[c] = blind[c];
      round_block_row(row, rounded, j, m, c0, w);
    }
  }
}

// P^T (kv, m) of queries [i0, i1) of head bh: the scaled scores k q^T by
// GEMM, then the softmax over keys. kv must cover every key the queries see
// (visible(i1 - 1)). Forward and backward share it, so both see the same P.
template <class T, class In>
void head_probabilities(const AttentionDims& a, const HeadMatrices<In>& Q, const HeadMatrices<In>& K, int64_t bh,
                        const std::vector<uint8_t>& pad, int64_t i0, int64_t i1, int64_t kv, T* PT,
                        In* rounded = nullptr) {
  const int64_t m = i1 - i0;
  if (kv > 0) gemm(false, true, kv, m, a.D, a.scale<T>(), K.at(bh), K.ld, Q.at(bh, i0), Q.ld, T(0), PT, m);
  const uint8_t* pb = pad.empty() ? nullptr : pad.data() + bh / a.H * a.Tk;
  softmax_over_keys(a, PT, kv, i0, m, pb, rounded);
}

// The softmax's Jacobian (symmetric, so backward and tangent alike) applied
// in place to X^T (kv, m) at probabilities P^T (kv, m), for each query:
// x = p (x - <x, p>) over its keys. Given `rounded`, the result is also
// written there in bfloat16.
template <class T, class In = T>
void softmax_jacobian_over_keys(const T* PT, T* XT, int64_t kv, int64_t m, In* rounded = nullptr) {
  for (int64_t c0 = 0; c0 < m; c0 += kQueryChunk) {
    const int64_t w = std::min(kQueryChunk, m - c0);
    T r[kQueryChunk] = {};
    for (int64_t j = 0; j < kv; ++j) {
      const T *p = PT + j * m + c0, *x = XT + j * m + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) r[c] += x[c] * p[c];
    }
    for (int64_t j = 0; j < kv; ++j) {
      const T* p = PT + j * m + c0;
      T* x = XT + j * m + c0;
#pragma omp simd
      for (int64_t c = 0; c < w; ++c) x[c] = p[c] * (x[c] - r[c]);
      round_block_row(x, rounded, j, m, c0, w);
    }
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
    for_each_block<T>(a, rows, tq || tk ? 2 : 1, [&](int64_t bh, int64_t i0, int64_t i1, int64_t kv, T* PT, T*) {
      const int64_t m = i1 - i0;
      T *dPT = PT + rows * a.Tk, *o = d_out.data<T>() + (bh * a.Tq + i0) * a.Dv;  // P^T, dP^T (kv, m); o (m, Dv)
      if (kv == 0 || a.Dv == 0) {  // no query of the block sees a key: P = 0
        std::fill(o, o + m * a.Dv, T(0));
        return;
      }
      head_probabilities(a, Q, K, bh, in.pad, i0, i1, kv, PT);
      if (tq || tk) {
        if (tq) gemm(false, true, kv, m, a.D, scale, K.at(bh), K.ld, TQ.at(bh, i0), TQ.ld, T(0), dPT, m);
        if (tk) gemm(false, true, kv, m, a.D, scale, TK.at(bh), TK.ld, Q.at(bh, i0), Q.ld, T(tq), dPT, m);
        softmax_jacobian_over_keys(PT, dPT, kv, m);  // dS^T -> dP^T in place
        gemm(true, false, m, a.Dv, kv, T(1), dPT, m, V.at(bh), V.ld, T(0), o, a.Dv);
      }
      if (tv) gemm(true, false, m, a.Dv, kv, T(1), PT, m, TV.at(bh), TV.ld, T(tq || tk), o, a.Dv);
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
  const Tensor probabilities = fwd ? Tensor() : n.saved_tensor(&AttentionSaved::probabilities);
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
      const T* kept = probabilities.defined() ? probabilities.data<T>() : nullptr;
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
        for_each_block<T, In>(a, rows, fwd ? 4 : 2, [&](int64_t bh, int64_t i0, int64_t i1, int64_t kv, T* PT, In* buf) {
          const int64_t m = i1 - i0, qoff = (bh * a.Tq + i0) * a.D;
          // Per block, transposed (kv, m): P and dP -> dS; with tangents, their tangents Pt and dPt -> dSt.
          T *dST = PT + size, *PtT = dST + size, *dStT = PtT + size, *dqb = at(dq, qoff), *tdqb = at(tdq, qoff);
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
          // Under autocast buf holds P^T in bfloat16 for dv's GEMM, then dS^T for dq's and dk's.
          In* rounded = plain ? nullptr : buf;
          const T* P = PT;  // P^T (kv, m)
          if (kept) {  // the forward's, read in place
            P = kept + a.probabilities_at(bh, i0);
            if constexpr (!plain)
              if (need_v) float_to_bf16(P, rounded, kv * m);
          } else {
            RecomputedWork again;  // the forward's P: not the model's work a second time
            head_probabilities<T>(a, Q, K, bh, in.pad, i0, i1, kv, PT, need_v ? rounded : nullptr);
          }
          if constexpr (plain) {
            if (fwd) {
              gemm(false, true, kv, m, a.D, scale, K.at(bh), K.ld, TQ.at(bh, i0), TQ.ld, T(0), PtT, m);
              gemm(false, true, kv, m, a.D, scale, TK.at(bh), TK.ld, qb, Q.ld, T(1), PtT, m);
              softmax_jacobian_over_keys(P, PtT, kv, m);  // St -> Pt in place
            }
          }
          if (need_v) {
            gemm(false, false, kv, a.Dv, m, T(1), block_operand(P, buf), m, gb, G.ld, T(1), dvh, a.Dv);
            if constexpr (plain) {
              if (fwd) {
                gemm(false, false, kv, a.Dv, m, T(1), PtT, m, gb, G.ld, T(1), tdvh, a.Dv);
                gemm(false, false, kv, a.Dv, m, T(1), P, m, TG.at(bh, i0), TG.ld, T(1), tdvh, a.Dv);
              }
            }
          }
          if (!need_q && !need_k) return;
          gemm(false, true, kv, m, a.Dv, T(1), V.at(bh), V.ld, gb, G.ld, T(0), dST, m);
          bool jacobian_applied = false;
          if constexpr (plain) {
            if (fwd) {
              gemm(false, true, kv, m, a.Dv, T(1), V.at(bh), V.ld, TG.at(bh, i0), TG.ld, T(0), dStT, m);
              gemm(false, true, kv, m, a.Dv, T(1), TV.at(bh), TV.ld, gb, G.ld, T(1), dStT, m);
              for (int64_t c0 = 0; c0 < m; c0 += kQueryChunk) {  // dP -> dS and dPt -> dSt, per query
                const int64_t w = std::min(kQueryChunk, m - c0);
                T r[kQueryChunk] = {}, rt[kQueryChunk] = {};
                for (int64_t j = 0; j < kv; ++j) {
                  const T *d = dST + j * m + c0, *dt = dStT + j * m + c0;
                  const T *p = P + j * m + c0, *pt = PtT + j * m + c0;
#pragma omp simd
                  for (int64_t c = 0; c < w; ++c) {
                    r[c] += d[c] * p[c];
                    rt[c] += dt[c] * p[c] + d[c] * pt[c];
                  }
                }
                for (int64_t j = 0; j < kv; ++j) {
                  T *d = dST + j * m + c0, *dt = dStT + j * m + c0;
                  const T *p = P + j * m + c0, *pt = PtT + j * m + c0;
#pragma omp simd
                  for (int64_t c = 0; c < w; ++c) {
                    const T x = d[c] - r[c];
                    dt[c] = pt[c] * x + p[c] * (dt[c] - rt[c]);
                    d[c] = p[c] * x;
                  }
                }
              }
              jacobian_applied = true;
            }
          }
          if (!jacobian_applied) softmax_jacobian_over_keys(P, dST, kv, m, rounded);  // dP -> dS in place
          const In* dSb = block_operand(dST, buf);
          if (need_q) {
            gemm(true, false, m, a.D, kv, scale, dSb, m, K.at(bh), K.ld, T(0), dqb, a.D);
            if constexpr (plain) {
              if (fwd) {
                gemm(true, false, m, a.D, kv, scale, dStT, m, K.at(bh), K.ld, T(0), tdqb, a.D);
                gemm(true, false, m, a.D, kv, scale, dST, m, TK.at(bh), TK.ld, T(1), tdqb, a.D);
              }
            }
          }
          if (need_k) {
            gemm(false, false, kv, a.D, m, scale, dSb, m, qb, Q.ld, T(1), dkh, a.D);
            if constexpr (plain) {
              if (fwd) {
                gemm(false, false, kv, a.D, m, scale, dStT, m, qb, Q.ld, T(1), tdkh, a.D);
                gemm(false, false, kv, a.D, m, scale, dST, m, TQ.at(bh, i0), TQ.ld, T(1), tdkh, a.D);
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
          {"(1,2,9,2) causal, P computed again in backward (Tk > 2 (D + Dv))", qkv(1, 2, 9, 9, 2, 375),
           attend(true)},
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
  // them: each head is then one block, copied out transposed; otherwise each
  // thread reuses one (Tk, rows) scratch block.
  const bool keep_probs = attn_weights != nullptr;
  Tensor probs = keep_probs ? empty({a.B, a.H, a.Tq, a.Tk}, q.dtype()) : Tensor();
  // The node's copy of P, blocks as the backward reads them (same rows).
  const bool for_backward = !keep_probs && a.keeps_probabilities() && may_record(q, k, v);
  Tensor kept = for_backward ? empty({a.B * a.H, a.Tq * a.Tk}, q.dtype()) : Tensor();
  // (B,H,Tq,Dv) as a view of (B,Tq,H,Dv) memory: heads side by side, so that
  // merging them back to (B,Tq,H*Dv) for the output projection is a view, not a copy.
  Tensor out = empty({a.B, a.Tq, a.H, a.Dv}, q.dtype()).transpose(1, 2);
  const int64_t out_ld = a.H * a.Dv;  // between a head's rows of out
  Tensor qb, kb, vb;  // under autocast: q, k, v rounded once for every GEMM (and kept by the node)
  if (a.B * a.H * a.Tq > 0) {
    dispatch_float(q.dtype(), op, [&](auto tag) {
      using T = decltype(tag);
      auto attend = [&]<class In>(const Tensor& qi, const Tensor& ki, const Tensor& vi) {
        constexpr bool plain = std::is_same_v<In, T>;
        const auto Q = head_matrices<In>(qi), K = head_matrices<In>(ki), V = head_matrices<In>(vi);
        const int64_t rows = keep_probs ? a.Tq : a.rows_per_block();
        for_each_block<T, In>(a, rows, 1, [&](int64_t bh, int64_t i0, int64_t i1, int64_t kv, T* PT, In* rounded) {
          const int64_t m = i1 - i0;
          if (kept.defined()) PT = kept.data<T>() + a.probabilities_at(bh, i0);
          head_probabilities<T>(a, Q, K, bh, pad, i0, i1, kv, PT, plain ? nullptr : rounded);  // P^T (kv, m)
          T* o = out.data<T>() + (bh / a.H * a.Tq + i0) * out_ld + bh % a.H * a.Dv;  // (m, Dv), out_ld apart
          if (kv > 0 && a.Dv > 0)
            gemm(true, false, m, a.Dv, kv, T(1), block_operand(PT, rounded), m, V.at(bh), V.ld, T(0), o, out_ld);
          else
            for (int64_t i = 0; i < m; ++i) std::fill(o + i * out_ld, o + i * out_ld + a.Dv, T(0));
          if (keep_probs) {  // the caller's (Tq, Tk) rows: P^T transposed, zeros past kv
            T* P = probs.data<T>() + (bh * a.Tq + i0) * a.Tk;
            for (int64_t i = 0; i < m; ++i)
              for (int64_t j = 0; j < a.Tk; ++j) P[i * a.Tk + j] = j < kv ? PT[j * m + i] : T(0);
          }
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
    n->save(AttentionSaved{
        .q = {q, qb}, .k = {k, kb}, .v = {v, vb}, .key_padding_mask = key_padding_mask, .probabilities = kept});
  }
  return out;
}

}  // namespace tg
