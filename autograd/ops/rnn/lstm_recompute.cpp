// lstm_recompute (see ../rnn_ops.h): its backward goes over chunks last first,
// rebuilds a chunk's gates (two GEMMs and a pointwise pass) and runs
// lstm_recurrence's backward kernel over it.
#include "autograd/ops/rnn_ops.h"

#include <cmath>

#include <fmt/format.h>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/rnn/lstm_kernels.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"
#include "autograd/profiler.h"
#include "autograd/tape.h"

namespace tg {
using detail::row_grain;
using namespace detail::rnn;

namespace {
// The inputs as given, the output (T+1,B,H), and the cell state entering
// each chunk (chunks,B,H): c0 (or zeros), then each chunk's last but the last.
struct LstmRecomputeSaved {
  Tensor x, w_ih, bias, w_hh, h0, c0, output, entering;
  static constexpr std::tuple fields{
      saved_field("x", &LstmRecomputeSaved::x),           saved_field("w_ih", &LstmRecomputeSaved::w_ih),
      saved_field("bias", &LstmRecomputeSaved::bias),     saved_field("w_hh", &LstmRecomputeSaved::w_hh),
      saved_field("h0", &LstmRecomputeSaved::h0),         saved_field("c0", &LstmRecomputeSaved::c0),
      saved_field("output", &LstmRecomputeSaved::output), saved_field("entering", &LstmRecomputeSaved::entering)};
};

// Steps per chunk: ceil(sqrt(T)) keeps a chunk's scratch (k,B,4H) and the
// saved states (T/k,B,H) small; at T = 4096, B = 8 a chunk's GEMMs have 512 rows.
int64_t chunk_steps(int64_t T) { return static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(T)))); }
}  // namespace

// a (n,B,4H) = bias + x_t W_ih^T for the n steps from t0; x (T,B,I), w_ih (4H,I), bias (4H) or nullptr.
template <class S>
static void project_chunk(const Dims& d, int64_t I, int64_t t0, int64_t n, const S* x, const S* w_ih, const S* bias,
                          S* a) {
  const int64_t rows = n * d.B, G = 4 * d.H;
  if (bias)
    for (int64_t r = 0; r < rows; ++r) std::copy_n(bias, G, a + r * G);
  gemm(false, true, rows, G, I, S(1), x + t0 * d.B * I, I, w_ih, I, S(bias ? 1 : 0), a, G);
}

// A chunk's gates (in place in a (n,B,4H)) and cell states cs (n,B,H) from its
// pre-activations and cin (B,H), batch rows [b0, b1), as lstm_forward_step.
template <class S>
static void chunk_cells(int64_t n, int64_t B, int64_t H, int64_t b0, int64_t b1, const S* cin, S* a, S* cs) {
  const int64_t G = 4 * H;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t t = 0; t < n; ++t) {
      S *ai = a + (t * B + b) * G, *af = ai + H, *ag = af + H, *ao = ag + H;
      const S* cp = t > 0 ? cs + ((t - 1) * B + b) * H : cin + b * H;
      S* c = cs + (t * B + b) * H;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        const S i = vsigmoid(ai[j]), f = vsigmoid(af[j]), g = vtanh(ag[j]), o = vsigmoid(ao[j]);
        ai[j] = i, af[j] = f, ag[j] = g, ao[j] = o;
        c[j] = i * g + f * cp[j];
      }
    }
}

// Recorded (create_graph): the layer rebuilt from differentiable ops and differentiated, as a checkpoint.
static Tensor lstm_from_ops(const Tensor& x, const Tensor& w_ih, const Tensor& bias, const Tensor& w_hh,
                            const Tensor& h0, const Tensor& c0) {
  const int64_t T = x.size(0), B = x.size(1), G = w_ih.size(0);
  Tensor xp = matmul(reshape(x, {T * B, x.size(2)}), transpose(w_ih, 0, 1));
  if (bias.defined()) xp = add(xp, bias);
  const Tensor out = lstm_recurrence(reshape(xp, {T, B, G}), w_hh, h0, c0);  // (2,T,B,H)
  return concat({select(out, 0, 0), narrow(select(out, 0, 1), 0, T - 1, 1)}, 0);
}

static void lstm_recompute_backward_recorded(const Node& n, const Tensor& grad_out, std::span<Tensor> gin) {
  // Under forward over reverse, linked like any forward at the level: the gradients carry tangents.
  detail::TangentsOnlySuspended linked;
  using Saved = LstmRecomputeSaved;
  const std::vector<Tensor> in{n.saved_tensor(&Saved::x),    n.saved_tensor(&Saved::w_ih), n.saved_tensor(&Saved::bias),
                               n.saved_tensor(&Saved::w_hh), n.saved_tensor(&Saved::h0),   n.saved_tensor(&Saved::c0)};
  std::vector<Tensor> wrt;
  std::vector<size_t> at;
  for (size_t k = 0; k < in.size(); ++k)
    if (n.needs(k)) {
      wrt.push_back(in[k]);
      at.push_back(k);
    }
  const Tensor out = lstm_from_ops(in[0], in[1], in[2], in[3], in[4], in[5]);
  const std::vector<Tensor> g =
      linked.grad({out}, wrt, {grad_out}, {.retain_graph = true, .create_graph = true, .allow_unused = true});
  for (size_t i = 0; i < at.size(); ++i) gin[at[i]] = g[i];
}

