#pragma once
/// \file
/// What an op saves for its backward, as a struct of its own.
///
/// Each op names the tensors its backward reads in one struct whose fields
/// are Tensor (an input, a statistic, the op's own output), SideOutput (an
/// intermediate that is a side output of the node, see tape.h), AutocastInput
/// (an input read only by GEMMs, see below) or, last, one
/// std::vector<Tensor> (a list of any length), plus a field list that gives
/// each field its name and its place:
///
///     struct LayerNormSaved {
///       Tensor x, weight;         // (..., C), (C)
///       SideOutput mean, rstd;    // (R)
///       Tensor bias;              // (C)
///       static constexpr std::tuple fields{
///           saved_field("x", &LayerNormSaved::x), saved_field("weight", &LayerNormSaved::weight),
///           saved_field("mean", &LayerNormSaved::mean), saved_field("rstd", &LayerNormSaved::rstd),
///           saved_field("bias", &LayerNormSaved::bias)};
///     };
///
/// The forward saves it with one call, `n->save(LayerNormSaved{.x = xc, ...})`;
/// backward reads one field at a time, `n.saved_tensor(&LayerNormSaved::x)`, so a
/// field saved by reference is rebuilt only when read and each field's
/// in-place check is its own (Node::saved_tensor). The op's OpDef declares the struct,
/// `saves_of<LayerNormSaved>()`, which is what opcheck prints ("x, weight, mean
/// (side output), rstd (side output), bias"): the description is the code. An
/// op that saves nothing declares saves_of<NoSaved>() and never calls save.
///
/// An AutocastInput field is an input that the forward computed on as its
/// bfloat16 copy under autocast (a GEMM operand; gelu's input, between a
/// transformer MLP's two GEMMs): the node keeps that copy instead (half the
/// memory, and no rounding again in backward).
///
/// The field list is checked at compile time: it names every field of the
/// struct once, and a list field comes last. Slot k of Node::saved holds
/// field k (a list field: the rest of the slots); side output k (1, 2, ...)
/// is the k-th SideOutput field.
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "tensor.h"

