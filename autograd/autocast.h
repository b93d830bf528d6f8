#pragma once
/// \file
/// Autocast: mixed precision the way torch.autocast("cpu", dtype=torch.bfloat16)
/// does it. Under an AutocastGuard(DType::bf16) every float32 GEMM of the
/// library (matmul, linear, attention's two products, the recurrences' input
/// projections and per-step products, tied output heads — forward and
/// backward) rounds its operands to bfloat16 and multiplies them with float32
/// accumulation into a float32 result, and what a GEMM saves for its
/// backward it keeps as those bfloat16 copies (a parameter's copy is kept per
/// version, below); gelu, which in a transformer's MLP
/// reads the first GEMM's output (bfloat16 in torch.autocast), computes on
/// its input rounded to bfloat16 and saves that copy, and the LSTM recurrence
/// keeps its gate activations for backward in bfloat16. Everything else stays
/// float32: softmax and log_softmax, layer_norm, losses, reductions, exp and
/// log, and the optimizer, which updates float32 master weights.
///
///     tg::AutocastGuard bf16(tg::DType::bf16);
///     tg::Tensor loss = model.loss(tokens, targets);  // GEMMs in bfloat16
///     loss.backward();  // a node recorded under autocast runs its backward under it too
///
/// Leaf tensors that require grad (parameters) are rounded once per version:
/// once an op under autocast has recorded one, its bfloat16 copy is made at
/// its next GEMM and reused until an in-place write (the optimizer's step)
/// bumps the tensor's version. A product of few rows by such a copy (a
/// recurrence's per-step h W_hh^T) reads it packed in oneDNN's layout from
/// its second call in a row, kept per thread until the copy changes.
/// float64 GEMMs never change precision (gradcheck stays exact).
#include <string>

#include "dtype.h"

namespace tg {

/// What runs the GEMMs on this CPU, for reports (`lm_train --profile`,
/// `bench_gemm`). float32: for each shape class, the backend its GEMMs run on
/// (OpenBLAS or oneDNN) and the GFLOP/s both reached when the library timed
/// them on this CPU (it times any class not timed yet first, a few ms), or
/// the one backend `TAPEGRAD_GEMM_F32=openblas|onednn` forces. bfloat16:
/// oneDNN's instruction set and the kernel of its last bfloat16 GEMM, e.g.
/// whether bfloat16 products run on oneDNN or fell back to float32 on a CPU
/// without AVX-512.
std::string gemm_backend_info();

/// The precision this thread's float32 GEMMs compute in: f32 (autocast off,
/// the default) or bf16.
DType autocast_dtype();
/// True while an AutocastGuard(DType::bf16) is in force on this thread.
inline bool autocast_enabled() { return autocast_dtype() != DType::f32; }

/// Sets this thread's GEMM precision for its lifetime (thread-local, like
/// grad mode): DType::bf16 turns autocast on, DType::f32 turns it off inside
/// an autocast region. Any other dtype is a DTypeError.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype = DType::bf16);  ///< GEMMs in `dtype` (f32 or bf16) until destroyed
  ~AutocastGuard();  ///< restores the precision it found
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_;
};

class Tensor;
struct bfloat16;

namespace detail {
// Keeps a float32 leaf's storage in autocast's cache of bfloat16 copies (the
// engine calls it for the leaves a node records under autocast).
void autocast_keep(const Tensor& leaf);
// The bfloat16 copy of the float32 at p when p lies in a kept storage
// (rounded again first if the storage's version moved on since), else null.
// The copy mirrors the whole storage, so strides carry over unchanged. Given
// `generation`, sets it to a number that changes whenever the copy's values
// do, so what is made from them (oneDNN's packed weights) can be kept.
const bfloat16* autocast_cached(const float* p, uint64_t* generation = nullptr);
// For its lifetime, under autocast: GEMM operands that lie in t's storage
// (float32) are read from one bfloat16 copy of that storage, rounded here,
// rather than rounded again by every GEMM that reads them; gone with the
// scope. For a temporary that many GEMMs multiply by, as a recurrence's
// per-thread rows of W_hh are at every step. A storage kept already (a
// parameter's) is left to its own copy.
class RoundOnce {
 public:
  explicit RoundOnce(const Tensor& t);
  ~RoundOnce();
  RoundOnce(const RoundOnce&) = delete;
  RoundOnce& operator=(const RoundOnce&) = delete;

 private:
  const float* added_ = nullptr;  // the storage this scope added a copy of
};
// Sets the precision without checks: the engine (a node's backward runs
// under the precision it was recorded with) and the pool's workers (which
// take their caller's) use it.
DType exchange_autocast_dtype(DType dtype);
}  // namespace detail

}  // namespace tg
