#include "nn/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autograd/fault.h"
#include "autograd/atomic_file.h"
#include "nn/module.h"
#include "nn/optim/optimizer.h"

namespace tg::nn {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian: write a byte swap");

namespace {

// The reference implementation's limit: larger headers are refused unread.
constexpr uint64_t kMaxHeader = 100'000'000;
// Metadata key under which save(Optimizer) records the optimizer's name.
constexpr const char* kOptimizerKey = "tapegrad.optimizer";

// The safetensors dtypes read and written: the name in the header, bytes per
// element, the dtype a tensor of it loads as (F16 has no DType: it widens to
// float32, exactly) and its name in messages, as dtype_name() spells them.
struct StoredType {
  std::string_view name;
  size_t size;
  DType loads_as;
  std::string_view human;
};
constexpr StoredType kF32{"F32", 4, DType::f32, "float32"}, kF64{"F64", 8, DType::f64, "float64"},
    kI64{"I64", 8, DType::i64, "int64"}, kBF16{"BF16", 2, DType::bf16, "bfloat16"},
    kF16{"F16", 2, DType::f32, "float16"};
constexpr const StoredType* kStoredTypes[] = {&kF32, &kF64, &kI64, &kBF16, &kF16};

// What a tensor of dtype d is stored as under `floats`.
const StoredType& stored_type(DType d, FloatStorage floats) {
  if (d == DType::i64) return kI64;
  if (d == DType::bf16) return kBF16;  // never narrowed to F16: it would lose float32's range
  switch (floats) {
    case FloatStorage::as_is: return d == DType::f64 ? kF64 : kF32;
    case FloatStorage::bf16: return kBF16;
    case FloatStorage::f16: return kF16;
  }
  throw ValueError("save_tensors: unknown FloatStorage");
}

// "<path>: <what>: No space left on device (ENOSPC)".
[[noreturn]] void fail_errno(const std::string& path, const std::string& what) {
  throw CheckpointError(tg::detail::errno_message(path, what));
}

// ---- reading and validating

std::string read_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path, "cannot open");
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw CheckpointError(fmt::format("{}: not a regular file", path));
  }
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t k = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      ::close(fd);
      throw CheckpointError(fmt::format("{}: read {} of {} bytes (the file changed or could not be read)", path, got,
                                        bytes.size()));
    }
    got += static_cast<size_t>(k);
  }
  ::close(fd);
  return bytes;
}

struct Entry {
  std::string name;
  const StoredType* stored = &kF32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

// Checks the JSON header in one pass before it is parsed into a document:
// containers nest at most 3 deep (the header, a tensor, its shape) and no
// object repeats a key (a document would silently keep one of them). The
// callback of nlohmann's parser could check the same while parsing, but that
// parser rescans an object's members each time a nested object ends: a
// header of 20k tensors took 8 s.
class HeaderCheck : public nlohmann::json_sax<nlohmann::json> {
 public:
  explicit HeaderCheck(const std::string& path) : path_(path) {}
  bool start_object(size_t) override {
    open();
    keys_.emplace_back();
    return true;
  }
  bool key(string_t& k) override {
    if (!keys_.back().insert(k).second) throw CheckpointError(fmt::format("{}: header: duplicate key '{}'", path_, k));
    return true;
  }
  bool end_object() override {
    keys_.pop_back();
    --depth_;
    return true;
  }
  bool start_array(size_t) override {
    open();
    return true;
  }
  bool end_array() override {
    --depth_;
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw CheckpointError(fmt::format("{}: header: invalid JSON ({})", path_, e.what()));
  }

 private:
  void open() {
    if (++depth_ > 3) throw CheckpointError(fmt::format("{}: header: JSON nested deeper than safetensors allows", path_));
  }
  const std::string& path_;
  std::vector<std::set<std::string>> keys_;  // of each open object
  int depth_ = 0;
};

nlohmann::json parse_header(const std::string& path, std::string_view text) {
  HeaderCheck check(path);
  nlohmann::json::sax_parse(text.begin(), text.end(), &check);
  return nlohmann::json::parse(text.begin(), text.end());
}

uint64_t unsigned_field(const std::string& path, const std::string& name, const char* field,
                        const nlohmann::json& v) {
  if (!v.is_number_unsigned())
    throw CheckpointError(fmt::format("{}: tensor '{}': {} must hold non-negative integers, got {}", path, name,
                                      field, v.dump()));
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& path, const std::string& name, const nlohmann::json& v, uint64_t data_size) {
  if (!v.is_object()) throw CheckpointError(fmt::format("{}: tensor '{}': expected an object, got {}", path, name, v.dump()));
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!v.contains(field)) throw CheckpointError(fmt::format("{}: tensor '{}': missing field '{}'", path, name, field));
  Entry e;
  e.name = name;
  const auto& dt = v["dtype"];
  std::string dts = dt.is_string() ? dt.get<std::string>() : dt.dump();
  e.stored = nullptr;
  for (const StoredType* s : kStoredTypes)
    if (dt.is_string() && dts == s->name) e.stored = s;
  if (!e.stored)
    throw CheckpointError(fmt::format("{}: tensor '{}': dtype {} is not supported (F32, F64, I64, BF16, F16)", path,
                                      name, dt.dump()));