namespace tg {

/// A saved intermediate that is a side output of the node (Node::side_grad):
/// a Tensor that the saved struct marks as such.
struct SideOutput : Tensor {
  SideOutput() = default;
  /// Implicit, so that a saved struct is written `.mean = mean`.
  SideOutput(Tensor t) : Tensor(std::move(t)) {}  // NOLINT
};

/// A saved input whose plain backward can read it in bfloat16 (as GEMM
/// operands, or in a pointwise derivative; recorded and tangent forms read it
/// as float32), with `rounded`, the bfloat16 copy of it that the forward
/// computed on under autocast, as torch.autocast computes on a GEMM's
/// bfloat16 output. The
/// node keeps that copy in place of the float32 input where it may: when
/// rounded is given, the input is not a leaf that requires grad and no
/// forward-mode level is open (its tangent would be lost); an input that its
/// producer could rebuild (see Node::save) is kept as the copy too. Read
/// back (Node::saved_tensor), it is the bfloat16 copy in a plain backward
/// and, in grad mode, its values as float32 attached to the input's
/// producer, so that a recorded backward differentiates through it as
/// through the input. Without `rounded` it is saved like a Tensor field.
struct AutocastInput : Tensor {
  AutocastInput() = default;
  /// Implicit, so that a saved struct is written `.x = x` (nothing rounded).
  AutocastInput(Tensor t, Tensor rounded = Tensor()) : Tensor(std::move(t)), rounded(std::move(rounded)) {}  // NOLINT
  Tensor rounded;  ///< t as bfloat16 (contiguous), or undefined
};

/// One entry of a saved struct's field list: its name and its member.
template <class S, class M>
struct SavedField {
  std::string_view name;  ///< as OpDef::saves prints it
  M S::*member;           ///< the field
};
/// `saved_field("x", &LayerNormSaved::x)`: an entry of S::fields.
template <class S, class M>
constexpr SavedField<S, M> saved_field(std::string_view name, M S::*member) {
  return {name, member};
}

/// How a field is saved.
enum class SavedKind : uint8_t {
  tensor,       ///< a Tensor: one slot
  side_output,  ///< a SideOutput: one slot, and the node's next side output
  autocast_input,  ///< an AutocastInput: one slot, its bfloat16 copy where it may
  list,         ///< a std::vector<Tensor>, the last field: one slot per element
};
/// A field as OpDef::saves describes it.
struct SavedFieldInfo {
  std::string_view name;  ///< the field's name
  SavedKind kind;         ///< how it is saved
};

/// The saved struct an op declares (OpDef::saves): its type and its fields.
struct SavedLayout {
  const std::type_info* type = nullptr;   ///< the saved struct
  std::span<const SavedFieldInfo> fields;  ///< its fields, in slot order
  /// "x, weight, mean (side output), rstd (side output), bias"; "nothing" without fields.
  std::string str() const;
};

/// The struct of an op that saves nothing.
struct NoSaved {
  static constexpr std::tuple<> fields{};  ///< none
};

namespace detail {
template <class M>
constexpr SavedKind saved_kind() {
  if constexpr (std::is_same_v<M, Tensor>)
    return SavedKind::tensor;
  else if constexpr (std::is_same_v<M, SideOutput>)
    return SavedKind::side_output;
  else if constexpr (std::is_same_v<M, AutocastInput>)
    return SavedKind::autocast_input;
  else if constexpr (std::is_same_v<M, std::vector<Tensor>>)
    return SavedKind::list;
  else
    static_assert(sizeof(M) == 0,
                  "a saved field is a Tensor, a SideOutput, an AutocastInput or a std::vector<Tensor> (last)");
  return SavedKind::tensor;
}

// The number of fields of aggregate S: the most initialisers S{...} takes.
struct AnyField {
  template <class T>
  operator T() const;  // NOLINT: converts to any field type, never called
};
template <class S, class... A>
constexpr size_t aggregate_size() {
  if constexpr (requires { S{A{}..., AnyField{}}; })
    return aggregate_size<S, A..., AnyField>();
  else
    return sizeof...(A);
}

template <class S, class M>
constexpr SavedFieldInfo saved_field_info(const SavedField<S, M>& f) {
  return {f.name, saved_kind<M>()};
}
template <class S>
constexpr auto saved_field_infos() {
  return std::apply(
      [](const auto&... f) { return std::array<SavedFieldInfo, sizeof...(f)>{saved_field_info(f)...}; }, S::fields);
}
template <class S>
constexpr bool saved_fields_valid() {
  constexpr auto infos = saved_field_infos<S>();
  for (size_t i = 0; i + 1 < infos.size(); ++i)
    if (infos[i].kind == SavedKind::list) return false;
  return true;
}

// Whether two entries name the same member.
template <class A, class B>
constexpr bool same_member(const A& a, const B& b) {
  if constexpr (std::is_same_v<A, B>)
    return a.member == b.member;
  else
    return false;
}
template <class S>
constexpr bool saved_fields_distinct() {
  return std::apply(
      [](const auto&... f) {
        [[maybe_unused]] auto count = [&](const auto& g) { return (size_t{0} + ... + (same_member(f, g) ? 1u : 0u)); };
        return ((count(f) == 1) && ...);
      },
      S::fields);
}

// Index in S::fields of the entry naming `member`.
template <class S, class M>
constexpr size_t saved_index(M S::*member) {
  size_t i = 0, found = SIZE_MAX;
  std::apply(
      [&](const auto&... f) {
        (([&] {
           if constexpr (std::is_same_v<std::remove_cvref_t<decltype(f.member)>, M S::*>)
             if (f.member == member) found = i;
           ++i;
         }()),
         ...);
      },
      S::fields);
  return found;
}
}  // namespace detail

/// A saved struct: an aggregate whose `fields` list names each of its fields once.
template <class S>
concept SavedStruct = requires { S::fields; } && std::is_aggregate_v<S>;

/// S's layout, checked: what an OpDef declares it saves.
template <SavedStruct S>
inline constexpr std::array<SavedFieldInfo, std::tuple_size_v<std::remove_cv_t<decltype(S::fields)>>>
    saved_field_infos_v = detail::saved_field_infos<S>();

/// What an OpDef declares its op saves: `saves_of<LayerNormSaved>()`.
template <SavedStruct S>
SavedLayout saves_of() {
  static_assert(detail::aggregate_size<S>() == std::tuple_size_v<std::remove_cv_t<decltype(S::fields)>>,
                "the saved struct's field list must name each of its fields");
  static_assert(detail::saved_fields_distinct<S>(), "the saved struct's field list names a field twice");
  static_assert(detail::saved_fields_valid<S>(), "a std::vector<Tensor> field must be the last saved field");
  return {&typeid(S), saved_field_infos_v<S>};
}

/// Which output of its node a SideOutput field is: 1 for the first, 2 for the
/// second... (the index of its tangent in a tangent rule's outputs).
template <class S>
constexpr uint32_t side_output(SideOutput S::*member) {
  const size_t index = detail::saved_index(member);
  uint32_t k = 0;
  for (size_t i = 0; i <= index && i < saved_field_infos_v<S>.size(); ++i)
    k += saved_field_infos_v<S>[i].kind == SavedKind::side_output;
  return k;
}

}  // namespace tg
