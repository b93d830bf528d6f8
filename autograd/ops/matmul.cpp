// Matrix products, each a (batched) GEMM on operands seen as batches of strided
// (rows, cols) matrices: GEMM reads a matrix as-is or transposed, so only
// layouts with no unit stride are copied. A batch folds into ONE GEMM where the
// strides allow (x (B,T,C) @ W (C,N) as (B*T,C) @ (C,N); a gradient summed over
// a broadcast batch as x^T (C,B*T) @ g (B*T,N)), else GEMMs loop over it.
#include "autograd/ops/matmul.h"

#include <algorithm>
#include <cstring>

#include "autograd/autocast.h"
#include "autograd/blas.h"
#include "autograd/op.h"
#include "autograd/parallel.h"
#include "autograd/ops/common.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/tangent.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
namespace {

// A stack of (rows, cols) matrices laid over the product's batch shape: the
// matrix at batch index b starts at sum_d b[d] * bstride[d] (0 where this
// operand is broadcast, or where a gradient is summed over that dim).
struct MatBatch {
  int64_t rows = 1, cols = 1, rs = 1, cs = 1;
  Shape bstride;
};

MatBatch transposed(MatBatch m) {
  std::swap(m.rows, m.cols);
  std::swap(m.rs, m.cs);
  return m;
}

// How GEMM reads a matrix: row-major as-is (ld = row stride) or transposed
// (ld = column stride). False when neither fits.
struct GemmArg {
  bool trans = false;
  int64_t ld = 1;
};
bool gemm_layout(const MatBatch& m, GemmArg& arg) {
  for (const bool trans : {false, true}) {
    const MatBatch t = trans ? transposed(m) : m;  // row-major as GEMM reads it
    if ((t.cols <= 1 || t.cs == 1) && (t.rows <= 1 || t.rs >= std::max<int64_t>(t.cols, 1))) {
      arg = {trans, t.rows <= 1 ? std::max<int64_t>(t.cols, 1) : t.rs};
      return true;
    }
  }
  return false;
}

// t seen as a batch of matrices over `batch` (right-aligned, broadcast dims
// get stride 0). A 1-D operand lacks the row (has_rows = false) or the
// column dim (has_cols = false), which then has size 1.
MatBatch describe_mat(const Tensor& t, const Shape& batch, bool has_rows, bool has_cols) {
  MatBatch m;
  int idx = t.dim();
  if (has_cols) {
    --idx;
    m.cols = t.shape()[idx];
    m.cs = t.strides()[idx];
  }
  if (has_rows) {
    --idx;
    m.rows = t.shape()[idx];
    m.rs = t.strides()[idx];
  }
  const int nb = batch.size();
  for (int d = 0; d < nb; ++d) {
    int td = d - (nb - idx);
    m.bstride.push_back(td < 0 || t.shape()[td] == 1 ? 0 : t.strides()[td]);
  }
  return m;
}

// Merges every batch dim into the matrix's rows (or columns) when the strides
// line up, e.g. a contiguous (B,T,C) into one (B*T,C) matrix. False if not.
bool fold_batch(const Shape& batch, MatBatch& m, bool into_rows) {
  int64_t n = into_rows ? m.rows : m.cols;
  int64_t s = into_rows ? m.rs : m.cs;
  for (int d = batch.size() - 1; d >= 0; --d) {
    if (batch[d] == 1) continue;
    if (n == 1) {
      n = batch[d];
      s = m.bstride[d];
    } else if (m.bstride[d] == s * n) {
      n *= batch[d];
    } else {
      return false;
    }
  }
  MatBatch f = m;
  (into_rows ? f.rows : f.cols) = n;
  (into_rows ? f.rs : f.cs) = s;
  f.bstride = Shape();
  GemmArg unused;
  if (!gemm_layout(f, unused)) return false;
  m = f;
  return true;
}

bool broadcast_in(const Shape& batch, const MatBatch& m) {
  for (int d = 0; d < batch.size(); ++d)
    if (batch[d] > 1 && m.bstride[d] != 0) return false;
  return true;
}

// C's rows of one product start as the bias (C.cols values): the GEMM then adds into them.
template <class T>
void fill_rows(const MatBatch& C, T* pc, const T* bias) {
  for (int64_t i = 0; i < C.rows; ++i)
    for (int64_t j = 0; j < C.cols; ++j) pc[i * C.rs + j * C.cs] = bias[j];
}

// C = A B + beta C, + bias (C.cols, or null) on every row.
template <class In, class T>
void gemm_one(const MatBatch& A, const MatBatch& B, const MatBatch& C, const In* pa, const In* pb, T* pc, T beta,
              const T* bias = nullptr) {
  GemmArg ga, gb, gc;
  gemm_layout(A, ga);
  gemm_layout(B, gb);
  gemm_layout(C, gc);  // C is one we allocated: row-major, or column-major (gradient_like)
  if (gc.trans) {      // C^T = B^T A^T, row-major; the bias runs down its columns
    if (bias) fill_rows(C, pc, bias), beta = T(1);
    gemm(!gb.trans, !ga.trans, C.cols, C.rows, A.cols, T(1), pb, gb.ld, pa, ga.ld, beta, pc, gc.ld);
  } else {
    gemm(ga.trans, gb.trans, C.rows, C.cols, A.cols, T(1), pa, ga.ld, pb, gb.ld, beta, pc, gc.ld, bias);
  }
}

// An uninitialised gradient (of dtype) for operand x of a product with
// `inner` entries in its inner dim, column-major where x is a transposed view
// (linear's weight^T): the transpose's gradient is then dense, not read
// across rows.
Tensor gradient_like(const Tensor& x, int64_t inner, DType dtype) {
  const int r = x.dim();
  const bool column_major = r >= 2 && inner > 0 && x.shape()[r - 2] > 1 && x.shape()[r - 1] > 1 &&
                            x.strides()[r - 2] == 1 && x.strides()[r - 1] >= x.shape()[r - 2];
  if (!column_major) return empty(x.shape(), dtype);
  Shape swapped = x.shape();
  std::swap(swapped[r - 2], swapped[r - 1]);
  return empty(swapped, dtype).transpose(r - 2, r - 1);
}

// C (batch..., M, N) = A (batch..., M, K) @ B (batch..., K, N), or += when
// accumulate, or + bias (N) on every row (not with accumulate). Where C's
// batch stride is 0 the products are summed into it (the backward of a
// broadcast batch dim). A and B must be GEMM-readable.
template <class In, class T>
void batched_gemm(const Shape& batch, MatBatch A, MatBatch B, MatBatch C, const In* pa, const In* pb, T* pc,
                  bool accumulate, const T* bias = nullptr) {
  const int64_t M = C.rows, N = C.cols, K = A.cols, count = batch.numel();
  if (M == 0 || N == 0 || count == 0) return;
  auto zero_c = [&] {  // C's extent: one we allocated, dense
    int64_t span = (M - 1) * C.rs + (N - 1) * C.cs + 1;
    for (int d = 0; d < batch.size(); ++d) span = std::max(span, C.bstride[d] * batch[d]);
    std::fill(pc, pc + span, T(0));
  };
  auto offsets = [&](int64_t k) {  // of product k's A, B and C, by its batch index
    std::array<int64_t, 3> o{};
    for (int64_t d = batch.size() - 1, rest = k; d >= 0; rest /= batch[d--]) {
      const int64_t i = rest % batch[d];
      o[0] += i * A.bstride[d];
      o[1] += i * B.bstride[d];
      o[2] += i * C.bstride[d];
    }
    return o;
  };
  bool c_reduced = false;  // some products are summed into the same C
  for (int d = 0; d < batch.size(); ++d) c_reduced |= batch[d] > 1 && C.bstride[d] == 0;
  // One GEMM: batch folded into M (B shared by every product), the bias in it ...
  MatBatch A1 = A, C1 = C;
  if (K > 0 && broadcast_in(batch, B) && !c_reduced && fold_batch(batch, A1, true) && fold_batch(batch, C1, true))
    return gemm_one<In, T>(A1, B, C1, pa, pb, pc, accumulate ? T(1) : T(0), bias);
  // ... otherwise C's rows start as the bias, and the products add into them.
  if (bias) {
    for (int64_t k = 0; k < count; ++k) fill_rows(C, pc + offsets(k)[2], bias);
    accumulate = true;
  }
  if (K == 0) {
    if (!accumulate) zero_c();
    return;
  }
  // Every product summed into one C: batch folded into K.
  MatBatch A2 = A, B2 = B;
  if (broadcast_in(batch, C) && count > 1 && fold_batch(batch, A2, false) && fold_batch(batch, B2, true))
    return gemm_one<In, T>(A2, B2, C, pa, pb, pc, accumulate ? T(1) : T(0));
  // A loop over the batch. A summed-into C starts from zero, then accumulates.
  if (c_reduced && !accumulate) zero_c();
  const T beta = c_reduced || accumulate ? T(1) : T(0);
  for (int64_t k = 0; k < count; ++k) {
    const auto [oa, ob, oc] = offsets(k);
    gemm_one<In, T>(A, B, C, pa + oa, pb + ob, pc + oc, beta);
  }
}

// out = a @ b over `batch`, or out += a @ b when accumulate, or + bias (out's
// last dim, contiguous, out's dtype; not with accumulate). Each tensor's
// has_rows/has_cols say which matrix dims it has (1-D operands lack one).
struct Operand {
  const Tensor& t;
  bool has_rows, has_cols;
};
void run_product(const Shape& batch, Operand a, Operand b, Operand out, bool transpose_a, bool transpose_b,
                 bool accumulate, const Tensor& bias = Tensor()) {
  auto readable = [&](const Operand& o) {
    GemmArg unused;
    if (gemm_layout(describe_mat(o.t, batch, o.has_rows, o.has_cols), unused)) return o.t;
    NoGradGuard ng;
    return o.t.contiguous();
  };
  Tensor ta = readable(a), tb = readable(b);
  // A bfloat16 operand (under autocast: a kept copy of an activation, a
  // gradient that two GEMMs read) makes the product bfloat16: the other one
  // is read from autocast's kept copy of a parameter, else rounded here.
  const bool bf16 = ta.dtype() == DType::bf16 || tb.dtype() == DType::bf16;
  const bfloat16 *kept_a = nullptr, *kept_b = nullptr;
  if (bf16) {
    auto as_bf16 = [](Tensor& t, const bfloat16*& kept) {
      if (t.dtype() == DType::bf16 || (kept = detail::autocast_cached(t.data<float>()))) return;
      t = detail::bf16_operand(t);
    };
    as_bf16(ta, kept_a);
    as_bf16(tb, kept_b);
  }
  MatBatch A = describe_mat(ta, batch, a.has_rows, a.has_cols);
  MatBatch B = describe_mat(tb, batch, b.has_rows, b.has_cols);
  MatBatch C = describe_mat(out.t, batch, out.has_rows, out.has_cols);
  if (transpose_a) A = transposed(A);
  if (transpose_b) B = transposed(B);
  if (bf16)
    return batched_gemm<bfloat16, float>(batch, A, B, C, kept_a ? kept_a : ta.data<bfloat16>(),
                                         kept_b ? kept_b : tb.data<bfloat16>(), out.t.data<float>(), accumulate,
                                         bias.defined() ? bias.data<float>() : nullptr);
  dispatch_float(out.t.dtype(), "matmul", [&](auto tag) {
    using scalar_t = decltype(tag);
    batched_gemm<scalar_t, scalar_t>(batch, A, B, C, ta.data<scalar_t>(), tb.data<scalar_t>(),
                                     out.t.data<scalar_t>(), accumulate,
                                     bias.defined() ? bias.data<scalar_t>() : nullptr);
  });
}

}  // namespace

