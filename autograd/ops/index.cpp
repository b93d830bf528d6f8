// Indexing: index_select / index_add / embedding (whole rows) and gather /
// scatter / scatter_add (one element per index position). A lookup's backward
// is a scatter-add loop over rows, not a one-hot product; every backward is
// the adjoint op of this file (index_select <-> index_add, gather <->
// scatter_add, scatter <-> itself and gather), differentiable to any order.
#include "autograd/ops/index.h"

#include <cstring>

#include "autograd/op.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"

namespace tg {
using detail::AxisView, detail::check_floating, samples::indices, samples::strided, samples::uniform;

namespace {

void check_index_dtype(std::string_view op, const Tensor& index) {
  detail::check_defined(op, index, "index tensor");
  if (index.dtype() != DType::i64)
    throw DTypeError(fmt::format("{}: index {} must be int64, got {}", op, index.shape(), dtype_name(index.dtype())));
}

// The samples' fixed int64 indices.
Tensor ids(const std::vector<int64_t>& v, const Shape& shape) { return from_vector(v, shape); }

// "(1,2)": the multi-index of the flat row-major position `flat` in shape.
std::string position(int64_t flat, const Shape& shape) {
  Shape idx = shape;
  for (int d = shape.size() - 1; d >= 0; --d) {
    idx[d] = flat % shape[d];  // a position exists: every size > 0
    flat /= shape[d];
  }
  return idx.str();
}

// Every index in [0, bound), else an IndexError naming the op, the value, its
// position and the bound; before any kernel, so kernels never see a bad index.
void check_bounds(std::string_view op, const Tensor& index, int64_t bound, const std::string& what) {
  Tensor ic = index.contiguous();
  const int64_t* p = ic.data<int64_t>();
  for (int64_t k = 0, n = ic.numel(); k < n; ++k)
    if (p[k] < 0 || p[k] >= bound)
      throw IndexError(fmt::format("{}: index {} at position {} is out of range for {} of size {}", op, p[k],
                                   position(k, index.shape()), what, bound));
}

// The checks every op that indexes x along axis starts with: a floating input
// of rank >= 1, an int64 index, every index in range. Returns the normalised axis.
int check_indexed(const char* op, const Tensor& x, int64_t axis, const Tensor& index) {
  check_floating(op, x, "input");
  check_index_dtype(op, index);
  if (x.dim() == 0) throw ShapeError(fmt::format("{}: input must have at least 1 dimension, got ()", op));
  const int ax = normalize_axis(axis, x.dim(), op);
  check_bounds(op, index, x.shape()[ax], fmt::format("axis {} of input {}", ax, x.shape()));
  return ax;
}

// x's shape with `axis` replaced by index's shape: index_select's output, index_add's src.
Shape selected_shape(Shape xs, int axis, const Shape& index_shape) {
  xs.erase(axis);
  for (int k = 0; k < index_shape.size(); ++k) xs.insert(axis + k, index_shape[k]);
  return xs;
}

// index_select and embedding: out (outer, J, inner) = x (outer, n, inner)
// rows at index (J of them, checked), row copies in parallel.
Tensor select_rows(std::string_view op, const Tensor& x, int axis, const Tensor& index) {
  Tensor out = empty(selected_shape(x.shape(), axis, index.shape()), x.dtype());
  const Tensor xc = detail::dense(x), ic = index.contiguous();
  const AxisView a = detail::axis_view(x.shape(), axis);
  const int64_t J = ic.numel();
  const int64_t* idx = ic.data<int64_t>();
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = xc.data<T>();
    T* po = out.data<T>();
    parallel_for(a.outer * J, detail::row_grain(a.inner), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t o = r / J, j = r % J;
        std::memcpy(po + r * a.inner, px + (o * a.n + idx[j]) * a.inner, sizeof(T) * a.inner);
      }
    });
  });
  return out;
}

// f(a, b) for every position p of `index` (checked to fit): the element offsets
// of base_a at p with coordinate index[p] on `axis` and of base_b at p.
template <class F>
void for_index(const Tensor& base_a, int axis, const Tensor& base_b, const Tensor& index, bool parallel, F f) {
  Shape sa = base_a.strides();
  const int64_t axis_stride = sa[axis];
  sa[axis] = 0;
  Tensor va = make_view(base_a, index.shape(), sa, base_a.offset());
  Tensor vb = make_view(base_b, index.shape(), base_b.strides(), base_b.offset());
  auto L = detail::make_loop<3>(index.shape(), {&va, &vb, &index});
  const int64_t* pi = index.data<int64_t>();
  auto run = [&](const std::array<int64_t, 3>& off, const std::array<int64_t, 3>& s, int64_t n) {
    for (int64_t k = 0; k < n; ++k) f(off[0] + k * s[0] + pi[off[2] + k * s[2]] * axis_stride, off[1] + k * s[1]);
  };
  if (parallel)
    detail::for_each_run<3>(L, run);
  else
    detail::run_range<3>(L, 0, L.numel, run);
}