  const auto& shape = v["shape"];
  if (!shape.is_array()) throw CheckpointError(fmt::format("{}: tensor '{}': shape must be an array, got {}", path, name, shape.dump()));
  if (shape.size() > static_cast<size_t>(kMaxDims))
    throw CheckpointError(fmt::format("{}: tensor '{}': shape has rank {}, above the maximum of {}", path, name,
                                      shape.size(), kMaxDims));
  uint64_t numel = 1;
  bool overflow = false;
  for (const auto& d : shape) {
    uint64_t n = unsigned_field(path, name, "shape", d);
    overflow |= n > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, n, &numel);
    e.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(n, INT64_MAX)));
  }
  uint64_t bytes = 0;
  overflow |= __builtin_mul_overflow(numel, e.stored->size, &bytes) || numel > static_cast<uint64_t>(INT64_MAX);
  if (overflow)
    throw CheckpointError(fmt::format("{}: tensor '{}': shape {} has more elements than can be addressed", path, name,
                                      shape.dump()));

  const auto& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2)
    throw CheckpointError(fmt::format("{}: tensor '{}': data_offsets must be [begin, end], got {}", path, name, off.dump()));
  e.begin = unsigned_field(path, name, "data_offsets", off[0]);
  e.end = unsigned_field(path, name, "data_offsets", off[1]);
  if (e.begin > e.end || e.end > data_size)
    throw CheckpointError(fmt::format("{}: tensor '{}': data_offsets [{}, {}] lie outside the data section of {} bytes",
                                      path, name, e.begin, e.end, data_size));
  if (e.end - e.begin != bytes)
    throw CheckpointError(fmt::format("{}: tensor '{}': data_offsets [{}, {}] span {} bytes, but {} {} needs {}", path,
                                      name, e.begin, e.end, e.end - e.begin, dts, e.shape, bytes));
  return e;
}

// ---- conversions to and from the 16-bit formats

// Values converted per chunk: 256 KiB of float32, so a 16-bit save or an F16
// load needs no second full-size copy.
constexpr int64_t kChunk = 1 << 16;

// Writes c (contiguous) as `stored`: its own bytes, or its values rounded to
// BF16 or F16 (float64 rounds to float32 first, as PyTorch's conversions do).
void write_data(tg::detail::AtomicFile& file, const Tensor& c, const StoredType& stored) {
  const int64_t n = c.numel();
  if (n == 0) return;
  const char* src = static_cast<const char*>(c.storage()->data) + c.offset() * itemsize(c.dtype());
  if (stored.size == itemsize(c.dtype())) {  // as it is (a bfloat16 tensor is always stored so)
    file.write(src, static_cast<size_t>(n) * stored.size);
    return;
  }
  std::vector<float> wide(c.dtype() == DType::f64 ? static_cast<size_t>(std::min(n, kChunk)) : 0);
  std::vector<uint16_t> narrow(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t k = std::min(kChunk, n - i);
    const float* f = reinterpret_cast<const float*>(src) + i;
    if (c.dtype() == DType::f64) {
      const double* d = reinterpret_cast<const double*>(src) + i;
      for (int64_t j = 0; j < k; ++j) wide[j] = static_cast<float>(d[j]);
      f = wide.data();
    }
    if (&stored == &kBF16)
      float_to_bf16(f, reinterpret_cast<bfloat16*>(narrow.data()), k);
    else
      float_to_f16(f, narrow.data(), k);
    file.write(narrow.data(), static_cast<size_t>(k) * 2);
  }
}