namespace detail {
Tensor bf16_operand(const Tensor& x) {
  if (x.dtype() == DType::bf16) return x;
  const Tensor d = x.dim() > 0 && x.strides().back() == 1 ? x : dense(x);
  Tensor out = empty(d.shape(), DType::bf16);
  const int lead = std::max(d.dim() - 1, 0);
  const int64_t cols = d.dim() > 0 ? d.shape().back() : 1;
  if (cols > 0)
    round_rows(d.data<float>(), std::span(d.shape().begin(), lead), std::span(d.strides().begin(), lead), cols,
               out.data<bfloat16>());
  return out;
}
}  // namespace detail

namespace {

// matmul, linear: a and b (x and weight) floating, of one dtype.
void check_operands(std::string_view op, const Tensor& a, const Tensor& b) {
  detail::check_same_dtype(op, a, b);
  detail::check_floating(op, a, "input");
}

struct MatmulSaved {
  AutocastInput a, b;
  static constexpr std::tuple fields{saved_field("a", &MatmulSaved::a), saved_field("b", &MatmulSaved::b)};
};
struct LinearSaved {
  AutocastInput x;  // (..., IC)
  Tensor weight;  // (OC, IC)
  static constexpr std::tuple fields{saved_field("x", &LinearSaved::x), saved_field("weight", &LinearSaved::weight)};
};

// The batch dims of a matmul: broadcast of a's and b's leading dims.
Shape matmul_batch(const Tensor& a, const Tensor& b) {
  auto lead = [](const Tensor& t) { return Shape(std::span(t.shape().begin(), std::max(t.dim() - 2, 0))); };
  try {
    return broadcast_shapes(lead(a), lead(b), "matmul");
  } catch (const ShapeError&) {
    throw ShapeError(fmt::format("matmul: batch dims of {} and {} do not broadcast", a.shape(), b.shape()));
  }
}

// out = a @ b, or out += a @ b when accumulate, or + bias (contiguous), with
// torch.matmul's shapes.
void product_into(const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate, const Tensor& bias = Tensor()) {
  const bool a_rows = a.dim() >= 2, b_cols = b.dim() >= 2;
  run_product(matmul_batch(a, b), {a, a_rows, true}, {b, true, b_cols}, {out, a_rows, b_cols}, false, false,
              accumulate, bias);
}

// Under autocast, the bfloat16 copy of operand x that a node recording the
// product now keeps in its place (AutocastInput), made ahead so that the
// forward's GEMM reads it too; undefined where the node keeps x itself: a
// leaf (a parameter, whose copy autocast keeps per version, or data that its
// caller holds anyway).
template <class... Ts>
Tensor kept_copy(const Tensor& x, const Ts&... inputs) {
  if (!autocast_enabled() || x.dtype() != DType::f32 || x.is_leaf() || !may_record(inputs...))
    return Tensor();
  return detail::bf16_operand(x);
}

// The forward of matmul, and of linear as x @ weight^T (the transpose a GEMM
// flag, not a copy), into a new tensor of dtype (a and b may be their
// bfloat16 copies under autocast). A bias (N) goes into the GEMM (see gemm),
// so there is no separate bias pass.
Tensor product(std::string_view op, const Tensor& a, const Tensor& b, const Tensor& bias, DType dtype) {
  if (a.dim() == 0 || b.dim() == 0)
    throw ShapeError(
        fmt::format("{}: both arguments need at least 1 dimension, got {} and {}", op, a.shape(), b.shape()));
  const int64_t ka = a.shape()[a.dim() - 1], kb = b.shape()[b.dim() >= 2 ? b.dim() - 2 : 0];
  if (ka != kb) throw ShapeError(fmt::format("{}: cannot multiply {} by {}", op, a.shape(), b.shape()));
  Shape out_shape = matmul_batch(a, b);
  if (a.dim() >= 2) out_shape.push_back(a.shape()[a.dim() - 2]);
  if (b.dim() >= 2) out_shape.push_back(b.shape().back());
  Tensor out = empty(out_shape, dtype);
  product_into(a, b, out, false, bias.defined() ? bias.contiguous() : Tensor());
  return out;
}

// grad_a = g @ b^T, grad_b = a^T @ g, each summed over the batch dims its
// input was broadcast along (the sum happens inside the GEMMs). a and b may
// be the bfloat16 copies the node kept; under autocast g is rounded once for
// both GEMMs.
void product_backward(const Node& n, const Tensor& a, const Tensor& b, const Tensor& g_out, std::span<Tensor> gin) {
  const Tensor g = autocast_enabled() && g_out.dtype() == DType::f32 ? detail::bf16_operand(g_out) : g_out;
  const Shape batch = matmul_batch(a, b);
  const bool a_rows = a.dim() >= 2, b_cols = b.dim() >= 2;
  const int64_t M = a_rows ? a.shape()[a.dim() - 2] : 1, N = b_cols ? b.shape().back() : 1;
  if (n.needs(0)) {
    gin[0] = gradient_like(a, N, n.edges[0].dtype);
    run_product(batch, {g, a_rows, b_cols}, {b, true, b_cols}, {gin[0], a_rows, true}, false, true, false);
  }
  if (n.needs(1)) {
    gin[1] = gradient_like(b, M, n.edges[1].dtype);
    run_product(batch, {a, a_rows, true}, {g, a_rows, b_cols}, {gin[1], true, b_cols}, true, false, false);
  }
}

}  // namespace

