// load_tensors on any bytes: a CheckpointError, or tensors that each hold
// exactly the bytes their shape and dtype need, all inside the file.
#include <cstdint>
#include <cstring>

#include "fuzz/fuzz.h"
#include "nn/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tg::fuzz::write_input(data, size);
  tg::nn::TensorFile file;
  if (!tg::fuzz::accepted([&] { file = tg::nn::load_tensors(path); })) return 0;
  uint64_t bytes = 0;
  for (const auto& [name, t] : file.tensors) {
    tg::fuzz::require(t.is_contiguous(), "a loaded tensor is contiguous");
    const size_t n = static_cast<size_t>(t.numel()) * tg::itemsize(t.dtype());
    bytes += n;
    // Reads every byte, so ASan sees any storage smaller than the shape says.
    const auto* p = static_cast<const unsigned char*>(t.storage()->data);
    unsigned char sum = 0;
    for (size_t i = 0; i < n; ++i) sum ^= p[i];
    asm volatile("" : : "r"(sum));
  }
  tg::fuzz::require(bytes <= size, "the tensors' data fits in the file");
  return 0;
}
