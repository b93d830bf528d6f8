// A model of one's own, in a project of one's own: tapegrad comes from an
// installed prefix (pkg-config or CMake) or from a meson subproject. A custom
// op (swish, one node with its own backward), a module that uses it, a few
// Adam steps fitting y = x^2 - tanh(3 x), and finite-difference checks in float64.
#include <tapegrad/tapegrad.h>

using namespace tg;

// swish(x) = x * sigmoid(x); d/dx = s + x s (1 - s), s = sigmoid(x). The
// backward is written with tensor ops, so it can be differentiated again.
// What forward saves for it: x.
struct SwishSaved {
  Tensor x;
  static constexpr std::tuple fields{saved_field("x", &SwishSaved::x)};
};
void swish_backward(const Node& node, const Tensor& grad_out, std::span<Tensor> grad_in) {
  const Tensor x = node.saved_tensor(&SwishSaved::x);
  const Tensor s = sigmoid(x);
  grad_in[0] = grad_out * (s + x * s * (1.0 - s));
}
const OpDef swish_op({.name = "swish", .arity = 1, .signature = "swish(x) -> x * sigmoid(x)",
                      .saves = saves_of<SwishSaved>(), .backward = swish_backward});

Tensor swish(const Tensor& x) {
  Tensor out;
  {
    NoGradGuard no_grad;  // one swish node instead of a sigmoid and a mul
    out = x * sigmoid(x);
  }
  if (Node* node = record(swish_op, out, x)) node->save(SwishSaved{.x = x});
  return out;
}

// x (B, 1) -> (B, 1)
struct SwishNet : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit SwishNet(int64_t hidden) : Module("SwishNet") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 1, .out = hidden}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{.in = hidden, .out = 1}));
  }
  Tensor forward(const Tensor& x) { return (*fc2)(swish((*fc1)(x))); }
};

int main() {
  fmt::print("tapegrad {} (headers {})\n", tg::version(), TAPEGRAD_VERSION);
  manual_seed(0);
  SwishNet net(16);
  Generator gen(1);
  Tensor x = rand({64, 1}, DType::f32, &gen, -1.0, 1.0);
  Tensor y = x * x - tanh(x * 3.0);  // data: x does not require grad, nothing is recorded

  nn::Adam opt(net.parameters(), {.lr = 3e-2});
  float first = 0, last = 0;
  for (int step = 0; step < 50; ++step) {
    Tensor loss = nn::mse_loss(net.forward(x), y);
    opt.zero_grad();
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item<float>();
  }
  fmt::print("mse {:.4f} -> {:.4f} after 50 Adam steps\n", first, last);

  Tensor x64 = samples::uniform({3, 4}, 2);  // float64, requires grad
  GradcheckReport op = gradcheck([](const std::vector<Tensor>& in) { return swish(in[0]); }, {x64});
  GradcheckReport model = nn::gradcheck_module(net, [&](const std::vector<Tensor>& in) { return net.forward(in[0]); },
                                               {samples::uniform({5, 1}, 3)});
  fmt::print("gradcheck swish: {}, gradcheck SwishNet: {}\n", op.passed ? "passed" : "FAILED",
             model.passed ? "passed" : "FAILED");
  if (!op.passed) fmt::print("{}", op.str());
  if (!model.passed) fmt::print("{}", model.str());
  return op.passed && model.passed && last < 0.5f * first ? 0 : 1;
}
