// custom_model — the README's example at more length: a model of your own with two
// submodules, trained for a few steps with AdamW, checkpointed and reloaded.
// It learns y = sin(x0) + x1^2 on random points.
#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "autograd/autograd.h"
#include "nn/nn.h"

using namespace tg;

// A module registers its parameters and submodules by name; named_parameters()
// then yields "fc1.weight", "fc1.bias", "fc2.weight", ... — the checkpoint keys.
struct TwoLayerNet : nn::Module {
  std::shared_ptr<nn::Linear> fc1, fc2;
  TwoLayerNet(int64_t in, int64_t hidden) : Module("TwoLayerNet") {
    fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{.in = in, .out = hidden}));
    fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{.in = hidden, .out = 1}));
  }
  // x (B, in) -> (B, 1)
  Tensor forward(const Tensor& x) { return fc2->forward(gelu(fc1->forward(x))); }
};

int main() {
  manual_seed(0);
  TwoLayerNet net(2, 32);
  fmt::print("{}\n{} parameters\n", net.str(), net.num_parameters());

  Generator gen(1);
  Tensor x = rand({256, 2}, DType::f32, &gen, -2.0, 2.0);
  // Targets are data, computed outside the graph: y = sin(x0) + x1^2, (256, 1).
  Tensor y = [&] {
    std::vector<float> v = x.to_vector<float>(), t(256);
    for (int64_t i = 0; i < 256; ++i) t[i] = std::sin(v[2 * i]) + v[2 * i + 1] * v[2 * i + 1];
    return from_vector(t, {256, 1});
  }();

  nn::AdamW opt(net.parameters(), {.lr = 1e-2});
  double first = 0, last = 0;
  for (int step = 0; step < 200; ++step) {
    Tensor loss = nn::mse_loss(net.forward(x), y);
    loss.backward();
    opt.step();
    opt.zero_grad();
    if (step == 0) first = loss.item();
    last = loss.item();
    if (step % 50 == 0) fmt::print("step {:3}  mse {:.4f}\n", step, loss.item());
  }
  fmt::print("mse {:.4f} -> {:.4f}\n", first, last);

  std::string path = (std::filesystem::temp_directory_path() / "custom_model.safetensors").string();
  nn::save(net, path);  // atomic: a temporary file, fsync, rename
  TwoLayerNet again(2, 32);
  nn::load(again, path);  // checks every name, dtype and shape
  NoGradGuard ng;
  double diff = max(abs(again.forward(x) - net.forward(x))).item();
  fmt::print("reloaded: max difference {}\n", diff);
  return last < 0.2 * first && diff == 0 ? 0 : 1;
}
