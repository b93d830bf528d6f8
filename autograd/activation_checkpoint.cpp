// checkpoint: one node that saves a function's inputs and reruns it in backward.
#include "autograd/activation_checkpoint.h"

#include <optional>
#include <utility>

#include <fmt/format.h>

#include "autograd/anomaly.h"
#include "autograd/autocast.h"
#include "autograd/forward_ad.h"
#include "autograd/op.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/matmul.h"
#include "autograd/ops/samples.h"
#include "autograd/tape.h"

namespace tg {
namespace {

// A generator's state: checkpoint restores it to rerun fn's draws. A null
// gen is the default generator of the thread that runs (it is per thread,
// and backward may run on another thread than the forward did).
struct GeneratorState {
  Generator* gen;
  uint64_t seed, offset;
  Generator& generator() const { return gen ? *gen : default_generator(); }
};

// The same generators' states now.
std::vector<GeneratorState> current(std::vector<GeneratorState> states) {
  for (GeneratorState& s : states) s = {s.gen, s.generator().seed(), s.generator().offset()};
  return states;
}

std::vector<GeneratorState> states_of(const std::vector<Generator*>& gens) {
  std::vector<GeneratorState> out;
  for (Generator* g : gens) out.push_back({g, 0, 0});
  return current(std::move(out));
}

void restore(const std::vector<GeneratorState>& states) {
  for (const GeneratorState& s : states) s.generator().set_state(s.seed, s.offset);
}

// fn rerun for backward: its output, recorded, and what backward
// differentiates it with respect to (the tensors of the edges whose gradient
// is needed, and which edge each is).
struct Rerun {
  Tensor out;
  std::vector<Tensor> wrt;
  std::vector<size_t> wrt_edge;
  uint64_t pass = 0;  // the plain pass it was made for (detail::plain_pass); 0: none
};

// What the node keeps besides its saved tensors: fn, how many of its edges
// are fn's own inputs (the rest are tensors fn read from elsewhere), the
// generators' states when the forward started, and (under anomaly detection)
// the module path it ran in, which the rerun's nodes are recorded under.
// With output_by_reference, `kept` is the rerun that rebuilt the output for a
// later op's backward, kept until this node's backward takes it.
struct CheckpointClosure {
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  size_t arity;
  std::vector<GeneratorState> generators;
  std::string module_path;
  mutable Rerun kept;
};

// Saved: every edge's tensor, in edge order (fn's inputs, then what it read).
struct CheckpointSaved {
  std::vector<Tensor> edges;
  static constexpr std::tuple fields{saved_field("edges", &CheckpointSaved::edges)};
};

const CheckpointClosure& closure_of(const Node& n) { return *static_cast<const CheckpointClosure*>(n.closure.get()); }

// Reruns fn on what the node saved, under the forward's precision and random
// state. Recorded (create_graph): on the saved inputs themselves, so that the
// gradients are functions of them. Plain: on detached copies, so that the
// pass over the rerun stops there instead of walking the graph behind them.
// Without a graph, under no_grad: the output's value only.
enum class Graph { none, plain, recorded };
Rerun rerun(const Node& n, Graph graph) {
  const CheckpointClosure& c = closure_of(n);
  Rerun r;
  std::vector<Tensor> args(c.arity);
  const SavedList saved = n.saved_list(&CheckpointSaved::edges);
  for (size_t k = 0; k < n.edges.size(); ++k) {
    Tensor t = saved[k];
    if (k < c.arity && graph == Graph::plain && t.defined()) {
      t = t.detach();
      if (n.needs(k)) t.requires_grad_(true);
    }
    if (k < c.arity) args[k] = t;
    if (n.needs(k) && graph != Graph::none) {
      r.wrt.push_back(t);
      r.wrt_edge.push_back(k);
    }
  }
  // The forward's random state for the rerun, and the current one after it.
  const std::vector<GeneratorState> now = current(c.generators);
  restore(c.generators);
  struct Restore {
    const std::vector<GeneratorState>& states;
    ~Restore() { restore(states); }
  } restore_after{now};
  std::optional<EnableGradGuard> with_grad;
  std::optional<NoGradGuard> no_grad;
  if (graph == Graph::none)
    no_grad.emplace();
  else
    with_grad.emplace();
  AutocastGuard precision(n.autocast);
  ModulePathScope path(c.module_path);
  r.out = c.fn(args);
  if (!r.out.defined() || !(r.out.shape() == n.out_shape) || r.out.dtype() != n.out_dtype)
    throw AutogradError(fmt::format(
        "backward of 'checkpoint': the rerun of its function returned {} where the forward returned {} {}; the "
        "function must compute the same thing every time",
        r.out.defined() ? fmt::format("{} {}", r.out.shape(), dtype_name(r.out.dtype())) : std::string("nothing"),
        n.out_shape, dtype_name(n.out_dtype)));
  return r;
}

// The output, for a later op's backward that saved it by reference. When the
// plain pass running now will also run this node's backward, the rerun is
// made with its graph and kept for that backward: one rerun serves both.
// Otherwise the value alone is kept, for the other ops that saved it.
Tensor checkpoint_recompute(const Node& n) {
  const CheckpointClosure& c = closure_of(n);
  if (!c.kept.out.defined()) {
    if (detail::plain_pass_runs(n) && !forward_ad_enabled()) {
      c.kept = rerun(n, Graph::plain);
      c.kept.pass = detail::plain_pass();
    } else {
      c.kept = rerun(n, Graph::none);
    }
  }
  return c.kept.out.detach();
}

void checkpoint_backward(const Node& n, const Tensor& g, std::span<Tensor> grad_in) {
  const CheckpointClosure& c = closure_of(n);
  // Under forward over reverse the rerun and its pass are linked like any
  // forward at the level, so the gradients below carry their tangents.
  detail::TangentsOnlySuspended linked;
  const bool recorded = grad_enabled();
  Rerun r = std::exchange(c.kept, Rerun{});
  if (recorded || r.pass == 0 || r.pass != detail::plain_pass()) r = rerun(n, recorded ? Graph::recorded : Graph::plain);
  if (!r.out.requires_grad()) return;  // it depends on nothing requiring grad: no gradient flows
  const std::vector<Tensor> grads =
      linked.grad({r.out}, r.wrt, {g}, {.retain_graph = recorded, .create_graph = recorded, .allow_unused = true});
  for (size_t i = 0; i < r.wrt.size(); ++i) grad_in[r.wrt_edge[i]] = grads[i];
}

const OpDef checkpoint_op({
    .name = "checkpoint",
    .arity = -1,
    .signature = "checkpoint(fn, inputs) -> fn(inputs), rerun by backward",
    .saves = saves_of<CheckpointSaved>(),
    .backward = checkpoint_backward,
    // Forward mode through a checkpoint: its backward reruns fn with tensor
    // ops, so J v comes from two passes of it (one forward-AD level per thread
    // rules out rerunning fn on dual inputs inside the rule).
    .samples = [] {
      // A two-layer block, and one reading a weight it does not take as an input.
      auto block = [](const std::vector<Tensor>& in) {
        return checkpoint([](const std::vector<Tensor>& a) { return mul(tanh(matmul(a[0], a[1])), a[0]); },
                          {in[0], in[1]});
      };
      auto captured = [](const std::vector<Tensor>& in) {
        const Tensor w = in[1];
        return add(checkpoint([w](const std::vector<Tensor>& a) { return exp(matmul(a[0], w)); }, {in[0]}), in[1]);
      };
      // h = tanh(x w) held by reference, read by a second checkpoint's backward.
      auto by_reference = [](const std::vector<Tensor>& in) {
        const Tensor w = in[1];
        const Tensor h = checkpoint([w](const std::vector<Tensor>& a) { return tanh(matmul(a[0], w)); }, {in[0]},
                                    {.generators = {}, .output_by_reference = true});
        return checkpoint([](const std::vector<Tensor>& a) { return mul(a[0], exp(a[0])); }, {h});
      };
      return std::vector<OpSample>{
          {"tanh(x w) * x, (3,4) (4,4)", {samples::uniform({3, 4}, 351), samples::uniform({4, 4}, 352)}, block},
          {"exp(x w) + w, w read from outside, (4,4) (4,4)",
           {samples::uniform({4, 4}, 353), samples::uniform({4, 4}, 354)}, captured},
          {"h exp(h), h = tanh(x w) by reference, (3,4) (4,4)",
           {samples::uniform({3, 4}, 355), samples::uniform({4, 4}, 356)}, by_reference},
      };
    },
    .recompute = checkpoint_recompute,
});

}  // namespace

Tensor checkpoint(std::function<Tensor(const std::vector<Tensor>&)> fn, const std::vector<Tensor>& inputs,
                  const CheckpointOptions& options) {
  if (!fn) throw ValueError("checkpoint: no function given");
  if (!grad_enabled()) return fn(inputs);
  std::vector<Generator*> gens = options.generators;
  if (gens.empty()) gens.push_back(nullptr);  // the default generator
  auto closure = std::make_shared<CheckpointClosure>(
      CheckpointClosure{.fn = std::move(fn), .arity = inputs.size(), .generators = states_of(gens),
                        .module_path = anomaly_enabled() ? module_path() : std::string(), .kept = {}});
  std::vector<Tensor> reads;
  Tensor out;
  {
    detail::RecordingSuspended suspended(reads);
    out = closure->fn(inputs);
  }
  if (!out.defined()) throw ValueError("checkpoint: the function returned an undefined tensor");
  // The node's inputs: fn's own, then what it read from elsewhere.
  std::vector<Tensor> edges = inputs;
  for (const Tensor& r : reads)
    if (std::none_of(inputs.begin(), inputs.end(), [&](const Tensor& x) { return x.defined() && x.impl() == r.impl(); }))
      edges.push_back(r);
  // A tensor of its own: fn may return one of its inputs, whose node must stay.
  out = out.detach();
  std::vector<const Tensor*> ptrs;
  for (const Tensor& e : edges) ptrs.push_back(&e);
  if (Node* n = record(checkpoint_op, ptrs, out)) {
    n->output_by_reference = options.output_by_reference;
    n->save(CheckpointSaved{.edges = std::move(edges)});
    n->closure = std::move(closure);
  }
  return out;
}

}  // namespace tg
