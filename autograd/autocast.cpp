#include "autograd/autocast.h"

#include <fmt/format.h>

#include "autograd/error.h"

namespace tg {
namespace {
thread_local DType current = DType::f32;
}  // namespace

DType autocast_dtype() { return current; }

AutocastGuard::AutocastGuard(DType dtype) : prev_(current) {
  if (dtype != DType::f32 && dtype != DType::bf16)
    throw DTypeError(fmt::format("AutocastGuard: GEMMs compute in float32 or bfloat16, not {}", dtype_name(dtype)));
  current = dtype;
}
AutocastGuard::~AutocastGuard() { current = prev_; }

namespace detail {
DType exchange_autocast_dtype(DType dtype) {
  DType prev = current;
  current = dtype;
  return prev;
}
}  // namespace detail

}  // namespace tg
