// Typed saved state: the checks behind Node::save(S) and Node::saved_tensor(&S::field),
// and the description OpDef::saves prints.
#include "autograd/saved.h"

#include <cxxabi.h>
#include <fmt/format.h>

#include <cstdlib>
#include <memory>

#include "autograd/op.h"
#include "autograd/tape.h"

namespace tg {

std::string SavedLayout::str() const {
  if (fields.empty()) return "nothing";
  std::string s;
  for (const SavedFieldInfo& f : fields) {
    if (!s.empty()) s += ", ";
    s += f.name;
    if (f.kind == SavedKind::side_output) s += " (side output)";
    if (f.kind == SavedKind::list) s += " (list)";
    if (f.kind == SavedKind::autocast_input) s += " (bfloat16 under autocast)";
  }
  return s;
}

namespace {
// The struct's name as written in the source (typeid's is mangled).
std::string type_name(const std::type_info* t) {
  if (!t) return "nothing declared";
  int status = 0;
  std::unique_ptr<char, decltype(&std::free)> name(abi::__cxa_demangle(t->name(), nullptr, nullptr, &status),
                                                   &std::free);
  return status == 0 && name ? std::string(name.get()) : std::string(t->name());
}
}  // namespace

void Node::begin_save(const std::type_info& type) {
  if (!op->saves.type || *op->saves.type != type)
    throw AutogradError(fmt::format("'{}': its forward saves {} but its OpDef declares {}", op->name, type_name(&type),
                                    type_name(op->saves.type)));
  if (!saved.empty())
    throw AutogradError(fmt::format("'{}': its forward saved twice; save() takes everything backward reads, once",
                                    op->name));
}

size_t Node::saved_slot(const std::type_info& type, size_t index) const {
  if (!op->saves.type || *op->saves.type != type)
    throw AutogradError(fmt::format("backward of '{}': reads what it saved as {} but its OpDef declares {}", op->name,
                                    type_name(&type), type_name(op->saves.type)));
  // A list field may be empty: its first slot is then one past the end.
  const bool list = op->saves.fields[index].kind == SavedKind::list;
  if (index > saved.size() || (index == saved.size() && !list))
    throw AutogradError(fmt::format("backward of '{}': reads field '{}' but its forward saved {} of {} fields",
                                    op->name, op->saves.fields[index].name, saved.size(), op->saves.fields.size()));
  return index;
}

}  // namespace tg
