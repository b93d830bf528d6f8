#pragma once
// Element types. f32 is the default; f64 is for gradient checking and users
// who need it; i64 holds token ids, targets and indices (never differentiable).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tg {

enum class DType : uint8_t { f32, f64, i64 };

constexpr size_t itemsize(DType d) { return d == DType::f32 ? 4 : 8; }
constexpr std::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::i64: return "int64";
  }
  return "?";
}
constexpr bool is_floating(DType d) { return d != DType::i64; }

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// Calls f.template operator()<T>() with T the C++ type of a floating dtype.
// `op` names the caller for the error message.
#define TG_DISPATCH_FLOAT(dtype, op, ...)                                          \
  [&] {                                                                          \
    switch (dtype) {                                                             \
      case ::tg::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }     \
      case ::tg::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }    \
      default: throw ::tg::DTypeError(::fmt::format("{}: expected a floating tensor, got {}", op, ::tg::dtype_name(dtype))); \
    }                                                                            \
  }()

#define TG_DISPATCH_ALL(dtype, op, ...)                                            \
  [&] {                                                                          \
    switch (dtype) {                                                             \
      case ::tg::DType::f32: { using scalar_t = float; return __VA_ARGS__(); }     \
      case ::tg::DType::f64: { using scalar_t = double; return __VA_ARGS__(); }    \
      case ::tg::DType::i64: { using scalar_t = int64_t; return __VA_ARGS__(); }   \
    }                                                                            \
    throw ::tg::DTypeError(::fmt::format("{}: unknown dtype", op));                \
  }()

}  // namespace tg