// Chunks last to first: rec (3,B,H) carries the gradients reaching h and c into the chunk before.
static void lstm_recompute_backward(const Node& n, const Tensor& grad_out, std::span<Tensor> gin) {
  using Saved = LstmRecomputeSaved;
  const auto ins = saved_contig(n, &Saved::x, &Saved::w_ih, &Saved::bias, &Saved::w_hh, &Saved::h0);
  const Tensor &x = ins[0], &w_ih = ins[1], &bias = ins[2], &w = ins[3], &h0 = ins[4];
  const Tensor out = n.saved_tensor(&Saved::output), entering = n.saved_tensor(&Saved::entering);
  const Dims d{out.size(0) - 1, out.size(1), out.size(2)};
  const int64_t B = d.B, H = d.H, G = 4 * H, I = x.size(2), K = chunk_steps(d.T), chunks = entering.size(0);
  const DType dt = out.dtype();
  const Tensor g = grad_out.contiguous();
  Tensor dx = n.needs(0) ? empty({d.T, B, I}, dt) : Tensor(), dw_ih = n.needs(1) ? zeros({G, I}, dt) : Tensor();
  Tensor db = n.needs(2) ? zeros({G}, dt) : Tensor(), dw = n.needs(3) ? zeros({G, H}, dt) : Tensor();
  Tensor dh0 = n.needs(4) ? empty({B, H}, dt) : Tensor(), dc0 = n.needs(5) ? empty({B, H}, dt) : Tensor();
  Tensor act = empty({K, B, G}, dt), cs = empty({K, B, H}, dt), gout = empty({2, K, B, H}, dt);
  Tensor dG = empty({K, B, G}, dt), rec = zeros({3, B, H}, dt);
  const Tensor ones = db.defined() ? full({K * B}, 1.0, dt) : Tensor();
  dispatch_float(dt, n.op->name, [&](auto tag) {
    using S = decltype(tag);
    const S *hs = out.data<S>(), *xs = x.data<S>(), *wi = w_ih.data<S>(), *wh = w.data<S>(), *gs = g.data<S>();
    S *a = act.data<S>(), *c = cs.data<S>(), *go = gout.data<S>(), *dg = dG.data<S>(), *carry = rec.data<S>();
    for (int64_t k = chunks; k-- > 0;) {
      const int64_t t0 = k * K, steps = std::min(K, d.T - t0), BH = B * H;
      const Dims dk{steps, B, H};
      const S* cin = entering.data<S>() + k * BH;
      project_chunk(d, I, t0, steps, xs, wi, ptr<S>(bias), a);
      add_previous_states_times(d, 4 * d.H, t0, steps, wh, hs, ptr<S>(h0), a);
      parallel_for(B, row_grain(steps * G, kGateGrain),
                   [&](int64_t b0, int64_t b1) { chunk_cells(steps, B, H, b0, b1, cin, a, c); });
      // [gh; gc] of the chunk (2,steps,B,H): c_t reaches the output only at the last step.
      std::copy_n(gs + t0 * BH, steps * BH, go);
      std::fill_n(go + steps * BH, steps * BH, S(0));
      if (k == chunks - 1) std::copy_n(gs + d.T * BH, BH, go + (2 * steps - 1) * BH);
      backward_by_parts(dk, 4, dt, [&](Part p, int64_t call) {
        lstm_backward_call(dk, p, call, go, static_cast<const S*>(nullptr), wh, cin, a, c, dg, carry,
                           k > 0 ? carry : ptr<S>(dh0), k > 0 ? nullptr : ptr<S>(dc0));
      });
      const int64_t rows = steps * B;
      if (dw.defined()) add_weight_grad(d, 4 * d.H, t0, steps, dg, hs, ptr<S>(h0), dw.data<S>());
      if (dw_ih.defined()) gemm(true, false, G, I, rows, S(1), dg, G, xs + t0 * B * I, I, S(1), dw_ih.data<S>(), I);
      if (db.defined()) gemm(true, false, G, 1, rows, S(1), dg, G, ones.data<S>(), 1, S(1), db.data<S>(), 1);
      if (dx.defined()) gemm(false, false, rows, I, G, S(1), dg, G, wi, I, S(0), dx.data<S>() + t0 * B * I, I);
    }
  });
  set_needed(n, gin, {dx, dw_ih, db, dw, dh0, dc0});
}

