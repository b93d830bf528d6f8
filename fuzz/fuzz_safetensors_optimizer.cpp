// nn::load(Optimizer&) on any bytes, into Adam and into SGD with momentum over
// the same three parameters: a CheckpointError, or a state that the next
// step() runs on without fault (the values themselves, NaN included, are the
// file's business).
#include "autograd/autograd.h"
#include "fuzz/fuzz.h"
#include "nn/checkpoint.h"
#include "nn/optim/adam.h"
#include "nn/optim/sgd.h"

namespace {

// Parameters of shapes (2,3), (2) and () with gradients, so step() updates
// each one from the loaded state.
struct Params {
  std::vector<tg::Tensor> params{tg::zeros({2, 3}).requires_grad_(), tg::zeros({2}).requires_grad_(),
                                 tg::zeros({}).requires_grad_()};
  Params() {
    tg::Tensor loss = tg::zeros({});
    for (const auto& p : params) loss = tg::add(loss, tg::sum(tg::mul(p, p)));
    loss.backward();
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Params p;
  static tg::nn::Adam adam(p.params);
  static tg::nn::SGD sgd(p.params, tg::nn::SGDOptions{.lr = 0.1, .momentum = 0.9});
  const std::string path = tg::fuzz::write_input(data, size);
  for (tg::nn::Optimizer* opt : {static_cast<tg::nn::Optimizer*>(&adam), static_cast<tg::nn::Optimizer*>(&sgd)}) {
    if (!tg::fuzz::accepted([&] { tg::nn::load(*opt, path); })) continue;
    opt->step();
    for (const auto& [name, t] : opt->state_dict())
      tg::fuzz::require(t.is_contiguous(), "optimizer state is contiguous after a load and a step");
  }
  return 0;
}
