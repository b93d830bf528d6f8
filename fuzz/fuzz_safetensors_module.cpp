// nn::load(Module&) on any bytes, into a small module with nested names, a
// float parameter of each rank 1 and 2 and an int64 buffer: a CheckpointError
// and the module untouched, or the module holding the file's values.
#include <cstring>
#include <memory>

#include "fuzz/fuzz.h"
#include "nn/checkpoint.h"
#include "nn/layer_norm.h"
#include "nn/linear.h"

namespace {

// The state a seed file must match: fc.weight (2,3) f32, fc.bias (2) f32,
// norm.weight (2) f32, norm.bias (2) f32, seen (2) i64.
struct Net : tg::nn::Module {
  Net() : Module("Net") {
    fc = register_module("fc", std::make_shared<tg::nn::Linear>(tg::nn::LinearOptions{.in = 3, .out = 2}));
    norm = register_module("norm", std::make_shared<tg::nn::LayerNorm>(tg::nn::LayerNormOptions{.dim = 2}));
    seen = register_buffer("seen", tg::zeros({2}, tg::DType::i64));
  }
  std::shared_ptr<tg::nn::Linear> fc;
  std::shared_ptr<tg::nn::LayerNorm> norm;
  tg::Tensor seen;
};

// The module's values, bit for bit, to tell "untouched" from "loaded".
std::vector<std::vector<double>> snapshot(const Net& net) {
  std::vector<std::vector<double>> out;
  for (const auto& [name, t] : net.state_dict()) out.push_back(t.to(tg::DType::f64).to_vector<double>());
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Net net;
  const std::string path = tg::fuzz::write_input(data, size);
  const auto before = snapshot(net);
  if (!tg::fuzz::accepted([&] { tg::nn::load(net, path); })) {
    const auto after = snapshot(net);
    // NaN != NaN: compare the bits.
    bool same = before.size() == after.size();
    for (size_t i = 0; same && i < before.size(); ++i)
      same = before[i].size() == after[i].size() &&
             std::memcmp(before[i].data(), after[i].data(), before[i].size() * sizeof(double)) == 0;
    tg::fuzz::require(same, "a refused checkpoint leaves the module untouched");
    return 0;
  }
  const auto file = tg::nn::load_tensors(path);
  for (const auto& [name, t] : net.state_dict())
    tg::fuzz::require(t.shape() == file.at(name).shape(), "a loaded tensor keeps the file's shape");
  return 0;
}
