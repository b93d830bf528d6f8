#pragma once
/// \file
/// Elementwise ops with NumPy broadcasting. Binary ops need equal dtypes
/// (mixing float32 and float64 is a DTypeError); scalars adopt the tensor's dtype.
/// Backward reduces each gradient back to its input's shape (sum_to).
#include "../tensor.h"

namespace tg {

// --- binary, broadcasting
Tensor add(const Tensor& a, const Tensor& b);  ///< a + b
Tensor sub(const Tensor& a, const Tensor& b);  ///< a - b
Tensor mul(const Tensor& a, const Tensor& b);  ///< a * b
Tensor div(const Tensor& a, const Tensor& b);  ///< a / b
Tensor pow(const Tensor& a, const Tensor& b);   ///< a ^ b; a > 0 where b is not an integer
Tensor minimum(const Tensor& a, const Tensor& b);  ///< elementwise min; ties send the gradient half to each
Tensor maximum(const Tensor& a, const Tensor& b);  ///< elementwise max; ties send the gradient half to each
// --- with a scalar
Tensor add(const Tensor& a, double b);  ///< a + b
Tensor mul(const Tensor& a, double b);  ///< a * b
Tensor pow(const Tensor& a, double exponent);  ///< a ^ exponent
Tensor rsub(double a, const Tensor& b);          ///< a - b
Tensor rdiv(double a, const Tensor& b);          ///< a / b
// --- unary
Tensor neg(const Tensor& x);  ///< -x
Tensor exp(const Tensor& x);  ///< e^x
Tensor log(const Tensor& x);  ///< natural logarithm
Tensor sqrt(const Tensor& x);  ///< square root
Tensor rsqrt(const Tensor& x);  ///< 1 / sqrt(x)
Tensor abs(const Tensor& x);                     ///< |x|; gradient sign(x), 0 at 0
Tensor tanh(const Tensor& x);  ///< hyperbolic tangent
Tensor sigmoid(const Tensor& x);  ///< 1 / (1 + e^-x)
Tensor relu(const Tensor& x);  ///< max(x, 0); gradient 0 at 0
Tensor gelu(const Tensor& x, bool tanh_approximation = false);  ///< GELU, exact: x * Phi(x); or its tanh approximation
/// g * gelu'(x), gelu's backward as a differentiable op (x and g of one shape).
Tensor gelu_grad(const Tensor& g, const Tensor& x, bool tanh_approximation = false);
Tensor softplus(const Tensor& x);                ///< log(1 + e^x), stable
Tensor log_sigmoid(const Tensor& x);             ///< -softplus(-x), stable
Tensor erf(const Tensor& x);                     ///< the error function
Tensor clamp(const Tensor& x, double low, double high);  ///< x limited to [low, high]; gradient 1 strictly inside
Tensor cast(const Tensor& x, DType dtype);       ///< x as dtype; differentiable between float dtypes
// --- selection
/// a where mask is nonzero, else b. mask: any dtype, nonzero = true; broadcast with a and b.
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);  ///< x with value where mask is nonzero
// --- comparisons (no gradient): int64 0/1 of the broadcast shape
Tensor eq(const Tensor& a, const Tensor& b);  ///< a == b
Tensor ne(const Tensor& a, const Tensor& b);  ///< a != b
Tensor lt(const Tensor& a, const Tensor& b);  ///< a < b
Tensor le(const Tensor& a, const Tensor& b);  ///< a <= b
Tensor gt(const Tensor& a, const Tensor& b);  ///< a > b
Tensor ge(const Tensor& a, const Tensor& b);  ///< a >= b

// Operators, as in PyTorch.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }  ///< add(a, b)
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }  ///< sub(a, b)
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }  ///< mul(a, b)
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }  ///< div(a, b)
inline Tensor operator-(const Tensor& a) { return neg(a); }  ///< neg(a)
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }  ///< add(a, b)
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }  ///< add(b, a)
inline Tensor operator-(const Tensor& a, double b) { return add(a, -b); }  ///< add(a, -b)
inline Tensor operator-(double a, const Tensor& b) { return rsub(a, b); }  ///< rsub(a, b)
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }  ///< mul(a, b)
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }  ///< mul(b, a)
inline Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }  ///< mul(a, 1.0 / b)
inline Tensor operator/(double a, const Tensor& b) { return rdiv(a, b); }  ///< rdiv(a, b)

}  // namespace tg
