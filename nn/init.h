#pragma once
/// \file
/// Parameter initialisers, as torch.nn.init: each fills a tensor in place
/// (outside the tape) from a seedable tg::Generator (default_generator() when
/// none is given), so the same seed gives the same model on every run.
/// Fans follow PyTorch: for a weight (out, in, k...) fan_in = in * prod(k),
/// fan_out = out * prod(k).
#include <utility>

#include "../autograd/generator.h"
#include "../autograd/tensor.h"

/// Parameter initialisers, as torch.nn.init.
namespace tg::nn::init {

/// The nonlinearity that follows a layer, for calculate_gain().
enum class Nonlinearity { linear, sigmoid, tanh, relu, leaky_relu };
/// Which fan the Kaiming initialisers preserve the variance of.
enum class FanMode { fan_in, fan_out };

/// torch.nn.init.calculate_gain; param is leaky_relu's negative slope.
double calculate_gain(Nonlinearity nl, double param = 0.01);
/// (fan_in, fan_out) of a tensor with at least 2 dims; ValueError otherwise.
std::pair<int64_t, int64_t> fans(const Tensor& t);

/// Fills t with U(low, high).
void uniform_(const Tensor& t, double low = 0.0, double high = 1.0, Generator* gen = nullptr);
/// Fills t with N(mean, std^2).
void normal_(const Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
/// Fills t with value.
void constant_(const Tensor& t, double value);
/// Fills t with 0.
void zeros_(const Tensor& t);
/// Fills t with 1.
void ones_(const Tensor& t);
/// Glorot: U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);
/// Glorot, normal: std = gain * sqrt(2 / (fan_in + fan_out)).
void xavier_normal_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);
/// He: U(-bound, bound), bound = gain(nl, a) * sqrt(3 / fan), fan chosen by mode.
void kaiming_uniform_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::fan_in,
                      Nonlinearity nl = Nonlinearity::leaky_relu, Generator* gen = nullptr);
/// He, normal: std = gain(nl, a) / sqrt(fan), fan chosen by mode.
void kaiming_normal_(const Tensor& t, double a = 0.0, FanMode mode = FanMode::fan_in,
                     Nonlinearity nl = Nonlinearity::leaky_relu, Generator* gen = nullptr);
/// A (semi-)orthogonal matrix (QR of a Gaussian matrix, signs fixed as torch),
/// scaled by gain; for recurrent weights. Tensors of rank > 2 are flattened
/// to (size(0), rest).
void orthogonal_(const Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace tg::nn::init
