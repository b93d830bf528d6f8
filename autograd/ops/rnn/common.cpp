// The fused recurrences' shared checks, recorded-backward pieces and samples (see common.h).
#include "autograd/ops/rnn/common.h"

#include <fmt/format.h>

#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/rnn_ops.h"
#include "autograd/ops/samples.h"
#include "autograd/ops/shape.h"
#include "autograd/ops/view.h"

namespace tg::detail::rnn {

Dims check_recurrence(std::string_view op, int64_t gates, const Tensor& xp, const Tensor& w_hh, const Tensor& b_hh,
                      const Tensor& h0, const Tensor& c0, const Tensor& w_ih) {
  const bool in = w_ih.defined();  // lstm_recompute: xp is the input x (T,B,I), b_hh the bias
  const char* x = in ? "x" : "xp";
  detail::check_floating(op, xp, x);
  detail::check_defined(op, w_hh, "w_hh");
  if (w_hh.dim() != 2 || w_hh.size(0) != gates * w_hh.size(1))
    throw ShapeError(fmt::format("{}: w_hh {} must be ({}H,H)", op, w_hh.shape(), gates));
  const int64_t H = w_hh.size(1), I = in && xp.dim() == 3 ? xp.size(2) : gates * H;
  if (xp.dim() != 3 || xp.size(2) != I)
    throw ShapeError(fmt::format("{}: {} {} must be (T,B,{}) for w_hh {}", op, x, xp.shape(),
                                 in ? "I" : std::to_string(I), w_hh.shape()));
  const int64_t T = xp.size(0), B = xp.size(1);
  if (T < 1) throw ShapeError(fmt::format("{}: {} {} has no time step (T >= 1)", op, x, xp.shape()));
  auto check = [&](const Tensor& t, const char* name, const Shape& want) {
    if (!t.defined()) return;
    check_same_dtypes(op, xp, x, {{&t, name}});
    if (!(t.shape() == want))
      throw ShapeError(fmt::format("{}: {} {} must be {} for {} {} and w_hh {}", op, name, t.shape(), want, x,
                                   xp.shape(), w_hh.shape()));
  };
  check(w_hh, "w_hh", w_hh.shape());
  check(w_ih, "w_ih", Shape{gates * H, I});
  check(b_hh, in ? "bias" : "b_hh", Shape{gates * H});
  check(h0, "h0", Shape{B, H});
  check(c0, "c0", Shape{B, H});
  return {T, B, H};
}

void check_same_dtypes(std::string_view op, const Tensor& first, const char* first_name,
                       std::initializer_list<std::pair<const Tensor*, const char*>> others) {
  for (auto [t, name] : others) {
    detail::check_defined(op, *t, name);
    if (t->dtype() != first.dtype())
      throw DTypeError(fmt::format("{}: {} is {}, {} is {}", op, name, dtype_name(t->dtype()), first_name,
                                   dtype_name(first.dtype())));
  }
}

Tensor previous_states(const Tensor& states, const Tensor& init) {
  const int64_t T = states.size(0), B = states.size(1), H = states.size(2);
  const Tensor first = reshape(init.defined() ? init : zeros({B, H}, states.dtype()), {1, B, H});
  return T == 1 ? first : concat({first, narrow(states, 0, 0, T - 1)}, 0);
}
Tensor into_previous_states(const Tensor& D, const Tensor& w) {
  const int64_t T = D.size(0), B = D.size(1), H = w.size(1);
  const Tensor last = zeros({1, B, H}, D.dtype());
  if (T == 1) return last;
  return concat({reshape(matmul(reshape(narrow(D, 0, 1, T - 1), {(T - 1) * B, D.size(2)}), w), {T - 1, B, H}), last},
                0);
}
Tensor sigmoid_slope(const Tensor& s) { return mul(s, rsub(1.0, s)); }
Tensor weight_grad_recorded(const Tensor& dG, const Tensor& hprev) {
  return matmul(transpose(reshape(dG, {-1, dG.size(2)}), 0, 1), reshape(hprev, {-1, hprev.size(2)}));
}
Tensor spread_mul(const Tensor& u, const Tensor& j) {
  const int64_t H = u.size(-1), Q = j.size(-1) / H;
  Shape us = u.shape(), js = u.shape();  // (...,1,H) and (...,Q,H)
  us.insert(us.size() - 1, 1);
  js.insert(js.size() - 1, Q);
  return reshape(mul(reshape(u, us), reshape(j, js)), j.shape());
}

std::vector<OpSample> recurrence_samples(int gates, bool bias_input, bool cell_state) {
  using samples::uniform;
  const int64_t T = 3, B = 2, H = 3, G = gates * H;
  // x = [xp, w_hh, then b_hh (GRU), h0, c0 (LSTM) as given]: the missing trailing ones are undefined.
  auto fn = [=](const std::vector<Tensor>& x) {
    auto at = [&](size_t k) { return k < x.size() ? x[k] : Tensor(); };
    if (cell_state) return lstm_recurrence(x[0], x[1], at(2), at(3));
    return bias_input ? gru_recurrence(x[0], x[1], at(2), at(3)) : rnn_tanh_recurrence(x[0], x[1], at(2));
  };
  std::vector<Tensor> with_state = {uniform({T, B, G}, 201, -2, 2), uniform({G, H}, 202)};
  std::vector<Tensor> zero_state = {samples::strided({T, B, G}, 203, -2, 2), uniform({G, H}, 204)};
  if (bias_input) {
    with_state.push_back(uniform({G}, 205));
    zero_state.push_back(uniform({G}, 206));
  }
  with_state.push_back(uniform({B, H}, 207));
  if (cell_state) with_state.push_back(uniform({B, H}, 208));
  return {{"T=3 B=2 H=3 with initial state", with_state, fn},
          {"zero initial state, non-contiguous xp", zero_state, fn},
          {"one step", {uniform({1, B, G}, 209, -2, 2), uniform({G, H}, 210)}, fn}};
}

}  // namespace tg::detail::rnn