// dst[i] = the F16 value at src + 2 i, widened to float32 (exactly), n values;
// through an aligned copy, since the data may start at any byte of the file.
void read_f16(const char* src, float* dst, int64_t n) {
  std::vector<uint16_t> half(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t k = std::min(kChunk, n - i);
    std::memcpy(half.data(), src + 2 * i, static_cast<size_t>(k) * 2);
    f16_to_float(half.data(), dst + i, k);
  }
}

// ---- what load(Module) allows

// float32, float64 and bfloat16 convert into each other; int64 into nothing.
bool holds_reals(DType d) { return d != DType::i64; }

const StoredType& stored_by_name(const std::string& name) {
  for (const StoredType* s : kStoredTypes)
    if (s->name == name) return *s;
  throw CheckpointError(fmt::format("no safetensors dtype '{}'", name));  // load_tensors names only these
}

}  // namespace

void save_tensors(const std::vector<std::pair<std::string, Tensor>>& tensors, const std::string& path,
                  const std::map<std::string, std::string>& metadata, const SaveOptions& options) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<std::pair<Tensor, const StoredType*>> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__" || header.contains(name))
      throw CheckpointError(fmt::format("{}: cannot save a tensor named '{}' (names must be unique and non-empty, not "
                                        "__metadata__)",
                                        path, name));
    if (!t.defined()) throw CheckpointError(fmt::format("{}: tensor '{}' is undefined", path, name));
    Tensor c = t.contiguous();
    const StoredType& stored = stored_type(c.dtype(), options.floats);
    const uint64_t bytes = static_cast<uint64_t>(c.numel()) * stored.size;
    header[name] = {{"dtype", stored.name}, {"shape", c.shape().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.emplace_back(c, &stored);
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not UTF-8
    throw CheckpointError(fmt::format("{}: cannot write the header: {}", path, e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // as the reference writer: data starts 8-byte aligned
  const uint64_t n = text.size();

  tg::detail::AtomicFile file(path, [](const std::string& message) { throw CheckpointError(message); });
  file.write(&n, sizeof n);
  file.write(text.data(), text.size());
  for (const auto& [c, stored] : data) write_data(file, c, *stored);
  file.commit();
}

const Tensor& TensorFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return t;
  throw CheckpointError(fmt::format("TensorFile: no tensor named '{}' among its {}", name, tensors.size()));
}

TensorFile load_tensors(const std::string& path) {
  tg::detail::remove_stale_temp_files(path);
  const std::string bytes = read_file(path);
  if (bytes.size() < 8)
    throw CheckpointError(fmt::format("{}: {} bytes, too short for the 8-byte header length", path, bytes.size()));
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  if (n > kMaxHeader || n > bytes.size() - 8)
    throw CheckpointError(fmt::format("{}: header length {} exceeds the file size of {} bytes (or the limit of {})",
                                      path, n, bytes.size(), kMaxHeader));
  std::string_view text(bytes.data() + 8, n);
  if (text.empty() || text[0] != '{')
    throw CheckpointError(fmt::format("{}: header does not start with '{{'", path));
  const uint64_t data_size = bytes.size() - 8 - n;
  TensorFile out;
  std::vector<Entry> entries;
  {  // The parsed header (up to ~30 bytes a byte of it) is freed before the tensors are made.
    nlohmann::json header = parse_header(path, text);
    if (!header.is_object()) throw CheckpointError(fmt::format("{}: header is not a JSON object", path));
    entries.reserve(header.size());
    for (const auto& [name, v] : header.items()) {
      if (name == "__metadata__") {
        if (!v.is_object())
          throw CheckpointError(fmt::format("{}: __metadata__ must be an object, got {}", path, v.dump()));
        for (const auto& [k, s] : v.items()) {
          if (!s.is_string())
            throw CheckpointError(fmt::format("{}: __metadata__ '{}' must be a string, got {}", path, k, s.dump()));
          out.metadata[k] = s.get<std::string>();
        }
        continue;
      }
      entries.push_back(parse_entry(path, name, v, data_size));
    }
  }
  // The tensors must tile the data section exactly: no overlaps, no holes.
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t expected = 0;
  for (size_t k = 0; k < entries.size(); ++k) {
    const Entry& e = entries[k];
    if (e.begin < expected)
      throw CheckpointError(fmt::format("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (ending at {})",
                                        path, e.name, e.begin, e.end, entries[k - 1].name, expected));
    if (e.begin > expected)
      throw CheckpointError(fmt::format("{}: tensor '{}': data_offsets [{}, {}] leave a hole of {} bytes at {}", path,
                                        e.name, e.begin, e.end, e.begin - expected, expected));
    expected = e.end;
  }
  if (expected != data_size)
    throw CheckpointError(fmt::format("{}: the tensors cover {} bytes of a data section of {} bytes", path, expected,
                                      data_size));
  const char* base = bytes.data() + 8 + n;
  out.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = empty(e.shape, e.stored->loads_as);
    if (e.stored == &kF16)
      read_f16(base + e.begin, static_cast<float*>(t.storage()->data), t.numel());
    else if (e.end > e.begin)
      std::memcpy(t.storage()->data, base + e.begin, e.end - e.begin);
    out.stored_dtypes[e.name] = std::string(e.stored->name);
    out.tensors.emplace_back(e.name, t);
  }
  return out;
}

void save(const Module& m, const std::string& path, const std::map<std::string, std::string>& metadata,
          const SaveOptions& options) {
  save_tensors(m.state_dict(), path, metadata, options);
}

std::map<std::string, std::string> load(Module& m, const std::string& path, const LoadOptions& options) {
  TensorFile file = load_tensors(path);
  auto state = m.state_dict();
  std::map<std::string, const Tensor*> in_file;
  for (const auto& [name, t] : file.tensors) in_file[name] = &t;
  std::vector<std::string> missing, unexpected, mismatched, refused;
  std::set<std::string> in_module;
  for (const auto& [name, t] : state) {
    in_module.insert(name);
    auto it = in_file.find(name);
    if (it == in_file.end()) {
      missing.push_back(name);
      continue;
    }
    const Tensor& src = *it->second;
    const StoredType& stored = stored_by_name(file.stored_dtypes.at(name));
    if (!(src.shape() == t.shape()) || holds_reals(src.dtype()) != holds_reals(t.dtype()))
      mismatched.push_back(fmt::format("{} (checkpoint {} {}, module {} {})", name, src.shape(), stored.human,
                                       t.shape(), dtype_name(t.dtype())));
    else if (!options.convert_dtype && &stored != &stored_type(t.dtype(), FloatStorage::as_is))
      refused.push_back(fmt::format("{} (checkpoint {}, module {})", name, stored.human, dtype_name(t.dtype())));
  }
  for (const auto& [name, t] : file.tensors)
    if (!in_module.count(name)) unexpected.push_back(name);
  if (!missing.empty() || !unexpected.empty() || !mismatched.empty() || !refused.empty()) {
    std::vector<std::string> parts;
    if (!missing.empty()) parts.push_back(fmt::format("missing keys: {}", fmt::join(missing, ", ")));
    if (!unexpected.empty()) parts.push_back(fmt::format("unexpected keys: {}", fmt::join(unexpected, ", ")));
    if (!mismatched.empty()) parts.push_back(fmt::format("mis-shaped keys: {}", fmt::join(mismatched, ", ")));
    if (!refused.empty())
      parts.push_back(fmt::format("keys of another dtype, not converted (LoadOptions::convert_dtype is false): {}",
                                  fmt::join(refused, ", ")));
    throw CheckpointError(fmt::format("{}: does not match {}: {}", path, m.type_name(), fmt::join(parts, "; ")));
  }
  NoGradGuard no_grad;
  for (const auto& [name, t] : state) t.copy_(*in_file.at(name));  // converts the dtype to the module's (RNE)
  return file.metadata;
}

void save(const Optimizer& opt, const std::string& path, const std::map<std::string, std::string>& metadata) {
  auto meta = metadata;
  meta[kOptimizerKey] = opt.name();
  save_tensors(opt.state_dict(), path, meta);
}

std::map<std::string, std::string> load(Optimizer& opt, const std::string& path) {
  TensorFile file = load_tensors(path);
  auto it = file.metadata.find(kOptimizerKey);
  if (it == file.metadata.end())
    throw CheckpointError(fmt::format("{}: not an optimizer state (no '{}' in its metadata)", path, kOptimizerKey));
  if (it->second != opt.name())
    throw CheckpointError(fmt::format("{}: holds {} state, cannot load it into {}", path, it->second, opt.name()));
  try {
    opt.load_state_dict(file.tensors);
  } catch (const ValueError& e) {
    throw CheckpointError(fmt::format("{}: {}", path, e.what()));
  }
  file.metadata.erase(it);
  return file.metadata;
}

}  // namespace tg::nn