using detail::tangent_add;

// ============================ matmul ============================
// Recorded (create_graph): the same products as matmul ops. A 1-D a (K) acts
// as (1,K) and a 1-D b (K) as (K,1), g gets the dims they dropped back, and
// sum_to reduces each product to its input's shape (the broadcast batch dims).
static void matmul_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor a = n.saved_tensor(&MatmulSaved::a), b = n.saved_tensor(&MatmulSaved::b);
  const Tensor a2 = a.dim() == 1 ? unsqueeze(a, 0) : a, b2 = b.dim() == 1 ? unsqueeze(b, 1) : b;
  Tensor g2 = b.dim() == 1 ? unsqueeze(g, g.dim()) : g;  // (batch..., M, N)
  if (a.dim() == 1) g2 = unsqueeze(g2, g2.dim() - 1);
  if (n.needs(0)) gin[0] = reshape(sum_to(matmul(g2, transpose(b2, -1, -2)), a2.shape()), a.shape());
  if (n.needs(1)) gin[1] = reshape(sum_to(matmul(transpose(a2, -1, -2), g2), b2.shape()), b.shape());
}

static void matmul_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  product_backward(n, n.saved_tensor(&MatmulSaved::a), n.saved_tensor(&MatmulSaved::b), g, gin);
}
// ta @ b + a @ tb: two GEMMs of the forward's size, in ops as recorded.
static void matmul_tangent_recorded(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  out[0] = tangent_add(t[0].defined() ? matmul(t[0], n.saved_tensor(&MatmulSaved::b)) : Tensor(),
                       t[1].defined() ? matmul(n.saved_tensor(&MatmulSaved::a), t[1]) : Tensor());
}
// Not recorded, with both tangents the second GEMM accumulates into the
// first's output (beta 1): no temporary, no add pass.
static void matmul_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  if (!t[0].defined() || !t[1].defined()) return matmul_tangent_recorded(n, t, out);
  out[0] = matmul(t[0], n.saved_tensor(&MatmulSaved::b));
  product_into(n.saved_tensor(&MatmulSaved::a), t[1], out[0], true);
}
static const OpDef matmul_op({
    .name = "matmul",
    .arity = 2,
    .signature = "matmul(a, b) -> a @ b (torch.matmul semantics)",
    .saves = saves_of<MatmulSaved>(),
    .backward = matmul_backward,
    .recorded_backward = matmul_backward_recorded,
    .tangent = matmul_tangent,
    .recorded_tangent = matmul_tangent_recorded,
    .samples = [] {
      using samples::uniform;
      auto fn = [](auto& x) { return matmul(x[0], x[1]); };
      std::vector<OpSample> out;
      uint64_t seed = 301;
      for (auto [what, sa, sb] : std::vector<std::tuple<const char*, Shape, Shape>>{
               {"2-D", {3, 4}, {4, 5}}, {"batched", {2, 3, 4}, {2, 4, 5}}, {"broadcast batch", {2, 1, 3, 4}, {3, 4, 2}},
               {"batched @ 2-D", {2, 3, 4}, {4, 5}}, {"2-D @ batched", {3, 4}, {2, 4, 5}}, {"1-D @ 1-D", {4}, {4}},
               {"1-D @ 2-D", {4}, {4, 3}}, {"2-D @ 1-D", {3, 4}, {4}}, {"1-D @ batched", {4}, {2, 4, 3}}})
        out.push_back({fmt::format("{} {}@{}", what, sa, sb), {uniform(sa, seed++), uniform(sb, seed++)}, fn});
      out.push_back({"transposed views (4,3)^T @ (5,4)^T", {uniform({4, 3}, 319), uniform({5, 4}, 320)},
                     [](auto& x) { return matmul(transpose(x[0], 0, 1), transpose(x[1], 0, 1)); }});
      out.push_back({"non-contiguous (3,4)@(4,2)", {samples::strided({3, 4}, 321), samples::strided({4, 2}, 322)}, fn});
      return out;
    },
});

