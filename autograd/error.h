#pragma once
/// \file
/// Typed errors. Every message names the op and the shapes/values involved,
/// e.g. "matmul: cannot multiply (2,3) by (4,5)".
#include <cstddef>
#include <new>
#include <stdexcept>
#include <string>

namespace tg {

/// Shapes that do not fit the op: rank, sizes, broadcasting.
struct ShapeError : std::invalid_argument { using std::invalid_argument::invalid_argument; };
/// A dtype the op does not take, or dtypes that do not match.
struct DTypeError : std::invalid_argument { using std::invalid_argument::invalid_argument; };
/// An argument whose value the op cannot take: a dropout probability outside
/// [0, 1), a negative learning rate, an undefined tensor.
struct ValueError : std::invalid_argument { using std::invalid_argument::invalid_argument; };
/// An index or axis outside its bound.
struct IndexError : std::out_of_range { using std::out_of_range::out_of_range; };
/// Misuse of the tape: backward through a freed graph, a saved tensor modified
/// in place, backward on a non-scalar without a gradient, ...
struct AutogradError : std::logic_error { using std::logic_error::logic_error; };
/// A NaN or an infinity where anomaly detection (DetectAnomalyGuard) was
/// watching: names the op, its shapes and the module path it ran under.
struct AnomalyError : std::runtime_error { using std::runtime_error::runtime_error; };
/// An allocation the machine refused, after the caching allocator gave its
/// cache back and tried again. The message names the op that asked, the
/// shape and dtype, the bytes, and the allocator's bytes in use and cached;
/// the fields hold the same. A std::bad_alloc, so code catching that still
/// does. Whatever the op was building is freed as the exception unwinds.
struct OutOfMemoryError : std::bad_alloc {
  /// The error with its message and the figures it states.
  OutOfMemoryError(std::string message, size_t bytes, size_t bytes_in_use, size_t bytes_cached)
      : bytes(bytes), bytes_in_use(bytes_in_use), bytes_cached(bytes_cached), message_(std::move(message)) {}
  /// The message (std::bad_alloc's own says only "std::bad_alloc").
  const char* what() const noexcept override { return message_.c_str(); }
  size_t bytes;         ///< asked for (rounded to the allocator's size class)
  size_t bytes_in_use;  ///< held by live tensors when it failed
  size_t bytes_cached;  ///< held by the cache when it failed (0: it was given back first)

 private:
  std::string message_;
};

}  // namespace tg