// gather/scatter shape rules (torch's): index has x's rank, and fits inside x
// on every dim but `axis`, and inside src (when given) on every dim.
void check_gather_shapes(std::string_view op, const Tensor& x, int axis, const Tensor& index, const Tensor* src) {
  if (index.dim() != x.dim())
    throw ShapeError(fmt::format("{}: index {} must have the rank of the input {}", op, index.shape(), x.shape()));
  if (src && src->dim() != x.dim())
    throw ShapeError(fmt::format("{}: src {} must have the rank of the input {}", op, src->shape(), x.shape()));
  for (int d = 0; d < x.dim(); ++d)
    for (const Tensor* t : {&x, src})
      if (t && (t == src || d != axis) && index.shape()[d] > t->shape()[d])
        throw ShapeError(fmt::format("{}: index {} is larger than {} {} on axis {}", op, index.shape(),
                                     t == src ? "src" : "the input", t->shape(), d));
}

// The gradient of src in scatter/scatter_add: g gathered at index, padded
// with zeros up to src's shape where the index does not reach.
Tensor scatter_src_grad(const Tensor& g, int axis, const Tensor& index, const Shape& src_shape) {
  const Tensor gs = gather(g, axis, index);
  if (index.shape() == src_shape) return gs;
  std::vector<int64_t> pads;  // innermost axis first, as pad() wants
  for (int d = src_shape.size() - 1; d >= 0; --d) {
    pads.push_back(0);
    pads.push_back(src_shape[d] - index.shape()[d]);
  }
  return pad(gs, pads);
}

// index_select, index_add, gather, scatter, scatter_add: the axis indexed
// (normalised); embedding: the row that gets no gradient (-1: none).
struct IndexAttrs {
  int64_t axis;
};
struct EmbeddingAttrs {
  int64_t padding_idx;
};
// Every op here saves its index tensor (the ids, for embedding), and only that.
struct IndexSaved {
  Tensor index;  // int64
  static constexpr std::tuple fields{saved_field("index", &IndexSaved::index)};
};
// Records out's node (if any) with its attrs and the index it read.
template <class Attrs, class... Inputs>
void record_indexed(const OpDef& op, Tensor& out, Attrs attrs, const Tensor& index, const Inputs&... inputs) {
  if (Node* n = record(op, out, inputs...)) {
    n->attrs<Attrs>() = attrs;
    n->save(IndexSaved{.index = index});
  }
}
int axis_of(const Node& n) { return static_cast<int>(n.attrs<IndexAttrs>().axis); }
Tensor index_of(const Node& n) { return n.saved_tensor(&IndexSaved::index); }

}  // namespace

// ============================ index_select ============================
static void index_select_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = index_add(zeros(n.edges[0].shape, g.dtype()), axis_of(n), index_of(n), g);
}
static const OpDef index_select_op({
    .name = "index_select",
    .arity = 2,
    .signature = "index_select(x, axis, index) -> x's rows at index",
    .saves = saves_of<IndexSaved>(),
    .backward = index_select_backward,
    .samples = [] {
      return std::vector<OpSample>{
          {"axis 0 of (5,3), index (4) with repeats",
           {uniform({5, 3}, 401), ids({4, 0, 4, 2}, {4})},
           [](auto& x) { return index_select(x[0], 0, x[1]); }},
          {"axis 1 of (2,5,3), index (2,2)",
           {uniform({2, 5, 3}, 402), indices({2, 2}, 5, 403)},
           [](auto& x) { return index_select(x[0], 1, x[1]); }},
          {"axis -1 of non-contiguous (3,4)",
           {strided({3, 4}, 404), indices({3}, 4, 405)},
           [](auto& x) { return index_select(x[0], -1, x[1]); }},
      };
    },
});
Tensor index_select(const Tensor& x, int64_t axis, const Tensor& index) {
  ProfileScope prof(index_select_op.name);
  const int ax = check_indexed("index_select", x, axis, index);
  Tensor out = select_rows(index_select_op.name, x, ax, index);
  record_indexed(index_select_op, out, IndexAttrs{ax}, index, x, index);
  return out;
}

