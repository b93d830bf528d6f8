#pragma once
/// \file
/// Typed errors. Every message names the op and the shapes/values involved,
/// e.g. "matmul: cannot multiply (2,3) by (4,5)".
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

}  // namespace tg
