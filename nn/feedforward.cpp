#include "nn/feedforward.h"

namespace tg::nn {

Tensor activate(const Tensor& x, Activation a) {
  switch (a) {
    case Activation::relu: return relu(x);
    case Activation::gelu: return gelu(x);
    case Activation::gelu_tanh: return gelu(x, true);
  }
  throw ValueError("activate: unknown activation");
}

namespace {
const char* activation_name(Activation a) {
  switch (a) {
    case Activation::relu: return "relu";
    case Activation::gelu: return "gelu";
    case Activation::gelu_tanh: return "gelu_tanh";
  }
  return "?";
}
}  // namespace

FeedForward::FeedForward(const FeedForwardOptions& o) : UnaryModule("FeedForward"), options(o) {
  if (o.dim <= 0 || o.hidden_mult <= 0)
    throw ValueError(fmt::format("FeedForward: dim ({}) and hidden_mult ({}) must be positive", o.dim, o.hidden_mult));
  const int64_t hidden = o.hidden_mult * o.dim;
  fc = register_module("fc", std::make_shared<Linear>(LinearOptions{.in = o.dim, .out = hidden, .bias = o.bias}));
  proj = register_module("proj", std::make_shared<Linear>(LinearOptions{.in = hidden, .out = o.dim, .bias = o.bias}));
  drop = register_module("drop", std::make_shared<Dropout>(DropoutOptions{.p = o.dropout}));
}

Tensor FeedForward::forward(const Tensor& x) {
  ModulePathScope path(name());
  if (!x.defined()) throw ValueError("FeedForward: input is undefined");
  if (x.dim() < 1 || x.size(-1) != options.dim)
    throw ShapeError(fmt::format("FeedForward: input {} has {} features, expected {}", x.shape(),
                                 x.dim() < 1 ? 0 : x.size(-1), options.dim));
  return (*drop)((*proj)(activate((*fc)(x), options.activation)));  // through operator(): hooks see them
}

std::string FeedForward::extra_repr() const {
  return fmt::format("dim={}, hidden={}, activation={}, dropout={}", options.dim, options.hidden_mult * options.dim,
                     activation_name(options.activation), options.dropout);
}

}  // namespace tg::nn