static const OpDef lstm_recompute_op({
    .name = "lstm_recompute",
    .arity = 6,
    .signature = "lstm_recompute(x (T,B,I), w_ih (4H,I), bias (4H), w_hh (4H,H), h0 (B,H), c0 (B,H)) -> (T+1,B,H) [h_t; c_{T-1}]",
    .saves = saves_of<LstmRecomputeSaved>(),
    .backward = lstm_recompute_backward,
    .recorded_backward = lstm_recompute_backward_recorded,
    .samples = [] {
      using samples::uniform;
      const int64_t B = 2, H = 3, I = 2, G = 4 * H;
      auto fn = [](const std::vector<Tensor>& v) {  // v = [x, w_ih, bias (unless 3 inputs), w_hh, h0, c0 (if 6)]
        const size_t w = v.size() == 3 ? 2 : 3;
        return lstm_recompute(v[0], v[1], w == 3 ? v[2] : Tensor(), v[w], v.size() == 6 ? v[4] : Tensor(),
                              v.size() == 6 ? v[5] : Tensor());
      };
      return std::vector<OpSample>{
          {"T=5 (chunks of 3 and 2) B=2 H=3 I=2, bias and initial state",
           {uniform({5, B, I}, 251, -2, 2), uniform({G, I}, 252), uniform({G}, 253), uniform({G, H}, 254),
            uniform({B, H}, 255), uniform({B, H}, 256)},
           fn},
          {"T=4 (chunks of 2), no bias, zero initial state, non-contiguous x",
           {samples::strided({4, B, I}, 257, -2, 2), uniform({G, I}, 258), uniform({G, H}, 259)},
           fn},
          {"one step",
           {uniform({1, B, I}, 260, -2, 2), uniform({G, I}, 261), uniform({G}, 262), uniform({G, H}, 263)},
           fn},
      };
    },
});

Tensor lstm_recompute(const Tensor& x_in, const Tensor& w_ih_in, const Tensor& bias_in, const Tensor& w_hh_in,
                      const Tensor& h0_in, const Tensor& c0_in) {
  ProfileScope prof(lstm_recompute_op.name);
  detail::check_defined(lstm_recompute_op.name, w_ih_in, "w_ih");
  const Dims d = check_recurrence(lstm_recompute_op.name, 4, x_in, w_hh_in, bias_in, h0_in, c0_in, w_ih_in);
  const auto ins = contig_all(x_in, w_ih_in, bias_in, w_hh_in, h0_in, c0_in);
  const Tensor &x = ins[0], &w_ih = ins[1], &bias = ins[2], &w = ins[3], &h0 = ins[4], &c0 = ins[5];
  const int64_t B = d.B, H = d.H, G = 4 * H, I = x.size(2), BH = B * H, K = chunk_steps(d.T);
  const int64_t chunks = (d.T + K - 1) / K;
  const DType dt = x.dtype();
  Tensor out = empty({d.T + 1, B, H}, dt), entering = empty({chunks, B, H}, dt);
  Tensor xp = empty({K, B, G}, dt), act = empty({K, B, G}, dt), cs = empty({K, B, H}, dt);
  dispatch_float(dt, lstm_recompute_op.name, [&](auto tag) {
    using S = decltype(tag);
    S *hs = out.data<S>(), *c = cs.data<S>();
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t t0 = k * K, steps = std::min(K, d.T - t0);
      const Dims dk{steps, B, H};
      S* cin = entering.data<S>() + k * BH;
      if (k > 0 || c0.defined())  // the last cell state of the chunk before (K steps), or c0
        std::copy_n(k > 0 ? c + (K - 1) * BH : c0.data<S>(), BH, cin);
      else
        std::fill_n(cin, BH, S(0));
      project_chunk(d, I, t0, steps, x.data<S>(), w_ih.data<S>(), ptr<S>(bias), xp.data<S>());
      const S* hin = t0 > 0 ? hs + (t0 - 1) * BH : ptr<S>(h0);
      forward_by_parts<S>(dk, 4, w, true, [&](Part p, int64_t t, const S* wu, S* z) {
        lstm_forward_step(dk, p, t, xp.data<S>(), wu, hin, cin, static_cast<const S*>(nullptr), z, act.data<S>(),
                          hs + t0 * BH, c);
      });
      if (k == chunks - 1) std::copy_n(c + (steps - 1) * BH, BH, hs + d.T * BH);
    }
  });
  if (Node* n = record(lstm_recompute_op, out, x_in, w_ih_in, bias_in, w_hh_in, h0_in, c0_in))
    n->save(LstmRecomputeSaved{.x = x_in, .w_ih = w_ih_in, .bias = bias_in, .w_hh = w_hh_in, .h0 = h0_in,
                               .c0 = c0_in, .output = out, .entering = entering});
  return out;
}

}  // namespace tg
