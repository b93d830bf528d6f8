#pragma once
// Elementwise ops with NumPy broadcasting. Binary ops need equal dtypes
// (mixing float32 and float64 is a DTypeError); scalars adopt the tensor's dtype.
// Backward reduces each gradient back to its input's shape (sum_to).
#include "../tensor.h"

namespace tg {

// --- binary, broadcasting
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, const Tensor& b);   // a > 0 where b is not an integer
Tensor minimum(const Tensor& a, const Tensor& b);  // ties send the gradient half to each
Tensor maximum(const Tensor& a, const Tensor& b);
// --- with a scalar
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor pow(const Tensor& a, double exponent);
Tensor rsub(double a, const Tensor& b);          // a - b
Tensor rdiv(double a, const Tensor& b);          // a / b
// --- unary
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);                     // gradient sign(x), 0 at 0
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);  // exact: x * Phi(x)
Tensor softplus(const Tensor& x);                // log(1 + e^x), stable
Tensor log_sigmoid(const Tensor& x);             // -softplus(-x), stable
Tensor erf(const Tensor& x);                     // the error function
Tensor clamp(const Tensor& x, double low, double high);  // gradient 1 strictly inside
Tensor cast(const Tensor& x, DType dtype);       // differentiable between float dtypes
// --- selection
// mask: any dtype, nonzero = true; broadcast with a and b.
Tensor where(const Tensor& mask, const Tensor& a, const Tensor& b);
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// --- comparisons (no gradient): int64 0/1 of the broadcast shape
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

// Operators, as in PyTorch.
inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, double b) { return add(a, b); }
inline Tensor operator+(double a, const Tensor& b) { return add(b, a); }
inline Tensor operator-(const Tensor& a, double b) { return add(a, -b); }
inline Tensor operator-(double a, const Tensor& b) { return rsub(a, b); }
inline Tensor operator*(const Tensor& a, double b) { return mul(a, b); }
inline Tensor operator*(double a, const Tensor& b) { return mul(b, a); }
inline Tensor operator/(const Tensor& a, double b) { return mul(a, 1.0 / b); }
inline Tensor operator/(double a, const Tensor& b) { return rdiv(a, b); }

}  // namespace tg
