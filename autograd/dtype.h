#pragma once
/// \file
/// Element types. f32 is the default; f64 is for gradient checking and users
/// who need it; i64 holds token ids, targets and indices (never differentiable);
/// bf16 holds bfloat16 values (checkpoints, compact copies): it converts,
/// copies and prints, and its compute happens in float32 under autocast
/// (autocast.h), which runs the GEMMs on bfloat16 operands.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

#include "bfloat16.h"
#include "error.h"

namespace tg {

/// The element type of a tensor: float32, float64, int64 or bfloat16.
enum class DType : uint8_t { f32, f64, i64, bf16 };

/// Bytes per element: 4, 8 or 2.
constexpr size_t itemsize(DType d) { return d == DType::f32 ? 4 : d == DType::bf16 ? 2 : 8; }
/// "float32", "float64", "int64" or "bfloat16", as in error messages.
constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i64: return "int64";
    case DType::bf16: return "bfloat16";
  }
  return "?";
}
/// f32 or f64: the dtypes ops compute in and that can require grad
/// (bfloat16 is computed on only inside autocast's GEMMs).
constexpr bool is_floating(DType d) { return d == DType::f32 || d == DType::f64; }

/// The DType of a C++ element type T (float, double, int64_t): dtype_of<T>::value.
template <class T> struct dtype_of;
/// float is f32.
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; /**< DType::f32 */ };
/// double is f64.
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; /**< DType::f64 */ };
/// int64_t is i64.
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; /**< DType::i64 */ };
/// bfloat16 is bf16.
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bf16; /**< DType::bf16 */ };
/// dtype_of<T>::value.
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

/// The DTypeError for arithmetic on a bfloat16 tensor, naming op: bf16
/// tensors convert, copy, compare and print; they compute only inside
/// autocast's GEMMs.
[[noreturn]] inline void throw_bf16_compute(std::string_view op) {
  throw DTypeError(fmt::format("{}: bfloat16 tensors only convert, copy and print; compute in float32 (under an "
                               "AutocastGuard the GEMMs run in bfloat16) or call .to(DType::f32) first", op));
}

/// Calls f(T{}) with T = float or double for a floating dtype, else a
/// DTypeError naming op. The one float dispatcher of autograd/ and nn/; a
/// function rather than a macro, so the kernels inside the lambda may use
/// `#pragma omp simd` (a directive cannot sit in a macro argument). Typical use:
///     dispatch_float(x.dtype(), "relu", [&](auto tag) { using T = decltype(tag); ... });
template <class F>
void dispatch_float(DType dtype, std::string_view op, F&& f) {
  if (dtype == DType::f32)
    f(float{});
  else if (dtype == DType::f64)
    f(double{});
  else if (dtype == DType::bf16)
    throw_bf16_compute(op);
  else
    throw DTypeError(fmt::format("{}: expected a floating tensor, got {}", op, dtype_name(dtype)));
}

/// Binds scalar_t to the C++ type of any dtype (integers and bfloat16
/// included) and evaluates to the body's value: for the loops that only move,
/// convert or compare values (copies, fills, casts, printing).
#define TG_DISPATCH_ALL(dtype, op, ...)                                            \
  [&] {                                                                          \
    switch (dtype) {                                                             \
      case ::tg::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }     \
      case ::tg::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }    \
      case ::tg::DType::i64: { using scalar_t = int64_t; return __VA_ARGS__(); }   \
      case ::tg::DType::bf16: { using scalar_t = ::tg::bfloat16; return __VA_ARGS__(); } \
    }                                                                            \
    throw ::tg::DTypeError(::fmt::format("{}: unknown dtype", op));                \
  }()

/// As TG_DISPATCH_ALL for arithmetic (int64 and floating): bfloat16 is the
/// DTypeError of throw_bf16_compute.
#define TG_DISPATCH_ARITH(dtype, op, ...)                                          \
  [&] {                                                                          \
    switch (dtype) {                                                             \
      case ::tg::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }     \
      case ::tg::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }    \
      case ::tg::DType::i64: { using scalar_t = int64_t; return __VA_ARGS__(); }   \
      case ::tg::DType::bf16: ::tg::throw_bf16_compute(op);                      \
    }                                                                            \
    throw ::tg::DTypeError(::fmt::format("{}: unknown dtype", op));                \
  }()

}  // namespace tg