// ============================ index_add ============================
// index_select's adjoint: each is the other's backward.
static void index_add_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = g;
  if (n.needs(2)) gin[2] = index_select(g, axis_of(n), index_of(n));
}
static const OpDef index_add_op({
    .name = "index_add",
    .arity = 3,
    .signature = "index_add(x, axis, index, src) -> x with src's rows added at index",
    .saves = saves_of<IndexSaved>(),
    .backward = index_add_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = t[0];  // x's tangent, where src's is zero
      if (t[2].defined())
        out[0] = index_add(t[0].defined() ? t[0] : zeros(n.edges[0].shape, n.out_dtype), axis_of(n), index_of(n),
                           t[2]);
    },
    .samples = [] {
      return std::vector<OpSample>{
          {"axis 0 of (5,3), index (4) with repeats, src (4,3)",
           {uniform({5, 3}, 451), ids({4, 0, 4, 2}, {4}), uniform({4, 3}, 452)},
           [](auto& x) { return index_add(x[0], 0, x[1], x[2]); }},
          {"axis 1 of (2,5,3), index (2,2), non-contiguous src (2,2,2,3)",
           {uniform({2, 5, 3}, 453), indices({2, 2}, 5, 454), strided({2, 2, 2, 3}, 455)},
           [](auto& x) { return index_add(x[0], 1, x[1], x[2]); }},
          {"axis -1 of non-contiguous (3,4), index (3)",
           {strided({3, 4}, 456), indices({3}, 4, 457), uniform({3, 3}, 458)},
           [](auto& x) { return index_add(x[0], -1, x[1], x[2]); }},
      };
    },
});
Tensor index_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  const std::string_view op = index_add_op.name;
  ProfileScope prof(op);
  const int ax = check_indexed("index_add", x, axis, index);
  check_floating(op, src, "src");
  detail::check_same_dtype(op, x, src);
  const Shape want = selected_shape(x.shape(), ax, index.shape());
  if (!(src.shape() == want))
    throw ShapeError(fmt::format("{}: src {} must be {} (input {} with axis {} replaced by index {})", op,
                                 src.shape(), want, x.shape(), ax, index.shape()));
  Tensor out = empty(x.shape(), x.dtype()), sc, ic;
  {
    NoGradGuard ng;  // the op records itself
    out.copy_(x);
    sc = src.contiguous();
    ic = index.contiguous();
  }
  // out (outer, n, inner) += src (outer, J, inner) rows into index[J].
  // Repeated indices add up, so threads split the columns (each owns a
  // column range of every row), never the rows.
  const AxisView a = detail::axis_view(x.shape(), ax);
  const int64_t J = ic.numel();
  const int64_t* idx = ic.data<int64_t>();
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    T* po = out.data<T>();
    const T* ps = sc.data<T>();
    const int64_t grain = std::max<int64_t>(64, detail::row_grain(a.outer * J));
    parallel_for(a.inner, grain, [&](int64_t c0, int64_t c1) {
      for (int64_t o = 0; o < a.outer; ++o)
        for (int64_t j = 0; j < J; ++j) {
          T* dst = po + (o * a.n + idx[j]) * a.inner;
          const T* s = ps + (o * J + j) * a.inner;
          for (int64_t c = c0; c < c1; ++c) dst[c] += s[c];
        }
    });
  });
  record_indexed(index_add_op, out, IndexAttrs{ax}, ic, x, index, src);
  return out;
}

