#pragma once
// Typed errors. Every message names the op and the shapes/values involved,
// e.g. "matmul: cannot multiply (2,3) by (4,5)".
#include <stdexcept>
#include <string>

namespace tg {

struct ShapeError : std::invalid_argument { using std::invalid_argument::invalid_argument; };
struct DTypeError : std::invalid_argument { using std::invalid_argument::invalid_argument; };
struct ValueError : std::invalid_argument { using std::invalid_argument::invalid_argument; };
struct IndexError : std::out_of_range { using std::out_of_range::out_of_range; };
// Misuse of the tape: backward through a freed graph, a saved tensor modified
// in place, backward on a non-scalar without a gradient, ...
struct AutogradError : std::logic_error { using std::logic_error::logic_error; };

}  // namespace tg
