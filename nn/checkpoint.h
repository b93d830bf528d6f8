#pragma once
/// \file
/// Checkpoints in the safetensors format, so they open in PyTorch and other
/// tools (https://github.com/huggingface/safetensors):
///
///     8 bytes   N, the header length (unsigned little-endian)
///     N bytes   JSON: {"__metadata__": {str: str}, name: {"dtype": "F32"|"F64"|"I64"|"BF16"|"F16",
///               "shape": [...], "data_offsets": [begin, end]}, ...}, padded with
///               spaces to a multiple of 8 bytes
///     the rest  the tensors' raw little-endian data; offsets count from here
///
///     nn::save(model, "gpt.safetensors", {{"step", "1000"}});
///     nn::save(model, "gpt-bf16.safetensors", {}, {.floats = nn::FloatStorage::bf16});  // half the size
///     auto meta = nn::load(model, "gpt.safetensors");  // either file: BF16 converts to the model's dtype
///
/// BF16 tensors load as DType::bf16; F16 tensors (IEEE half, which has no
/// DType here) load as float32, exactly.
///
/// Writes are atomic: the file is written to `<path>.tmp-<pid>`, flushed to disk,
/// renamed over `<path>` and the directory flushed, so a crash leaves either the
/// old checkpoint or the new one. A writer killed mid-save leaves its
/// `<path>.tmp-<pid>`: the next save or load of `<path>` removes the temporary
/// files of writers that no longer run (their pid is gone: writers of one
/// directory must share a pid namespace, as the processes of one machine do),
/// never a live writer's; loading reads `<path>` alone, never a temporary file.
/// Loading validates the whole file before anything is copied (sizes, JSON,
/// dtypes, shapes, offsets inside the data, no overlaps, no holes, no
/// duplicate names) and never reads out of bounds. It holds the file's bytes,
/// the tensors (an F16 tensor, as float32, at twice its size in the file)
/// and, while the header is parsed, up to ~30 bytes per byte of header: at
/// most ~32 times the file's size.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "../autograd/error.h"
#include "../autograd/tensor.h"

namespace tg::nn {

class Module;
class Optimizer;

/// A damaged, hostile or mismatched checkpoint, or a failed write. The message
/// names the file and the field.
struct CheckpointError : ValueError {
  using ValueError::ValueError;
};

/// How the save functions store float32 and float64 tensors.
enum class FloatStorage : uint8_t {
  as_is,  ///< F32 and F64, unchanged
  bf16,   ///< BF16: float32's range, 8 significant bits
  f16,    ///< F16 (IEEE half): 11 significant bits; magnitudes from 65520 become inf, up to 2^-25 zero
};

/// Options of save_tensors() and save(Module).
struct SaveOptions {
  /// float32 and float64 tensors are rounded to nearest even to this format,
  /// as PyTorch's .to(torch.bfloat16) and .half() round (float64 through
  /// float32, as they do); bfloat16 tensors are stored as BF16 and int64
  /// ones as I64 whatever it says (a bfloat16 stored as F16 would lose
  /// float32's range).
  FloatStorage floats = FloatStorage::as_is;
};

/// Writes named tensors (float32, float64, int64, bfloat16; names unique and non-empty).
void save_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {}, const SaveOptions& options = {});

/// What load_tensors() read: the named tensors and the metadata.
struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  ///< in file order (by data offset)
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"
  /// Each tensor's dtype in the file ("F32", "F64", "I64", "BF16", "F16") by
  /// name: an F16 tensor loads as float32, and only this tells it apart.
  std::map<std::string, std::string> stored_dtypes;
  const Tensor& at(const std::string& name) const;     ///< CheckpointError if absent
};
/// Reads every tensor of a safetensors file (CheckpointError naming the file
/// and the field when it is damaged). BF16 tensors come back as bfloat16, F16
/// ones as float32, the rest in their own dtype.
TensorFile load_tensors(const std::string& path);

/// A module's state_dict (parameters and buffers by dotted name).
void save(const Module& m, const std::string& path, const std::map<std::string, std::string>& metadata = {},
          const SaveOptions& options = {});

/// Options of load(Module).
struct LoadOptions {
  /// A tensor stored in another floating dtype (F32, F64, BF16, F16) than the
  /// module's tensor is converted to the module's, as PyTorch's
  /// load_state_dict converts silently: widening is exact, narrowing rounds
  /// to nearest even. Set it to false to refuse every dtype but the module's
  /// own (F16 counts as a dtype of its own): the CheckpointError then names
  /// the file, each such tensor and both dtypes. Integer and floating tensors
  /// never convert into each other.
  bool convert_dtype = true;
};
/// Copies a checkpoint into the module's existing tensors, after checking
/// that the names and shapes match exactly and that the dtypes are allowed
/// (see LoadOptions): one CheckpointError lists every missing, unexpected,
/// mis-shaped and refused key, and the module is left untouched. Returns the
/// metadata.
std::map<std::string, std::string> load(Module& m, const std::string& path, const LoadOptions& options = {});

/// An optimizer's state_dict (steps, learning rates, moments); the metadata
/// also records the optimizer's name, checked on load. Always at full
/// precision (no SaveOptions): moments or step counts rounded to 16 bits
/// would not resume training where it stopped.
void save(const Optimizer& opt, const std::string& path, const std::map<std::string, std::string>& metadata = {});
/// Restores an optimizer's state saved by save(), after checking the
/// optimizer's name and every tensor's name and shape. Returns the metadata.
std::map<std::string, std::string> load(Optimizer& opt, const std::string& path);

}  // namespace tg::nn
