// load_tensors on any bytes: a CheckpointError, or tensors that each hold
// exactly the bytes their shape and dtype need. Each tensor's stored dtype
// (TensorFile::stored_dtypes) is one of the five and matches the dtype it
// loaded as (BF16 as bfloat16, F16 widened to float32), and the stored sizes
// (elements x the stored dtype's size, not the loaded one: an F16 tensor takes
// twice its stored size in memory) tile the data section exactly: they add up
// to the file size less the 8-byte length and the header.
#include <cstdint>
#include <cstring>
#include <string_view>

#include "fuzz/fuzz.h"
#include "nn/checkpoint.h"

namespace {

// The safetensors dtypes: bytes per element in the file, the dtype loaded as.
struct Stored {
  std::string_view name;
  size_t size;
  tg::DType loads_as;
};
constexpr Stored kStored[] = {{"F32", 4, tg::DType::f32},
                              {"F64", 8, tg::DType::f64},
                              {"I64", 8, tg::DType::i64},
                              {"BF16", 2, tg::DType::bf16},
                              {"F16", 2, tg::DType::f32}};

const Stored* stored_as(const std::string& name) {
  for (const Stored& s : kStored)
    if (s.name == name) return &s;
  return nullptr;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = tg::fuzz::write_input(data, size);
  tg::nn::TensorFile file;
  if (!tg::fuzz::accepted([&] { file = tg::nn::load_tensors(path); })) return 0;
  // An accepted file has its 8-byte header length, and that many header bytes.
  tg::fuzz::require(size >= 8, "an accepted file holds the 8-byte header length");
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | data[i];
  tg::fuzz::require(header <= size - 8, "the header of an accepted file lies inside it");
  tg::fuzz::require(file.stored_dtypes.size() == file.tensors.size(),
                    "stored_dtypes names each tensor once, and nothing else");
  uint64_t stored_bytes = 0;
  for (const auto& [name, t] : file.tensors) {
    tg::fuzz::require(t.is_contiguous(), "a loaded tensor is contiguous");
    const auto it = file.stored_dtypes.find(name);
    tg::fuzz::require(it != file.stored_dtypes.end(), "stored_dtypes names every tensor");
    const Stored* stored = stored_as(it->second);
    tg::fuzz::require(stored != nullptr, "a stored dtype is F32, F64, I64, BF16 or F16");
    tg::fuzz::require(t.dtype() == stored->loads_as,
                      "a tensor loads as its stored dtype's (BF16 as bfloat16, F16 as float32)");
    const auto numel = static_cast<uint64_t>(t.numel());
    stored_bytes += numel * stored->size;  // at most t's own bytes, and the sum stays <= size: no overflow
    tg::fuzz::require(stored_bytes <= size, "the tensors' stored data fits in the file");
    // Reads every byte, so ASan sees any storage smaller than the shape says.
    const size_t n = static_cast<size_t>(numel) * tg::itemsize(t.dtype());
    const auto* p = static_cast<const unsigned char*>(t.storage()->data);
    unsigned char sum = 0;
    for (size_t i = 0; i < n; ++i) sum ^= p[i];
    asm volatile("" : : "r"(sum));
  }
  tg::fuzz::require(stored_bytes == size - 8 - header,
                    "the tensors' stored data tiles the data section exactly (no holes, no overlaps)");
  return 0;
}