Tensor matmul(const Tensor& a, const Tensor& b) {
  ProfileScope prof(matmul_op.name);
  check_operands(matmul_op.name, a, b);
  const Tensor ab = kept_copy(a, a, b), bb = kept_copy(b, a, b);
  Tensor out = product(matmul_op.name, ab.defined() ? ab : a, bb.defined() ? bb : b, Tensor(), a.dtype());
  if (Node* n = record(matmul_op, out, a, b)) n->save(MatmulSaved{.a = {a, ab}, .b = {b, bb}});
  return out;
}

// ============================ linear ============================
// out (..., out) = x (..., in) @ weight(out, in)^T + bias: matmul's kernels on
// x and weight^T. Recorded: grad_x = g @ weight and grad_weight = g^T @ x over
// the batch flattened into rows, as matmul ops.
static void linear_backward_recorded(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const Tensor x = n.saved_tensor(&LinearSaved::x), w = n.saved_tensor(&LinearSaved::weight);
  if (n.needs(2)) gin[2] = sum_to(g, n.edges[2].shape).contiguous();
  if (n.needs(0)) gin[0] = matmul(g, w);  // (..., out) @ (out, in)
  if (n.needs(1)) {                       // (out, rows) @ (rows, in)
    const Tensor g_rows = reshape(g, {-1, w.shape()[0]}), x_rows = reshape(x, {-1, w.shape()[1]});
    gin[1] = matmul(transpose(g_rows, 0, 1), x_rows);
  }
}