// ============================ embedding ============================
// The padding row is constant: its gradient and its tangent are 0, chosen by
// where() (not a product with a mask, which would keep a NaN there).
static Tensor without_padding_row(const Node& n, const Tensor& w) {
  const int64_t padding_idx = n.attrs<EmbeddingAttrs>().padding_idx;
  if (padding_idx < 0) return w;
  Tensor padding = zeros({w.shape()[0], 1}, DType::i64);
  padding.select(0, padding_idx).fill_(1.0);
  return where(padding, zeros({}, w.dtype()), w);
}
// index_add's: the weight's rows that the ids read get g's rows added.
static void embedding_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = without_padding_row(n, index_add(zeros(n.edges[0].shape, g.dtype()), 0, index_of(n), g));
}
static const OpDef embedding_op({
    .name = "embedding",
    .arity = 2,
    .signature = "embedding(weight (V,C), ids, padding_idx) -> (..., C)",
    .saves = saves_of<IndexSaved>(),
    .backward = embedding_backward,
    .tangent = [](const Node& n, std::span<const Tensor> t, std::span<Tensor> out) {
      out[0] = embedding(without_padding_row(n, t[0]), index_of(n));
    },
    .samples = [] {
      return std::vector<OpSample>{
          {"weight (6,3), ids (2,3)",
           {uniform({6, 3}, 411), indices({2, 3}, 6, 412)},
           [](auto& x) { return embedding(x[0], x[1]); }},
          {"ids with repeats (5)",
           {uniform({4, 2}, 413), ids({1, 3, 1, 1, 0}, {5})},
           [](auto& x) { return embedding(x[0], x[1]); }},
          // Forward reads the padding row too, so the sample's ids avoid it (the
          // zero padding gradient is tested directly in tests/test_index.cpp).
          {"padding_idx 5, non-contiguous weight",
           {strided({6, 3}, 414), indices({4}, 5, 415)},
           [](auto& x) { return embedding(x[0], x[1], 5); }},
      };
    },
});
Tensor embedding(const Tensor& weight, const Tensor& ids, int64_t padding_idx) {
  const std::string_view op = embedding_op.name;
  ProfileScope prof(op);
  check_floating(op, weight, "weight");
  check_index_dtype(op, ids);
  if (weight.dim() != 2) throw ShapeError(fmt::format("{}: weight must be (V,C), got {}", op, weight.shape()));
  const int64_t V = weight.shape()[0];
  if (padding_idx < -1 || padding_idx >= V)
    throw ValueError(fmt::format("{}: padding_idx {} is outside [0, {}) (or -1 for none)", op, padding_idx, V));
  check_bounds(op, ids, V, fmt::format("weight {}", weight.shape()));
  Tensor out = select_rows(op, weight, 0, ids);
  record_indexed(embedding_op, out, EmbeddingAttrs{padding_idx}, ids, weight, ids);
  return out;
}

// ============================ gather ============================
static void gather_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  gin[0] = scatter_add(zeros(n.edges[0].shape, g.dtype()), axis_of(n), index_of(n), g);
}
static const OpDef gather_op({
    .name = "gather",
    .arity = 2,
    .signature = "gather(x, axis, index) -> out[p] = x[p with index[p] on axis]",
    .saves = saves_of<IndexSaved>(),
    .backward = gather_backward,
    .samples = [] {
      return std::vector<OpSample>{
          {"axis 1 of (3,4), index (3,2)",
           {uniform({3, 4}, 421), indices({3, 2}, 4, 422)},
           [](auto& x) { return gather(x[0], 1, x[1]); }},
          {"axis 0 of (3,4), index (5,2) smaller on axis 1",
           {uniform({3, 4}, 423), indices({5, 2}, 3, 424)},
           [](auto& x) { return gather(x[0], 0, x[1]); }},
          {"axis -1 of non-contiguous (2,3,4)",
           {strided({2, 3, 4}, 425), indices({2, 3, 3}, 4, 426)},
           [](auto& x) { return gather(x[0], -1, x[1]); }},
      };
    },
});
Tensor gather(const Tensor& x, int64_t axis, const Tensor& index) {
  const std::string_view op = gather_op.name;
  ProfileScope prof(op);
  const int ax = check_indexed("gather", x, axis, index);
  check_gather_shapes(op, x, ax, index, nullptr);
  Tensor out = empty(index.shape(), x.dtype());
  dispatch_float(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* po = out.data<T>();
    for_index(x, ax, out, index, true, [&](int64_t a, int64_t b) { po[b] = px[a]; });
  });
  record_indexed(gather_op, out, IndexAttrs{ax}, index, x, index);
  return out;
}

