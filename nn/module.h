#pragma once
/// \file
/// nn::Module, the base of every layer and model, and the containers
/// Sequential and ModuleList.
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/autograd.h"

/// Layers, losses, initialisers, optimizers, schedulers and checkpoints.
namespace tg::nn {

/// The base of every layer and model, as in PyTorch.
///
///     struct Net : nn::Module {
///       std::shared_ptr<nn::Linear> fc1, fc2;
///       Net() : Module("Net") {
///         fc1 = register_module("fc1", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 4, .out = 8}));
///         fc2 = register_module("fc2", std::make_shared<nn::Linear>(nn::LinearOptions{.in = 8, .out = 1}));
///       }
///       Tensor forward(const Tensor& x) { return (*fc2)(relu((*fc1)(x))); }
///     };
///
/// Parameters, buffers and submodules are registered by name, so
/// named_parameters() yields "blocks.0.attn.qkv.weight", the names a
/// checkpoint stores. Handles stay valid across to(dtype) and load (the data
/// is replaced inside the tensor, see Tensor::set_data).
class Module {
 public:
  /// `type_name` is what str() prints, e.g. "Linear".
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The name given to the constructor, e.g. "Linear".
  const std::string& type_name() const { return type_name_; }
  /// The name its parent registered it under ("attn"; "" for a root). A
  /// module's forward opens a ModulePathScope with it, so that anomaly
  /// detection names where an op ran ("blocks.1.attn").
  const std::string& name() const { return name_; }

  // --- registration (names must be unique within the module and contain no '.')
  /// Registers a trained tensor under `name` and sets its requires_grad; returns it.
  Tensor register_parameter(const std::string& name, Tensor t);
  /// Registers a tensor that is saved in checkpoints but not trained; returns it.
  Tensor register_buffer(const std::string& name, Tensor t);
  /// Registers a submodule under `name`: its parameters are then named
  /// "name.<theirs>". Returns it.
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    add_child(name, m);
    return m;
  }

  // --- traversal (registration order, depth first)
  /// Parameters by dotted name ("fc1.weight"); with `recurse` false, this module's own only.
  std::vector<std::pair<std::string, Tensor>> named_parameters(bool recurse = true) const;
  /// The tensors of named_parameters(), e.g. for an optimizer.
  std::vector<Tensor> parameters(bool recurse = true) const;
  /// Buffers by dotted name.
  std::vector<std::pair<std::string, Tensor>> named_buffers(bool recurse = true) const;
  /// The direct submodules with their names, in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& named_children() const { return children_; }
  /// The direct submodules, in registration order.
  std::vector<std::shared_ptr<Module>> children() const;
  /// Parameters and buffers by dotted name: what a checkpoint holds.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;

  // --- state
  /// Training mode (dropout active) when `on`, else evaluation; propagates to children.
  virtual void train(bool on = true);
  /// The same as train(false).
  void eval() { train(false); }
  /// Whether the module is in training mode (the default).
  bool is_training() const { return training_; }
  /// Drops every parameter's .grad.
  void zero_grad();
  /// The number of scalars in all parameters (buffers not counted).
  int64_t num_parameters() const;
  /// Converts every parameter and buffer (float ones) to dtype, in place.
  void to(DType dtype);
  /// Tree printout with each parameter's shape, e.g.
  ///
  ///     GPT(
  ///       (wte): Embedding(weight (85,128))
  ///       ...
  std::string str() const;
  /// One-line summary of this module's own settings (overridden by layers).
  virtual std::string extra_repr() const { return {}; }

  // --- forward hooks (PyTorch's register_forward_pre_hook / register_forward_hook)
  /// Sees a module's inputs before its forward runs.
  using ForwardPreHook = std::function<void(Module& m, std::span<const Tensor> inputs)>;
  /// Sees a module's inputs and output after its forward; returning a defined
  /// tensor replaces the output, an undefined one keeps it.
  using ForwardHook = std::function<Tensor(Module& m, std::span<const Tensor> inputs, const Tensor& output)>;
  /// Adds a pre-hook, run on every call made through operator() (see
  /// forward_with_hooks), until the returned handle removes it.
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  /// Adds a hook, run on every call made through operator(), until the
  /// returned handle removes it.
  HookHandle register_forward_hook(ForwardHook hook);

 protected:
  /// Registers a submodule (what register_module() does, for any Module).
  void add_child(const std::string& name, std::shared_ptr<Module> m);
  /// Runs forward() between the pre-hooks and the hooks: what operator() of a
  /// module calls, whatever its forward's signature.
  template <class F>
  Tensor forward_with_hooks(std::span<const Tensor> inputs, F&& forward) {
    if (pre_hooks_.empty() && hooks_.empty()) return forward();
    ModulePathScope path(name_);  // what the hooks compute runs inside this module
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
  std::string name_;
  bool training_ = true;
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, Tensor>> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::vector<std::pair<std::shared_ptr<bool>, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<std::shared_ptr<bool>, ForwardHook>> hooks_;
};

/// A module mapping one tensor to one tensor: what Sequential chains.
class UnaryModule : public Module {
 public:
  using Module::Module;
  /// The module's computation; call it through operator() to run the forward hooks.
  virtual Tensor forward(const Tensor& x) = 0;
  /// forward(x) between the module's forward hooks.
  Tensor operator()(const Tensor& x) {
    return forward_with_hooks(std::span<const Tensor>(&x, 1), [&] { return forward(x); });
  }
};

/// Chains unary modules: Sequential({fc1, act, fc2}). Children are named "0", "1", ...
class Sequential : public UnaryModule {
 public:
  /// An empty chain (the identity).
  Sequential() : UnaryModule("Sequential") {}
  /// The layers, applied in order.
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> layers);
  /// Appends a layer, named by its position.
  void push_back(std::shared_ptr<UnaryModule> layer);
  /// Applies every layer in order.
  Tensor forward(const Tensor& x) override;
  /// The number of layers.
  size_t size() const { return layers_.size(); }
  /// Layer i (std::out_of_range past the end).
  UnaryModule& operator[](size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<UnaryModule>> layers_;
};

/// A list of submodules of one type, named "0", "1", ... (PyTorch's ModuleList).
template <class M>
class ModuleList : public Module {
 public:
  /// An empty list.
  ModuleList() : Module("ModuleList") {}
  /// Appends and registers a submodule, named by its position.
  void push_back(std::shared_ptr<M> m) {
    add_child(std::to_string(items_.size()), m);
    items_.push_back(std::move(m));
  }
  /// The number of submodules.
  size_t size() const { return items_.size(); }
  /// Submodule i (std::out_of_range past the end).
  M& operator[](size_t i) { return *items_.at(i); }
  /// Submodule i (std::out_of_range past the end).
  const M& operator[](size_t i) const { return *items_.at(i); }
  /// Iterates over the submodules' shared pointers, in order.
  auto begin() { return items_.begin(); }
  /// The end of begin()'s range.
  auto end() { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace tg::nn