// Under autocast, with the bias's gradient wanted and a GEMM to read g, one
// pass over g (..., out) rounds it and sums its rows (the sum in sum_to's
// order, so the same bits): g is read once, not once for each.
static void linear_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  Tensor gemm_g = g;
  if (n.needs(2) && (n.needs(0) || n.needs(1)) && autocast_enabled() && g.dtype() == DType::f32 && g.dim() > 0 &&
      g.is_contiguous()) {
    gin[2] = empty(n.edges[2].shape, DType::f32);
    gemm_g = empty(g.shape(), DType::bf16);
    const int64_t cols = g.shape().back(), rows = g.numel() / std::max<int64_t>(cols, 1);
    const float* src = g.data<float>();
    bfloat16* rounded = gemm_g.data<bfloat16>();
    float* sums = gin[2].data<float>();
    parallel_for(cols, detail::kElementwiseGrain / std::max<int64_t>(rows, 1) + 1, [&](int64_t c0, int64_t c1) {
      std::fill(sums + c0, sums + c1, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = src + r * cols;
        float_to_bf16(row + c0, rounded + r * cols + c0, c1 - c0);
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) sums[c] += row[c];
      }
    });
  } else if (n.needs(2)) {
    gin[2] = sum_to(g, n.edges[2].shape).contiguous();
  }
  product_backward(n, n.saved_tensor(&LinearSaved::x), n.saved_tensor(&LinearSaved::weight).transpose(0, 1), gemm_g,
                   gin);
  if (n.needs(1)) gin[1] = gin[1].transpose(0, 1);
}
// linear(tx, weight) + linear(x, tweight, tbias) (or tbias alone).
static void linear_tangent_recorded(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  const Tensor x = n.saved_tensor(&LinearSaved::x), w = n.saved_tensor(&LinearSaved::weight);
  const Tensor r = t[1].defined() ? linear(x, t[1], t[2]) : detail::broadcast_tangent(t[2], n.out_shape);
  out[0] = t[0].defined() ? tangent_add(linear(t[0], w), r) : r;
}
// Not recorded, with tx and tweight: the bias's tangent rides on the first
// GEMM, and the second accumulates into its output (beta 1).
static void linear_tangent(const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
  if (!t[0].defined() || !t[1].defined()) return linear_tangent_recorded(n, t, out);
  out[0] = linear(t[0], n.saved_tensor(&LinearSaved::weight), t[2]);
  product_into(n.saved_tensor(&LinearSaved::x), t[1].transpose(0, 1), out[0], true);
}
static const OpDef linear_op({
    .name = "linear",
    .arity = 3,
    .signature = "linear(x, weight, bias) -> x @ weight^T + bias",
    .saves = saves_of<LinearSaved>(),
    .backward = linear_backward,
    .recorded_backward = linear_backward_recorded,
    .tangent = linear_tangent,
    .recorded_tangent = linear_tangent_recorded,
    .samples = [] {
      using samples::uniform;
      auto fn = [](auto& x) { return linear(x[0], x[1], x.size() > 2 ? x[2] : Tensor()); };
      return std::vector<OpSample>{
          {"(2,3,4) with weight (5,4) and bias (5)", {uniform({2, 3, 4}, 331), uniform({5, 4}, 332), uniform({5}, 333)},
           fn},
          {"(3,4) without bias", {uniform({3, 4}, 334), uniform({5, 4}, 335)}, fn},
          {"1-D (4) with bias", {uniform({4}, 336), uniform({2, 4}, 337), uniform({2}, 338)}, fn},
          {"non-contiguous x, transposed weight view",
           {samples::strided({3, 4}, 339), uniform({4, 2}, 340), uniform({2}, 341)},
           [](auto& x) { return linear(x[0], transpose(x[1], 0, 1), x[2]); }},
      };
    },
});

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  const std::string_view op = linear_op.name;
  ProfileScope prof(op);
  check_operands(op, x, weight);
  if (weight.dim() != 2) throw ShapeError(fmt::format("{}: weight must be (out, in), got {}", op, weight.shape()));
  if (x.dim() == 0) throw ShapeError(fmt::format("{}: input must have at least 1 dimension, got ()", op));
  const int64_t in = weight.shape()[1], out_features = weight.shape()[0];
  if (x.shape().back() != in)
    throw ShapeError(fmt::format("{}: input {} has {} features, weight {} expects {}", op, x.shape(), x.shape().back(),
                                 weight.shape(), in));
  if (bias.defined()) {
    if (bias.dtype() != x.dtype())
      throw DTypeError(fmt::format("{}: bias is {}, input is {}", op, dtype_name(bias.dtype()), dtype_name(x.dtype())));
    if (!(bias.shape() == Shape{out_features}))
      throw ShapeError(fmt::format("{}: bias {} does not match weight {}: expected ({})", op, bias.shape(),
                                   weight.shape(), out_features));
  }
  const Tensor xb = kept_copy(x, x, weight, bias);
  Tensor out = product(op, xb.defined() ? xb : x, weight.transpose(0, 1), bias, x.dtype());
  if (Node* n = record(linear_op, out, x, weight, bias)) n->save(LinearSaved{.x = {x, xb}, .weight = weight});
  return out;
}

}  // namespace tg
