#pragma once
// nn::Module: the base of every layer and model, as in PyTorch.
//
//   struct Net : nn::Module {
//     std::shared_ptr<nn::Linear> fc1, fc2;
//     Net() : Module("Net") {
//       fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 4, .out = 8}));
//       fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 8, .out = 1}));
//     }
//     Tensor forward(const Tensor& x) { return (*fc2)(relu((*fc1)(x))); }
//   };
//
// Parameters, buffers and submodules are registered by name, so
// named_parameters() yields "blocks.0.attn.qkv.weight" — the names a
// checkpoint stores. Handles stay valid across to(dtype) and load (the data
// is replaced inside the tensor, see Tensor::set_data).
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "autograd/autograd.h"

namespace tg::nn {

class Module {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // --- registration (names must be unique within the module and contain no '.')
  Tensor register_parameter(const std::string& name, Tensor t);  // sets requires_grad
  Tensor register_buffer(const std::string& name, Tensor t);     // saved, not trained
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // --- traversal (registration order, depth first)
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  // Parameters and buffers by dotted name: what a checkpoint holds.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;

  // --- state
  virtual void train(bool on = true);  // propagates to children
  void eval() { train(false); }
  bool is_training() const { return training_; }
  void zero_grad();                    // drops every parameter's .grad
  int64_t num_parameters() const;
  // Converts every parameter and buffer (float ones) to dtype, in place.
  void to(DType dtype);
  // Tree printout with each parameter's shape, e.g.
  //   GPT(
  //     (wte): Embedding(weight (85,128))
  //     ...
  std::string str() const;
  // One-line summary of this module's own settings (overridden by layers).
  virtual std::string extra_repr() const { return {}; }

  // --- forward hooks (PyTorch's register_forward_pre_hook / register_forward_hook)
  // A pre-hook sees the inputs before forward; a hook sees inputs and output
  // and may return a replacement output (an undefined return keeps it).
  // They run on every call made through operator() (see forward_with_hooks).
  using ForwardPreHook = std::function<void(Module& m, std::span<const Tensor> inputs)>;
  using ForwardHook = std::function<Tensor(Module& m, std::span<const Tensor> inputs, const Tensor& output)>;
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  // Runs forward() between the pre-hooks and the hooks: what operator() of a
  // module calls, whatever its forward's signature.
  template <class F>
  Tensor forward_with_hooks(std::span<const Tensor> inputs, F&& forward) {
    if (pre_hooks_.empty() && hooks_.empty()) return forward();
    for (auto& [active, hook] : pre_hooks_)
      if (*active) hook(*this, inputs);
    Tensor out = forward();
    for (auto& [active, hook] : hooks_)
      if (*active)
        if (Tensor r = hook(*this, inputs, out); r.defined()) out = std::move(r);
    return out;
  }

 private:
  void check_name(const std::string& name) const;
  void collect(const std::string& prefix, bool recurse, bool buffers,
               std::vector<std::pair<std::string, Tensor>>& out) const;
  void print(std::string& out, int indent) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<std::shared_ptr<bool>, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<std::shared_ptr<bool>, ForwardHook>> hooks_;
};

// A module mapping one tensor to one tensor: what Sequential chains.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) {
    return forward_with_hooks(std::span<const Tensor>(&x, 1), [&] { return forward(x); });
  }
};

// Chains unary modules: Sequential({fc1, act, fc2}). Children are named "0", "1", ...
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> layers);
  void push_back(std::shared_ptr<UnaryModule> layer);
  Tensor forward(const Tensor& x) override;
  size_t size() const { return layers_.size(); }
  UnaryModule& operator[](size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

// A list of submodules of one type, named "0", "1", ... (PyTorch's ModuleList).
template <class M>
class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  void push_back(std::shared_ptr<M> m) {
    add_child(std::to_string(items_.size()), m);
    items_.push_back(std::move(m));
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) { return *items_.at(i); }
  const M& operator[](size_t i) const { return *items_.at(i); }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace tg::nn
