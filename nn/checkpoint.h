#pragma once
/// \file
/// Checkpoints in the safetensors format, so they open in PyTorch and other
/// tools (https://github.com/huggingface/safetensors):
///
///     8 bytes   N, the header length (unsigned little-endian)
///     N bytes   JSON: {"__metadata__": {str: str}, name: {"dtype": "F32"|"F64"|"I64",
///               "shape": [...], "data_offsets": [begin, end]}, ...}, padded with
///               spaces to a multiple of 8 bytes
///     the rest  the tensors' raw little-endian data; offsets count from here
///
///     nn::save(model, "gpt.safetensors", {{"step", "1000"}});
///     auto meta = nn::load(model, "gpt.safetensors");
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
/// the tensors and, while the header is parsed, up to ~30 bytes per byte of
/// header: at most ~32 times the file's size.
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

/// Writes named tensors (float32, float64, int64; names unique and non-empty).
void save_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {});

/// What load_tensors() read: the named tensors and the metadata.
struct TensorFile {
  std::vector<std::pair<std::string, Tensor>> tensors;  ///< in file order (by data offset)
  std::map<std::string, std::string> metadata;  ///< the header's "__metadata__"
  const Tensor& at(const std::string& name) const;     ///< CheckpointError if absent
};
/// Reads every tensor of a safetensors file (CheckpointError naming the file
/// and the field when it is damaged).
TensorFile load_tensors(const std::string& path);

/// A module's state_dict (parameters and buffers by dotted name).
void save(const Module& m, const std::string& path, const std::map<std::string, std::string>& metadata = {});
/// Copies a checkpoint into the module's existing tensors (converting float
/// dtypes to the module's), after checking that the names and shapes match
/// exactly: one CheckpointError lists every missing, unexpected and
/// mis-shaped key, and the module is left untouched. Returns the metadata.
std::map<std::string, std::string> load(Module& m, const std::string& path);

/// An optimizer's state_dict (steps, learning rates, moments); the metadata
/// also records the optimizer's name, checked on load.
void save(const Optimizer& opt, const std::string& path, const std::map<std::string, std::string>& metadata = {});
/// Restores an optimizer's state saved by save(), after checking the
/// optimizer's name and every tensor's name and shape. Returns the metadata.
std::map<std::string, std::string> load(Optimizer& opt, const std::string& path);

}  // namespace tg::nn
