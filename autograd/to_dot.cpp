// to_dot: the graph the roots reach, in Graphviz's dot language.
#include <algorithm>

#include <fmt/format.h>

#include "autograd/op.h"
#include "autograd/tape.h"

namespace tg {

std::string to_dot(const std::vector<Tensor>& roots) {
  std::string out = "digraph autograd {\n  rankdir=BT;\n  node [shape=box, fontname=\"monospace\"];\n";
  std::vector<const Node*> seen;
  std::vector<const TensorImpl*> leaves;
  auto id = [&](const Node* n) {
    auto it = std::find(seen.begin(), seen.end(), n);
    if (it != seen.end()) return static_cast<size_t>(it - seen.begin());
    seen.push_back(n);
    return seen.size() - 1;
  };
  std::vector<const Node*> todo;
  for (const Tensor& r : roots)
    if (r.defined() && r.impl()->grad_fn) todo.push_back(r.impl()->grad_fn.get());
  std::vector<const Node*> done;
  while (!todo.empty()) {
    const Node* n = todo.back();
    todo.pop_back();
    if (std::find(done.begin(), done.end(), n) != done.end()) continue;
    done.push_back(n);
    const size_t k = id(n);
    out += fmt::format("  n{} [label=\"{}\\n{} {}{}\"];\n", k, n->op->name, n->out_shape, dtype_name(n->out_dtype),
                       n->released ? "\\n(freed by backward)" : "");
    for (const Edge& e : n->edges) {
      if (e.node) {
        out += fmt::format("  n{} -> n{};\n", id(e.node.get()), k);
        todo.push_back(e.node.get());
      } else if (e.leaf) {
        auto it = std::find(leaves.begin(), leaves.end(), e.leaf.get());
        size_t l = static_cast<size_t>(it - leaves.begin());
        if (it == leaves.end()) {
          leaves.push_back(e.leaf.get());
          out += fmt::format("  leaf{} [shape=ellipse, label=\"leaf\\n{} {}\"];\n", l, e.shape, dtype_name(e.dtype));
        }
        out += fmt::format("  leaf{} -> n{};\n", l, k);
      }
    }
  }
  return out + "}\n";
}

}  // namespace tg