// ============================ scatter / scatter_add ============================
// Overwritten positions take no gradient from x (g with zeros scattered
// there); src gets g gathered there. Tangents are derived from the backwards.
static void scatter_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  const int ax = axis_of(n);
  if (n.needs(0)) gin[0] = scatter(g, ax, index_of(n), zeros(index_of(n).shape(), g.dtype()));
  if (n.needs(2)) gin[2] = scatter_src_grad(g, ax, index_of(n), n.edges[2].shape);
}
static const OpDef scatter_op({
    .name = "scatter",
    .arity = 3,
    .signature = "scatter(x, axis, index, src) -> x with src written at index",
    .saves = saves_of<IndexSaved>(),
    .backward = scatter_backward,
    .samples = [] {
      // Indices distinct within each slice: with repeats, which src element
      // lands (and so gets the gradient) is arbitrary, as in PyTorch.
      return std::vector<OpSample>{
          {"axis 1 of (3,4), index (3,2), src (3,3)",
           {uniform({3, 4}, 431), ids({0, 2, 3, 1, 1, 0}, {3, 2}), uniform({3, 3}, 432)},
           [](auto& x) { return scatter(x[0], 1, x[1], x[2]); }},
          {"axis 0 of non-contiguous (3,2)",
           {strided({3, 2}, 433), ids({2, 0}, {1, 2}), uniform({2, 2}, 434)},
           [](auto& x) { return scatter(x[0], 0, x[1], x[2]); }},
      };
    },
});
static void scatter_add_backward(const Node& n, const Tensor& g, std::span<Tensor> gin) {
  if (n.needs(0)) gin[0] = g.clone();
  if (n.needs(2)) gin[2] = scatter_src_grad(g, axis_of(n), index_of(n), n.edges[2].shape);
}
static const OpDef scatter_add_op({
    .name = "scatter_add",
    .arity = 3,
    .signature = "scatter_add(x, axis, index, src) -> x with src added at index",
    .saves = saves_of<IndexSaved>(),
    .backward = scatter_add_backward,
    .samples = [] {
      return std::vector<OpSample>{
          {"axis 1 of (3,4), repeated index (3,2)",
           {uniform({3, 4}, 441), ids({0, 0, 3, 1, 2, 2}, {3, 2}), uniform({3, 2}, 442)},
           [](auto& x) { return scatter_add(x[0], 1, x[1], x[2]); }},
          {"axis 0 of (4,3), index (6,2), non-contiguous src",
           {uniform({4, 3}, 443), indices({6, 2}, 4, 444), strided({6, 3}, 445)},
           [](auto& x) { return scatter_add(x[0], 0, x[1], x[2]); }},
      };
    },
});
// scatter (Add = false) and scatter_add: out = a copy of x with src written
// or added at index, serially, as repeated indices write the same element.
template <bool Add>
static Tensor scatter_forward(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  const OpDef& op = Add ? scatter_add_op : scatter_op;
  ProfileScope prof(op.name);
  const int ax = check_indexed(Add ? "scatter_add" : "scatter", x, axis, index);
  check_floating(op.name, src, "src");
  detail::check_same_dtype(op.name, x, src);
  check_gather_shapes(op.name, x, ax, index, &src);
  Tensor out = empty(x.shape(), x.dtype());
  dispatch_float(x.dtype(), op.name, [&](auto tag) {
    using T = decltype(tag);
    detail::map1<T, T>(out, x, [](T v) { return v; });
    T* po = out.data<T>();
    const T* ps = src.data<T>();
    for_index(out, ax, src, index, false, [&](int64_t a, int64_t b) {
      if constexpr (Add)
        po[a] += ps[b];
      else
        po[a] = ps[b];
    });
  });
  record_indexed(op, out, IndexAttrs{ax}, index, x, index, src);
  return out;
}
Tensor scatter(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  return scatter_forward<false>(x, axis, index, src);
}
Tensor scatter_add(const Tensor& x, int64_t axis, const Tensor& index, const Tensor& src) {
  return scatter_forward<true>(x, axis, index, src);
}

// ============================ one_hot ============================
Tensor one_hot(const Tensor& ids, int64_t num_classes, DType dtype) {
  ProfileScope prof("one_hot");
  check_index_dtype("one_hot", ids);
  if (num_classes <= 0) throw ValueError(fmt::format("one_hot: num_classes must be positive, got {}", num_classes));
  check_bounds("one_hot", ids, num_classes, "num_classes");
  Shape out_shape = ids.shape();
  out_shape.push_back(num_classes);
  Tensor out = zeros(out_shape, dtype);
  Tensor ic = ids.contiguous();
  const int64_t* pi = ic.data<int64_t>();
  TG_DISPATCH_ALL(dtype, "one_hot", [&] {
    scalar_t* po = out.data<scalar_t>();
    for (int64_t k = 0, n = ic.numel(); k < n; ++k) po[k * num_classes + pi[k]] = scalar_t(1);
  });
  return out;
}

}  // namespace tg
