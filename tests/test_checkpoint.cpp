// safetensors checkpoints: round trips (float32, float64, int64, metadata),
// an independent parse of the raw bytes, modules and optimizers (training
// resumes to identical numbers), refusal of truncated, bit-flipped and
// hostile files with a CheckpointError naming the file and field, atomic
// writes that leave the old file intact when writing fails or the writer is
// killed, and removal of the temporary files that dead writers leave. The
// 16-bit formats (BF16, F16): round trips, modules saved in them, dtype
// refusals, damaged files, and PyTorch parity of the files and of the
// conversions (tests/fixtures/checkpoint_16bit.json and the two
// checkpoint_*.safetensors, written by make_checkpoint_16bit.py).
#define BOOST_TEST_MODULE checkpoint
#include <boost/test/unit_test.hpp>

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <numbers>
#include <random>

#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "nn/checkpoint.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "testing.h"

using namespace tg;
using namespace tg::testing;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file with the given header text and data bytes; n overrides the length field.
std::string raw_file(const std::string& header, const std::string& data, std::optional<uint64_t> n = {}) {
  uint64_t len = n.value_or(header.size());
  std::string out(8, '\0');
  std::memcpy(out.data(), &len, 8);
  return out + header + data;
}

// The reference tensors: every dtype, a scalar, an empty and a non-contiguous tensor.
std::vector<std::pair<std::string, Tensor>> reference_tensors() {
  return {
      {"f32", mul(arange(0.0, 6.0, 1.0, DType::f32), 0.5).reshape({2, 3})},
      {"f64", from_vector(std::vector<double>{std::numbers::pi, -std::numbers::e, 1e-300, 1e300}, {4})},
      {"i64", from_vector(std::vector<int64_t>{-1, int64_t{1} << 40, 3, -(int64_t{1} << 62)}, {2, 2})},
      {"scalar", scalar(7.25, DType::f64)},
      {"empty", zeros({0, 3})},
      {"transposed", from_vector(std::vector<float>{1, 2, 3, 4, 5, 6}, {2, 3}).t()},
  };
}
const std::map<std::string, std::string> kMeta = {{"step", "3"}, {"note", "h\xc3\xa9llo \"quoted\""}};

template <class T> std::vector<T> values(const Tensor& t) { return t.contiguous().to_vector<T>(); }

void check_same(const Tensor& a, const Tensor& b) {
  BOOST_TEST((a.dtype() == b.dtype()));
  BOOST_TEST(a.shape().vec() == b.shape().vec(), boost::test_tools::per_element());
  TG_DISPATCH_ALL(a.dtype(), "check_same", [&] {
    BOOST_TEST(values<scalar_t>(a) == values<scalar_t>(b), boost::test_tools::per_element());
  });
}

// Expects a CheckpointError whose message names the file and contains `field`.
void expect_refused(const std::string& path, const std::string& field) {
  try {
    nn::load_tensors(path);
    BOOST_ERROR("accepted a bad file, expected an error about " << field);
  } catch (const nn::CheckpointError& e) {
    std::string msg = e.what();
    BOOST_TEST(msg.find(path) != std::string::npos, "message lacks the path: " << msg);
    BOOST_TEST(msg.find(field) != std::string::npos, "message lacks '" << field << "': " << msg);
  }
}

// A module built by hand from nn/module.h: a weight, a bias and a buffer.
struct Tiny : nn::Module {
  Tensor w, b, count;
  explicit Tiny(uint64_t seed = 1, bool extra = false, int64_t out = 3) : Module("Tiny") {
    Generator gen(seed);
    w = register_parameter("w", randn({out, 4}, DType::f32, &gen));
    b = register_parameter("b", randn({out}, DType::f32, &gen));
    count = register_buffer("count", from_vector(std::vector<int64_t>{5}, {1}));
    if (extra) register_parameter("extra", zeros({2}));
  }
  // A non-quadratic loss, so optimizer state matters: sum(w^4)/4 + sum(b^3)/3 + sum(w).
  Tensor loss() const {
    Tensor w2 = mul(w, w);
    return add(add(mul(sum(mul(w2, w2)), 0.25), mul(sum(mul(mul(b, b), b)), 1.0 / 3)), sum(w));
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(round_trip_every_dtype_and_metadata) {
  TempDir tmp;
  const std::string path = tmp / "t.safetensors";
  auto tensors = reference_tensors();
  nn::save_tensors(tensors, path, kMeta);
  nn::TensorFile f = nn::load_tensors(path);
  BOOST_TEST(f.metadata == kMeta);
  BOOST_REQUIRE_EQUAL(f.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    BOOST_TEST(f.tensors[i].first == tensors[i].first);  // file order = data order = save order
    check_same(f.tensors[i].second, tensors[i].second);
  }
  check_same(f.at("i64"), tensors[2].second);
  BOOST_CHECK_THROW(f.at("nope"), nn::CheckpointError);
  // Tensors without elements come back as they went, contiguous (a fuzz finding:
  // a (0,0) tensor once loaded as non-contiguous).
  nn::save_tensors({{"a", zeros({0, 0})}, {"b", zeros({2, 0, 3}, DType::f64)}}, path);
  nn::TensorFile none = nn::load_tensors(path);
  BOOST_TEST(none.at("a").shape() == (Shape{0, 0}));
  BOOST_TEST(none.at("b").shape() == (Shape{2, 0, 3}));
  BOOST_TEST((none.at("a").is_contiguous() && none.at("b").is_contiguous()));
  // No metadata: no __metadata__ entry at all.
  nn::save_tensors({{"x", ones({2})}}, path);
  BOOST_TEST(nn::load_tensors(path).metadata.empty());
  BOOST_TEST(read_bytes(path).find("__metadata__") == std::string::npos);
}

BOOST_AUTO_TEST_CASE(raw_bytes_follow_the_format) {
  TempDir tmp;
  const std::string path = tmp / "t.safetensors";
  auto tensors = reference_tensors();
  nn::save_tensors(tensors, path, kMeta);
  if (const char* keep = std::getenv("TG_SAFETENSORS_OUT")) nn::save_tensors(tensors, keep, kMeta);  // for check_safetensors.py
  const std::string bytes = read_bytes(path);
  BOOST_REQUIRE_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int k = 7; k >= 0; --k) n = n << 8 | static_cast<unsigned char>(bytes[k]);  // little-endian, by hand
  BOOST_TEST(n % 8 == 0u);
  BOOST_REQUIRE_LE(8 + n, bytes.size());
  const std::string header = bytes.substr(8, n);
  BOOST_TEST(header.front() == '{');
  BOOST_TEST(header.find_last_not_of(' ') == header.find_last_of('}'));  // padded with spaces only
  json h = json::parse(header);
  BOOST_TEST(h["__metadata__"]["note"].get<std::string>() == kMeta.at("note"));
  BOOST_TEST(h["__metadata__"]["step"].get<std::string>() == "3");
  const char* data = bytes.data() + 8 + n;
  const uint64_t data_size = bytes.size() - 8 - n;
  uint64_t offset = 0;
  const std::map<std::string, std::string> dtypes = {{"f32", "F32"}, {"f64", "F64"}, {"i64", "I64"}, {"scalar", "F64"},
                                                     {"empty", "F32"}, {"transposed", "F32"}};
  for (const auto& [name, t] : tensors) {
    const json& e = h.at(name);
    BOOST_TEST(e["dtype"].get<std::string>() == dtypes.at(name));
    BOOST_TEST(e["shape"].get<std::vector<int64_t>>() == t.shape().vec(), boost::test_tools::per_element());
    auto off = e["data_offsets"].get<std::vector<uint64_t>>();
    BOOST_TEST(off[0] == offset);
    BOOST_TEST(off[1] - off[0] == static_cast<uint64_t>(t.numel()) * itemsize(t.dtype()));
    offset = off[1];
    TG_DISPATCH_ALL(t.dtype(), "raw", [&] {
      std::vector<scalar_t> got(t.numel());
      if (!got.empty()) std::memcpy(got.data(), data + off[0], off[1] - off[0]);
      BOOST_TEST(got == values<scalar_t>(t), boost::test_tools::per_element());
    });
  }
  BOOST_TEST(offset == data_size);
  BOOST_TEST(h.size() == tensors.size() + 1);
}

BOOST_AUTO_TEST_CASE(module_round_trip_converts_dtypes) {
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  Tiny a(1), b(2);
  nn::save(a, path, {{"kind", "tiny"}});
  {
    NoGradGuard ng;
    b.count.fill_(0);
  }
  auto meta = nn::load(b, path);
  BOOST_TEST(meta.at("kind") == "tiny");
  for (auto& [name, t] : a.state_dict()) {
    BOOST_TEST_CONTEXT(name) {
      Tensor other;
      for (auto& [n, u] : b.state_dict())
        if (n == name) other = u;
      check_same(t, other);
    }
  }
  BOOST_TEST(b.w.requires_grad());  // the handles the layers hold are the same tensors
  // A float64 module loads a float32 checkpoint, converting.
  Tiny c(3);
  c.to(DType::f64);
  nn::load(c, path);
  BOOST_TEST((c.w.dtype() == DType::f64));
  auto wf = values<float>(a.w);
  auto wd = values<double>(c.w);
  for (size_t i = 0; i < wf.size(); ++i) BOOST_TEST(wd[i] == static_cast<double>(wf[i]));
}

BOOST_AUTO_TEST_CASE(module_mismatch_lists_every_key_and_touches_nothing) {
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  Tiny a(1);
  nn::save(a, path);
  Tiny other(2, /*extra=*/true, /*out=*/5);
  auto before = values<float>(other.b);
  check_throws<nn::CheckpointError>([&] { nn::load(other, path); },
                                    {"missing keys: extra",
                                     "mis-shaped keys: w (checkpoint (3,4) float32, module (5,4) float32)",
                                     "b (checkpoint (3) float32, module (5) float32)", "m.safetensors"});
  BOOST_TEST(values<float>(other.b) == before, boost::test_tools::per_element());
  // Unexpected keys: a checkpoint with more than the module.
  Tiny big(1, true);
  nn::save(big, path);
  Tiny small(1);
  BOOST_CHECK_EXCEPTION(nn::load(small, path), nn::CheckpointError,
                        says<nn::CheckpointError>({"unexpected keys: extra"}));
}

BOOST_AUTO_TEST_CASE(optimizer_state_resumes_training_exactly) {
  TempDir tmp;
  const int total = 6, cut = 3;
  auto train = [](Tiny& m, nn::Optimizer& opt, int steps) {
    for (int s = 0; s < steps; ++s) {
      m.loss().backward();
      opt.step();
      opt.zero_grad();
    }
  };
  for (int kind = 0; kind < 3; ++kind) {
    BOOST_TEST_CONTEXT("optimizer " << kind) {
      auto make = [&](Tiny& m) -> std::unique_ptr<nn::Optimizer> {
        if (kind == 0) return std::make_unique<nn::AdamW>(nn::weight_decay_groups(m, 0.1), nn::AdamWOptions{.lr = 0.05});
        if (kind == 1) return std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.05, .momentum = 0.9, .nesterov = true});
        return std::make_unique<nn::RMSprop>(m.parameters(), nn::RMSpropOptions{.lr = 0.01, .momentum = 0.5, .centered = true});
      };
      Tiny full(7);
      auto full_opt = make(full);
      train(full, *full_opt, total);

      Tiny first(7);
      auto first_opt = make(first);
      train(first, *first_opt, cut);
      nn::save(first, tmp / "w.safetensors");
      nn::save(*first_opt, tmp / "s.safetensors", {{"step", std::to_string(cut)}});

      Tiny resumed(99);  // different initial weights: everything must come from the files
      auto opt = make(resumed);
      nn::load(resumed, tmp / "w.safetensors");
      auto meta = nn::load(*opt, tmp / "s.safetensors");
      BOOST_TEST(meta.at("step") == "3");
      BOOST_TEST(meta.size() == 1u);
      BOOST_TEST(opt->steps() == cut);
      train(resumed, *opt, total - cut);
      BOOST_TEST(values<float>(resumed.w) == values<float>(full.w), boost::test_tools::per_element());
      BOOST_TEST(values<float>(resumed.b) == values<float>(full.b), boost::test_tools::per_element());
      // Training moved the weights (the comparison above is not vacuous).
      BOOST_TEST(values<float>(full.w) != values<float>(Tiny(7).w));
    }
  }
  // A state file for another optimizer, or a module file, is refused by name.
  Tiny m(1);
  nn::Adam adam(m.parameters());
  nn::SGD sgd(m.parameters(), {.lr = 0.1, .momentum = 0.9});
  nn::save(sgd, tmp / "sgd.safetensors");
  BOOST_CHECK_EXCEPTION(nn::load(adam, tmp / "sgd.safetensors"), nn::CheckpointError,
                        says<nn::CheckpointError>({"holds SGD state, cannot load it into Adam"}));
  nn::save(m, tmp / "m.safetensors");
  BOOST_CHECK_THROW(nn::load(adam, tmp / "m.safetensors"), nn::CheckpointError);
  nn::SGD plain(m.parameters(), {.lr = 0.1});
  m.loss().backward();
  sgd.step();
  nn::save(sgd, tmp / "sgd.safetensors");
  BOOST_CHECK_EXCEPTION(nn::load(plain, tmp / "sgd.safetensors"), nn::CheckpointError,
                        says<nn::CheckpointError>({"unexpected key '0.0.momentum_buffer'"}));
}

BOOST_AUTO_TEST_CASE(truncated_files_are_refused) {
  TempDir tmp;
  const std::string good = tmp / "good.safetensors", bad = tmp / "bad.safetensors";
  nn::save_tensors(reference_tensors(), good, kMeta);
  const std::string bytes = read_bytes(good);
  write_bytes(bad, bytes);
  for (size_t len = bytes.size(); len-- > 0;) {  // every proper prefix, shrinking the file in place
    fs::resize_file(bad, len);
    BOOST_CHECK_THROW(nn::load_tensors(bad), nn::CheckpointError);
  }
  write_bytes(bad, bytes + "x");  // trailing bytes no tensor covers
  expect_refused(bad, "cover");
}

BOOST_AUTO_TEST_CASE(bit_flipped_headers_are_refused_or_harmless) {
  TempDir tmp;
  const std::string good = tmp / "good.safetensors", bad = tmp / "bad.safetensors";
  auto tensors = reference_tensors();
  nn::save_tensors(tensors, good, kMeta);
  const std::string bytes = read_bytes(good);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  int refused = 0, accepted = 0;
  write_bytes(bad, bytes);
  int fd = ::open(bad.c_str(), O_WRONLY);
  BOOST_REQUIRE(fd >= 0);
  for (size_t pos = 0; pos < 8 + n; ++pos)
    for (int bit = 0; bit < 8; ++bit) {
      char c = static_cast<char>(bytes[pos] ^ (1 << bit));
      BOOST_REQUIRE(::pwrite(fd, &c, 1, static_cast<off_t>(pos)) == 1);
      try {
        nn::TensorFile f = nn::load_tensors(bad);
        // Only a flip inside a name, a metadata string or the shape of an
        // empty tensor can survive: the data is intact.
        ++accepted;
        BOOST_REQUIRE_EQUAL(f.tensors.size(), tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i)
          if (tensors[i].second.numel() > 0)
            check_same(f.tensors[i].second, tensors[i].second);
          else
            BOOST_TEST(f.tensors[i].second.numel() == 0);
      } catch (const nn::CheckpointError&) {
        ++refused;
      }
      BOOST_REQUIRE(::pwrite(fd, &bytes[pos], 1, static_cast<off_t>(pos)) == 1);
    }
  ::close(fd);
  BOOST_TEST_MESSAGE("bit flips in the header: " << refused << " refused, " << accepted << " harmless");
  BOOST_TEST(refused > 4 * accepted);
  // Flips that must be refused: the length, the opening brace, a dtype, an offset digit.
  auto flip_at = [&](size_t pos, int bit) {
    std::string f = bytes;
    f[pos] = static_cast<char>(f[pos] ^ (1 << bit));
    write_bytes(bad, f);
  };
  flip_at(7, 7);
  expect_refused(bad, "header length");
  flip_at(8, 1);
  expect_refused(bad, "'{'");
  flip_at(8 + bytes.substr(8).find("F64") + 2, 1);  // F64 -> F66
  expect_refused(bad, "dtype");
  flip_at(8 + bytes.substr(8).find("[24,56]") + 1, 0);  // f64's begin 24 -> 34
  expect_refused(bad, "data_offsets");
}

BOOST_AUTO_TEST_CASE(hostile_headers_are_refused) {
  TempDir tmp;
  const std::string p = tmp / "h.safetensors";
  const std::string d8(8, '\0');
  auto check = [&](const std::string& file, const std::string& field) {
    write_bytes(p, file);
    expect_refused(p, field);
  };
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  write_bytes(p, raw_file(ok, d8));
  BOOST_TEST(nn::load_tensors(p).at("a").numel() == 2);  // the baseline is valid

  check(raw_file(ok, d8, uint64_t{1} << 63), "header length");
  check(raw_file(ok, d8, ok.size() + 9), "header length");
  check(raw_file("", ""), "'{'");
  check(raw_file(R"(["a"])", ""), "'{'");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", d8), "invalid JSON");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}})", d8), "outside the data section");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", d8), "data_offsets");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", d8), "data_offsets");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,9]}})", d8), "data_offsets");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0.0,8]}})", d8), "data_offsets");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,8]}})", d8), "span 8 bytes");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 std::string(12, '\0')),
        "overlap");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 std::string(12, '\0')),
        "hole");
  check(raw_file(R"({"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", d8), "dtype \"I32\"");
  check(raw_file(R"({"a":{"dtype":"bf16","shape":[4],"data_offsets":[0,8]}})", d8), "dtype \"bf16\"");
  check(raw_file(R"({"a":{"dtype":5,"shape":[2],"data_offsets":[0,8]}})", d8), "dtype 5");
  check(raw_file(R"({"a":{"shape":[2],"data_offsets":[0,8]}})", d8), "missing field 'dtype'");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", d8),
        "more elements than can be addressed");
  check(raw_file(R"({"a":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", d8),
        "more elements than can be addressed");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", d8), "shape");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]}})", d8), "rank 9");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8),
        "duplicate key 'a'");
  check(raw_file(R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", d8), "__metadata__ 'k'");
  check(raw_file(R"({"a":[[[[[[1]]]]]]})", ""), "nested");
  check(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8e400]}})", d8), "invalid JSON");
  check(raw_file(R"({"a":"x"})", ""), "tensor 'a'");
  write_bytes(p, "short");
  expect_refused(p, "too short");
  BOOST_CHECK_THROW(nn::load_tensors(tmp / "absent.safetensors"), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::load_tensors(tmp.path.string()), nn::CheckpointError);  // a directory
}

BOOST_AUTO_TEST_CASE(failed_writes_leave_the_old_file_intact) {
  TempDir tmp;
  const std::string path = tmp / "c.safetensors";
  nn::save_tensors({{"old", ones({3})}}, path);
  const std::string old = read_bytes(path);
  auto big = std::vector<std::pair<std::string, Tensor>>{{"new", zeros({100000})}};

  // The temporary file cannot be created (a directory occupies its name).
  const std::string tmp_name = fmt::format("{}.tmp-{}", path, ::getpid());
  fs::create_directory(tmp_name);
  BOOST_CHECK_EXCEPTION(nn::save_tensors(big, path), nn::CheckpointError,
                        says<nn::CheckpointError>({tmp_name}));
  BOOST_TEST(read_bytes(path) == old);
  fs::remove(tmp_name);

  // The disk "fills" mid-write: a file-size limit makes write() fail with EFBIG.
  rlimit saved;
  BOOST_REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
  auto prev_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 4096;
  BOOST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
  bool threw = false;
  try {
    nn::save_tensors(big, path);
  } catch (const nn::CheckpointError& e) {
    threw = std::string(e.what()).find("write failed") != std::string::npos;
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, prev_handler);
  BOOST_TEST(threw);
  BOOST_TEST(read_bytes(path) == old);
  BOOST_TEST(!fs::exists(tmp_name));  // the partial temporary file is removed
  BOOST_TEST(nn::load_tensors(path).at("old").numel() == 3);

  // A missing directory, bad names and undefined tensors.
  BOOST_CHECK_THROW(nn::save_tensors(big, tmp / "no/such/dir.safetensors"), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::save_tensors({{"a", ones({1})}, {"a", ones({1})}}, path), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::save_tensors({{"", ones({1})}}, path), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::save_tensors({{"__metadata__", ones({1})}}, path), nn::CheckpointError);
  BOOST_CHECK_THROW(nn::save_tensors({{"u", Tensor()}}, path), nn::CheckpointError);
  BOOST_TEST(read_bytes(path) == old);
  // A successful save replaces it.
  nn::save_tensors(big, path);
  BOOST_TEST(nn::load_tensors(path).at("new").numel() == 100000);
}

BOOST_AUTO_TEST_CASE(many_tensors_load_in_linear_time) {
  // 50k tensors: nlohmann's parser with a callback rescans the header's
  // members whenever a tensor's object ends, which took 8 s for 20k tensors
  // and would take about a minute here; one pass takes well under a second.
  TempDir tmp;
  const std::string path = tmp / "many.safetensors";
  std::string header = "{";
  for (int i = 0; i < 50000; ++i)
    header += fmt::format(R"({}"t{}":{{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", i ? "," : "", i);
  write_bytes(path, raw_file(header + "}", ""));
  const auto start = std::chrono::steady_clock::now();
  const nn::TensorFile file = nn::load_tensors(path);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  BOOST_TEST(file.tensors.size() == 50000u);
  BOOST_TEST(seconds < 15.0, "50k tensors took " << seconds << " s to load");
}

namespace {

// The pid of a process that ran and is gone (exited and reaped: a zombie
// would still answer kill(pid, 0)).
pid_t gone_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

std::string temp_name(const std::string& path, pid_t pid) { return fmt::format("{}.tmp-{}", path, pid); }

}  // namespace

BOOST_AUTO_TEST_CASE(stale_temp_files_of_dead_writers_are_removed) {
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  nn::save_tensors(reference_tensors(), path);
  const std::string saved = read_bytes(path);
  const pid_t gone = gone_pid();
  const pid_t live = ::fork();  // a writer that is still running
  if (live == 0) {
    ::pause();
    ::_exit(0);
  }
  const std::string stale = temp_name(path, gone);
  write_bytes(stale, "partial");
  nn::save_tensors(reference_tensors(), path);  // a save removes it
  BOOST_TEST(!fs::exists(stale));
  BOOST_TEST(read_bytes(path) == saved);

  // And so does a load; never removed: a live writer's file, this process's
  // own, and names that are not exactly <path>.tmp-<pid>.
  const std::vector<std::string> kept = {temp_name(path, live), temp_name(path, ::getpid()), stale + "x",
                                         tmp / fmt::format("m.safetensors.tmp-0{}", gone),
                                         tmp / fmt::format("other.safetensors.tmp-{}", gone), path + ".tmp-"};
  for (const auto& f : kept) write_bytes(f, "partial");
  write_bytes(stale, "partial");
  nn::load_tensors(path);
  BOOST_TEST(!fs::exists(stale));
  for (const auto& f : kept) BOOST_TEST(read_bytes(f) == "partial", f);

  // A missing checkpoint beside a dead writer's temporary file: the load is
  // refused (the temporary file is never taken for the checkpoint) and the
  // file is removed all the same.
  fs::remove(path);
  write_bytes(stale, saved);
  BOOST_CHECK_EXCEPTION(nn::load_tensors(path), nn::CheckpointError, says<nn::CheckpointError>({path}));
  BOOST_TEST(!fs::exists(stale));
  ::kill(live, SIGKILL);
  ::waitpid(live, nullptr, 0);
}

BOOST_AUTO_TEST_CASE(killed_writers_leave_the_old_or_the_new_checkpoint) {
  // A child saves two contents A and B (1 MiB each) to one path in turn and
  // is killed with SIGKILL at a random moment, 40 times. After each kill the
  // path holds A or B, byte for byte, and the next load (even kills) or save
  // (odd kills) removes the dead writer's temporary file.
  TempDir tmp;
  const std::string path = tmp / "ckpt.safetensors";
  const Tensor a = arange(0.0, 262144.0, 1.0, DType::f32), b = neg(a);
  nn::save_tensors({{"x", b}}, path);
  const std::string bytes_b = read_bytes(path);
  nn::save_tensors({{"x", a}}, path);
  const std::string bytes_a = read_bytes(path);
  std::mt19937 rng(20261123);
  int with_temp = 0, saw_a = 0, saw_b = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int kill = 0; kill < 40; ++kill) {
    const pid_t writer = ::fork();
    if (writer == 0) {  // never returns into the test runner
      try {
        for (int i = 0;; ++i) nn::save_tensors({{"x", i % 2 ? a : b}}, path);
      } catch (...) {
        ::_exit(1);
      }
    }
    ::usleep(std::uniform_int_distribution<int>(0, 40000)(rng));
    ::kill(writer, SIGKILL);
    ::waitpid(writer, nullptr, 0);
    const std::string temp = temp_name(path, writer);
    with_temp += fs::exists(temp);
    const std::string now = read_bytes(path);
    BOOST_TEST((now == bytes_a || now == bytes_b), "kill " << kill << ": the checkpoint is neither A nor B");
    saw_a += now == bytes_a;
    saw_b += now == bytes_b;
    if (kill % 2 == 0) {
      const Tensor x = nn::load_tensors(path).at("x");
      BOOST_TEST((x.to_vector<float>() == (now == bytes_a ? a : b).to_vector<float>()));
    } else {
      nn::save_tensors({{"x", a}}, path);
    }
    BOOST_TEST(!fs::exists(temp), "kill " << kill << ": " << temp << " is left behind");
  }
  BOOST_TEST_MESSAGE(fmt::format("40 kills in {:.1f} s: {} left a temporary file; the checkpoint held A {} times, B {}",
                                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                                 with_temp, saw_a, saw_b));
  // The kills did land mid-save, and the writer completed saves in between.
  BOOST_TEST(with_temp > 0);
  BOOST_TEST(saw_b > 0);
}

// ---- the 16-bit formats: BF16 and F16

namespace {

const std::string kTorchBF16 = "tests/fixtures/checkpoint_bf16.safetensors";
const std::string kTorchF16 = "tests/fixtures/checkpoint_f16.safetensors";
// torch's tensors: [{name, shape, source_dtype, source_bits, bf16_bits, bf16_as_f32_bits, f16_bits,
// f16_as_f32_bits, labels (for "special")}, ...], in file order.
const json& torch_tensors() { return fixture("tests/fixtures/checkpoint_16bit.json")["tensors"]; }

// The bits of t's elements, row-major (U as wide as t's element type).
template <class U> std::vector<U> bits_of(const Tensor& t) {
  std::vector<U> out(static_cast<size_t>(t.numel()));
  TG_DISPATCH_ALL(t.dtype(), "bits_of", [&] {
    BOOST_REQUIRE(sizeof(scalar_t) == sizeof(U));
    const auto v = values<scalar_t>(t);
    if (!v.empty()) std::memcpy(out.data(), v.data(), v.size() * sizeof(U));
  });
  return out;
}

// A tensor of element type T whose elements have the given bits.
template <class T, class U> Tensor from_bits(const std::vector<U>& bits, const Shape& shape) {
  static_assert(sizeof(T) == sizeof(U));
  std::vector<T> v(bits.size());
  if (!v.empty()) std::memcpy(static_cast<void*>(v.data()), bits.data(), bits.size() * sizeof(U));
  return from_vector(v, shape);
}

template <class U> std::vector<U> json_bits(const json& c, const char* key) { return c.at(key).get<std::vector<U>>(); }

// A fixture tensor's source: float32 or float64, from its bits.
Tensor source_of(const json& c) {
  if (c["source_dtype"] == "F64") return from_bits<double>(json_bits<uint64_t>(c, "source_bits"), shape_of(c));
  return from_bits<float>(json_bits<uint32_t>(c, "source_bits"), shape_of(c));
}

// What element i of a fixture tensor is, for failure messages.
std::string label(const json& c, size_t i) {
  std::string at = fmt::format("{}[{}]", c["name"].get<std::string>(), i);
  return c.contains("labels") ? at + " (" + c["labels"][i].get<std::string>() + ")" : at;
}

bool bf16_nan(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }
bool f16_nan(uint16_t b) { return (b & 0x7fffu) > 0x7c00u; }

// got == want bit for bit, except that where want is a NaN got need only be
// one: PyTorch 1.13 writes every float32 NaN as BF16 0xFFFF (0x7FC0 from
// float64) and drops F16 NaN payloads, where tapegrad's converters keep the
// sign and the payload's top bits. Returns how many NaNs differ in their bits.
int check_bits16(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, bool (*is_nan)(uint16_t),
                 const std::function<std::string(size_t)>& what) {
  BOOST_REQUIRE_EQUAL(got.size(), want.size());
  int nan_encodings = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (is_nan(want[i])) {
      BOOST_TEST(is_nan(got[i]), what(i) << ": 0x" << std::hex << got[i] << " is not a NaN");
      nan_encodings += got[i] != want[i];
    } else {
      BOOST_TEST(got[i] == want[i], what(i) << ": 0x" << std::hex << got[i] << ", PyTorch 0x" << want[i]);
    }
  }
  return nan_encodings;
}

// The 16-bit data section of a safetensors file whose tensors are all BF16 or F16.
std::vector<uint16_t> data16(const std::string& bytes) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  std::vector<uint16_t> out((bytes.size() - 8 - n) / 2);
  std::memcpy(out.data(), bytes.data() + 8 + n, out.size() * 2);
  return out;
}

// The header of a safetensors file, parsed.
json header_of(const std::string& path) {
  const std::string bytes = read_bytes(path);
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  return json::parse(bytes.substr(8, n));
}

// A module whose parameters are the fixture's tensors (zeros of their shapes).
struct FixtureModule : nn::Module {
  explicit FixtureModule(DType dtype) : Module("FixtureModule") {
    for (const json& c : torch_tensors()) register_parameter(c["name"].get<std::string>(), zeros(shape_of(c), dtype));
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(converters_match_pytorch_bit_for_bit) {
  // float_to_bf16 and float_to_f16 against torch's .to(torch.bfloat16) and
  // .half() of the same float32 values (float64 ones rounded to float32
  // first, as torch does); the widenings against torch's .float().
  int nan_encodings = 0, values_checked = 0;
  for (const json& c : torch_tensors()) {
    BOOST_TEST_CONTEXT(c["name"].get<std::string>()) {
      const std::vector<float> f = values<float>(source_of(c).to(DType::f32));
      const int64_t n = static_cast<int64_t>(f.size());
      values_checked += static_cast<int>(n);
      const auto what = [&](size_t i) { return label(c, i); };

      std::vector<bfloat16> b(f.size());
      float_to_bf16(f.data(), b.data(), n);
      std::vector<uint16_t> b_bits(f.size());
      for (size_t i = 0; i < f.size(); ++i) {
        b_bits[i] = b[i].bits;
        BOOST_TEST(bfloat16(f[i]).bits == b[i].bits, what(i) << ": the scalar and the vector rounding differ");
      }
      nan_encodings += check_bits16(b_bits, json_bits<uint16_t>(c, "bf16_bits"), bf16_nan, what);

      std::vector<uint16_t> h(f.size());
      float_to_f16(f.data(), h.data(), n);
      nan_encodings += check_bits16(h, json_bits<uint16_t>(c, "f16_bits"), f16_nan, what);

      // Widening torch's own 16-bit values: exact, NaNs included.
      const auto torch_b = json_bits<uint16_t>(c, "bf16_bits"), torch_h = json_bits<uint16_t>(c, "f16_bits");
      std::vector<float> wide(f.size());
      bf16_to_float(reinterpret_cast<const bfloat16*>(torch_b.data()), wide.data(), n);
      BOOST_TEST(bits_of<uint32_t>(from_vector(wide, {n})) == json_bits<uint32_t>(c, "bf16_as_f32_bits"),
                 boost::test_tools::per_element());
      f16_to_float(torch_h.data(), wide.data(), n);
      BOOST_TEST(bits_of<uint32_t>(from_vector(wide, {n})) == json_bits<uint32_t>(c, "f16_as_f32_bits"),
                 boost::test_tools::per_element());
    }
  }
  BOOST_TEST(values_checked == 116);  // the fixture is all there
  BOOST_TEST_MESSAGE(values_checked << " values match PyTorch's roundings; " << nan_encodings
                                    << " NaNs are encoded differently (still NaNs)");
  // The fixture's special values do cover what they say: F16 subnormals, overflow to inf, NaNs.
  const auto h = json_bits<uint16_t>(torch_tensors()[0], "f16_bits");
  BOOST_TEST(std::count_if(h.begin(), h.end(), [](uint16_t v) { return v && (v & 0x7c00u) == 0; }) >= 5);
  BOOST_TEST(std::count(h.begin(), h.end(), uint16_t{0x7c00}) >= 4);
  BOOST_TEST(std::count_if(h.begin(), h.end(), f16_nan) == 4);
}

BOOST_AUTO_TEST_CASE(converters_round_trip_every_16_bit_pattern) {
  // Widening is exact, so narrowing it again gives back every non-NaN pattern.
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  std::vector<float> wide(all.size());
  std::vector<uint16_t> back(all.size());
  bf16_to_float(reinterpret_cast<const bfloat16*>(all.data()), wide.data(), 65536);
  float_to_bf16(wide.data(), reinterpret_cast<bfloat16*>(back.data()), 65536);
  int wrong = 0;
  for (size_t i = 0; i < all.size(); ++i) wrong += bf16_nan(all[i]) ? !bf16_nan(back[i]) : back[i] != all[i];
  BOOST_TEST(wrong == 0);
  f16_to_float(all.data(), wide.data(), 65536);
  float_to_f16(wide.data(), back.data(), 65536);
  wrong = 0;
  for (size_t i = 0; i < all.size(); ++i) wrong += f16_nan(all[i]) ? !f16_nan(back[i]) : back[i] != all[i];
  BOOST_TEST(wrong == 0);
  // F16's landmarks, by value.
  BOOST_TEST(wide[0x0001] == std::ldexp(1.0f, -24));        // the smallest subnormal
  BOOST_TEST(wide[0x03ff] == std::ldexp(1023.0f, -24));     // the largest subnormal
  BOOST_TEST(wide[0x0400] == std::ldexp(1.0f, -14));        // the smallest normal
  BOOST_TEST(wide[0x7bff] == 65504.0f);                     // the largest normal
  BOOST_TEST(wide[0xfc00] == -std::numeric_limits<float>::infinity());
  BOOST_TEST(std::signbit(wide[0x8000]));
}

BOOST_AUTO_TEST_CASE(pytorch_16_bit_files_load_bit_for_bit) {
  const json& expected = torch_tensors();
  for (const auto& [path, stored] : {std::pair{kTorchBF16, "BF16"}, std::pair{kTorchF16, "F16"}}) {
    BOOST_TEST_CONTEXT(path) {
      const nn::TensorFile file = nn::load_tensors(path);
      BOOST_TEST(file.metadata == (std::map<std::string, std::string>{{"format", "pt"}}));
      BOOST_REQUIRE_EQUAL(file.tensors.size(), expected.size());
      for (size_t k = 0; k < expected.size(); ++k) {
        const json& c = expected[k];
        const auto& [name, t] = file.tensors[k];
        BOOST_TEST(name == c["name"].get<std::string>());
        BOOST_TEST(file.stored_dtypes.at(name) == stored);
        BOOST_TEST(t.shape() == shape_of(c));
        if (std::string(stored) == "BF16") {
          BOOST_TEST((t.dtype() == DType::bf16));
          BOOST_TEST(bits_of<uint16_t>(t) == json_bits<uint16_t>(c, "bf16_bits"), boost::test_tools::per_element());
          BOOST_TEST(bits_of<uint32_t>(t.to(DType::f32)) == json_bits<uint32_t>(c, "bf16_as_f32_bits"),
                     boost::test_tools::per_element());
        } else {  // F16 loads as float32, exactly as torch's .float() widens it
          BOOST_TEST((t.dtype() == DType::f32));
          BOOST_TEST(bits_of<uint32_t>(t) == json_bits<uint32_t>(c, "f16_as_f32_bits"), boost::test_tools::per_element());
        }
      }
      // Into float32 and float64 modules (the default converts).
      for (DType dtype : {DType::f32, DType::f64}) {
        FixtureModule m(dtype);
        nn::load(m, path);
        const auto named = m.named_parameters();
        for (size_t k = 0; k < expected.size(); ++k) {
          const json& c = expected[k];
          BOOST_REQUIRE(named[k].first == c["name"].get<std::string>());
          const Tensor want =
              from_bits<float>(json_bits<uint32_t>(c, std::string(stored) == "BF16" ? "bf16_as_f32_bits" : "f16_as_f32_bits"),
                               shape_of(c));
          BOOST_TEST((named[k].second.dtype() == dtype));
          if (dtype == DType::f32)
            BOOST_TEST(bits_of<uint32_t>(named[k].second) == bits_of<uint32_t>(want), boost::test_tools::per_element());
          else
            BOOST_TEST(bits_of<uint64_t>(named[k].second) == bits_of<uint64_t>(want.to(DType::f64)),
                       boost::test_tools::per_element());
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(pytorch_16_bit_files_written_back_byte_for_byte) {
  // The writer's header is the format's compact layout, as the fixture script
  // writes it: the same tensors in the same order give the same file.
  TempDir tmp;
  const std::string out = tmp / "out.safetensors";
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  // What was loaded, saved again: BF16 as it is, F16 (loaded as float32) narrowed again.
  const nn::TensorFile bf16 = nn::load_tensors(kTorchBF16);
  nn::save_tensors(bf16.tensors, out, bf16.metadata);
  BOOST_TEST(read_bytes(out) == read_bytes(kTorchBF16));
  const nn::TensorFile f16 = nn::load_tensors(kTorchF16);
  nn::save_tensors(f16.tensors, out, f16.metadata, {.floats = nn::FloatStorage::f16});
  BOOST_TEST(read_bytes(out) == read_bytes(kTorchF16));

  // The float32 and float64 sources, rounded by the writer: the headers are
  // identical, the data too but for the NaNs' encodings.
  std::vector<std::pair<std::string, Tensor>> sources;
  std::vector<std::string> labels;
  for (const json& c : torch_tensors()) {
    sources.emplace_back(c["name"].get<std::string>(), source_of(c));
    for (size_t i = 0; i < c["source_bits"].size(); ++i) labels.push_back(label(c, i));
  }
  const auto what = [&](size_t i) { return labels.at(i); };
  for (const auto& [torch_file, floats, is_nan] :
       {std::tuple{kTorchBF16, nn::FloatStorage::bf16, &bf16_nan}, std::tuple{kTorchF16, nn::FloatStorage::f16, &f16_nan}}) {
    BOOST_TEST_CONTEXT(torch_file) {
      nn::save_tensors(sources, out, meta, {.floats = floats});
      const std::string got = read_bytes(out), want = read_bytes(torch_file);
      BOOST_REQUIRE_EQUAL(got.size(), want.size());
      uint64_t n;
      std::memcpy(&n, want.data(), 8);
      BOOST_TEST(got.substr(0, 8 + n) == want.substr(0, 8 + n));
      const int nan_encodings = check_bits16(data16(got), data16(want), is_nan, what);
      BOOST_TEST_MESSAGE(torch_file << ": " << nan_encodings << " NaNs encoded differently from PyTorch's");
    }
  }
}

BOOST_AUTO_TEST_CASE(bf16_tensors_round_trip_bit_identical) {
  TempDir tmp;
  const std::string path = tmp / "b.safetensors";
  // Every kind of pattern: zeros, a subnormal, the largest finite, infinities,
  // NaNs of both signs, a signalling NaN; then ordinary values, a transposed
  // (non-contiguous) and an empty tensor.
  const std::vector<uint16_t> patterns = {0x0000, 0x8000, 0x0001, 0x7f7f, 0x7f80, 0xff80, 0x7fc0, 0xffff, 0x7f81, 0x3f80};
  Generator gen(5);
  const std::vector<std::pair<std::string, Tensor>> tensors = {
      {"patterns", from_bits<bfloat16>(patterns, {5, 2})},
      {"normal", randn({3, 5}, DType::f32, &gen).to(DType::bf16)},
      {"transposed", randn({2, 3}, DType::f32, &gen).to(DType::bf16).t()},
      {"empty", zeros({0, 2}).to(DType::bf16)},
  };
  // bfloat16 is written as it is whatever the float storage says.
  for (auto floats : {nn::FloatStorage::as_is, nn::FloatStorage::bf16, nn::FloatStorage::f16}) {
    BOOST_TEST_CONTEXT("storage " << static_cast<int>(floats)) {
      nn::save_tensors(tensors, path, {}, {.floats = floats});
      const json h = header_of(path);
      const nn::TensorFile f = nn::load_tensors(path);
      BOOST_REQUIRE_EQUAL(f.tensors.size(), tensors.size());
      for (size_t k = 0; k < tensors.size(); ++k) {
        const auto& [name, t] = tensors[k];
        BOOST_TEST(h[name]["dtype"] == "BF16");
        BOOST_TEST(f.stored_dtypes.at(name) == "BF16");
        BOOST_TEST((f.tensors[k].second.dtype() == DType::bf16));
        BOOST_TEST(f.tensors[k].second.shape() == t.shape());
        BOOST_TEST(bits_of<uint16_t>(f.tensors[k].second) == bits_of<uint16_t>(t), boost::test_tools::per_element());
      }
    }
  }
  // Beside other dtypes: F16 storage narrows float32 and float64, never int64.
  const Tensor f32 = from_vector(std::vector<float>{0.1f, 1e5f, -3e-8f}, {3});
  const Tensor f64 = from_vector(std::vector<double>{1 + 0x1p-11 + 0x1p-40, -2.5}, {2});
  const Tensor i64 = from_vector(std::vector<int64_t>{int64_t{1} << 62, -7}, {2});
  nn::save_tensors({{"f32", f32}, {"f64", f64}, {"i64", i64}, {"bf16", tensors[0].second}}, path, {},
                   {.floats = nn::FloatStorage::f16});
  const nn::TensorFile f = nn::load_tensors(path);
  BOOST_TEST(f.stored_dtypes == (std::map<std::string, std::string>{{"f32", "F16"}, {"f64", "F16"}, {"i64", "I64"},
                                                                    {"bf16", "BF16"}}));
  BOOST_TEST(values<float>(f.at("f32")) == (std::vector<float>{0.0999755859375f, INFINITY, -0x1p-24f}),
             boost::test_tools::per_element());
  // float64 rounds through float32, as torch's .half() does: 1+2^-11 is then a tie, to even 1.
  BOOST_TEST(values<float>(f.at("f64")) == (std::vector<float>{1.0f, -2.5f}), boost::test_tools::per_element());
  check_same(f.at("i64"), i64);
}

BOOST_AUTO_TEST_CASE(module_saved_in_16_bits_loads_rounded) {
  TempDir tmp;
  const std::string path = tmp / "m16.safetensors", full = tmp / "m32.safetensors";
  Tiny a(1);
  {  // w holds what the 16-bit formats round specially
    NoGradGuard ng;
    a.w.copy_(from_vector(std::vector<float>{1e-6f, 6e-8f, 1e5f, -INFINITY, NAN, 65519.0f, 1 + 0x1p-8f, 1 + 0x3p-8f,
                                             3e38f, -1e-40f, 0.1f, -0.0f},
                          {3, 4}));
  }
  nn::save(a, full, {{"kind", "tiny"}});
  for (auto [floats, name] : {std::pair{nn::FloatStorage::bf16, "BF16"}, std::pair{nn::FloatStorage::f16, "F16"}}) {
    BOOST_TEST_CONTEXT(name) {
      nn::save(a, path, {{"kind", "tiny"}}, {.floats = floats});
      const json h = header_of(path);
      BOOST_TEST(h["w"]["dtype"] == name);
      BOOST_TEST(h["b"]["dtype"] == name);
      BOOST_TEST(h["count"]["dtype"] == "I64");
      BOOST_TEST(fs::file_size(path) < fs::file_size(full));
      // float32 -> 16 bits -> float32, by the converters.
      auto expect = [&](const Tensor& t) {
        std::vector<float> f = values<float>(t), back(f.size());
        std::vector<uint16_t> narrow(f.size());
        const auto n = static_cast<int64_t>(f.size());
        if (floats == nn::FloatStorage::bf16) {
          float_to_bf16(f.data(), reinterpret_cast<bfloat16*>(narrow.data()), n);
          bf16_to_float(reinterpret_cast<const bfloat16*>(narrow.data()), back.data(), n);
        } else {
          float_to_f16(f.data(), narrow.data(), n);
          f16_to_float(narrow.data(), back.data(), n);
        }
        return bits_of<uint32_t>(from_vector(back, t.shape()));
      };
      Tiny b(2);
      BOOST_TEST(nn::load(b, path).at("kind") == "tiny");
      BOOST_TEST(bits_of<uint32_t>(b.w) == expect(a.w), boost::test_tools::per_element());
      BOOST_TEST(bits_of<uint32_t>(b.b) == expect(a.b), boost::test_tools::per_element());
      BOOST_TEST(values<int64_t>(b.count) == std::vector<int64_t>{5}, boost::test_tools::per_element());
      BOOST_TEST(values<float>(b.w) != values<float>(a.w));  // something was rounded
      if (floats == nn::FloatStorage::bf16)  // the same rounding as the tensor conversion
        BOOST_TEST(bits_of<uint32_t>(b.w) == bits_of<uint32_t>(a.w.to(DType::bf16).to(DType::f32)),
                   boost::test_tools::per_element());
      const auto w = values<float>(b.w);
      if (floats == nn::FloatStorage::f16) {
        BOOST_TEST(w[2] == INFINITY);            // 1e5 overflows
        BOOST_TEST(w[8] == INFINITY);            // and 3e38
        BOOST_TEST(w[1] == 0x1p-24f);            // 6e-8: the smallest subnormal
        BOOST_TEST(w[0] == 17 * 0x1p-24f);       // 1e-6: a subnormal
        BOOST_TEST(w[5] == 65504.0f);            // rounds down to the largest normal
        BOOST_TEST((w[9] == 0.0f && std::signbit(w[9])));
      } else {
        BOOST_TEST(w[6] == 1.0f);                // a tie, to even
        BOOST_TEST(w[7] == 1 + 0x1p-6f);         // a tie, to even
        BOOST_TEST(w[9] == -0x1p-133f);          // -1e-40, a float32 subnormal: its top 7 bits
      }
      BOOST_TEST(std::isnan(w[4]));
      BOOST_TEST(w[3] == -INFINITY);
      // A float64 module: the same values, widened.
      Tiny c(3);
      c.to(DType::f64);
      nn::load(c, path);
      const auto wd = values<double>(c.w);
      for (size_t i = 0; i < w.size(); ++i)
        BOOST_TEST((wd[i] == static_cast<double>(w[i]) || (std::isnan(wd[i]) && std::isnan(w[i]))), i);
    }
  }
}

BOOST_AUTO_TEST_CASE(refused_dtype_conversions_name_the_file_tensor_and_dtypes) {
  TempDir tmp;
  const std::string path = tmp / "m.safetensors";
  Tiny a(1);
  const nn::LoadOptions strict{.convert_dtype = false};
  for (auto [floats, dtype] : {std::pair{nn::FloatStorage::bf16, "bfloat16"}, std::pair{nn::FloatStorage::f16, "float16"}}) {
    nn::save(a, path, {}, {.floats = floats});
    Tiny b(2);
    const auto before = values<float>(b.w);
    check_throws<nn::CheckpointError>(
        [&] { nn::load(b, path, strict); },
        {path, fmt::format("w (checkpoint {}, module float32)", dtype),
         fmt::format("b (checkpoint {}, module float32)", dtype), "convert_dtype is false"});
    BOOST_TEST(values<float>(b.w) == before, boost::test_tools::per_element());  // untouched
  }
  // F32 into a float64 module: refused too when conversions are.
  nn::save(a, path);
  Tiny c(2);
  c.to(DType::f64);
  check_throws<nn::CheckpointError>([&] { nn::load(c, path, strict); },
                                    {path, "w (checkpoint float32, module float64)"});
  try {
    nn::load(c, path, strict);
  } catch (const nn::CheckpointError& e) {
    BOOST_TEST(std::string(e.what()).find("count") == std::string::npos);  // I64 into int64: no conversion
  }
  // The module's own dtype loads.
  Tiny d(2);
  nn::load(d, path, strict);
  check_same(d.w, a.w);
  // Integers and floats never convert into each other, whatever the options.
  nn::save_tensors({{"w", a.w}, {"b", a.b}, {"count", ones({1}).to(DType::bf16)}}, path);
  BOOST_CHECK_EXCEPTION(nn::load(d, path), nn::CheckpointError,
                        says<nn::CheckpointError>({"mis-shaped keys: count (checkpoint (1) bfloat16, module (1) int64)"}));
}

BOOST_AUTO_TEST_CASE(damaged_16_bit_files_are_refused) {
  TempDir tmp;
  const std::string p = tmp / "h.safetensors";
  const auto check = [&](const std::string& file, const std::string& field) {
    write_bytes(p, file);
    expect_refused(p, field);
  };
  const std::string d8(8, '\0');
  check(raw_file(R"({"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", d8), "span 8 bytes, but BF16 (3) needs 6");
  check(raw_file(R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,4]}})", d8.substr(4)),
        "span 4 bytes, but F16 (4) needs 8");
  check(raw_file(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,3]}})", d8.substr(5)), "span 3 bytes");
  check(raw_file(R"({"a":{"dtype":"BF16","shape":[4611686018427387904,2],"data_offsets":[0,8]}})", d8),
        "more elements than can be addressed");
  check(raw_file(R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[2],"data_offsets":[2,6]}})",
                 d8.substr(2)),
        "overlap");
  // Data at an odd offset of the file (an unpadded header of odd length) is
  // valid: F16 is widened through an aligned copy.
  const std::string odd = R"({"a":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}} )";
  BOOST_REQUIRE(odd.size() % 2 == 1);
  write_bytes(p, raw_file(odd, std::string("\x00\x3c\x00\xc0", 4)));
  BOOST_TEST(values<float>(nn::load_tensors(p).at("a")) == (std::vector<float>{1.0f, -2.0f}),
             boost::test_tools::per_element());

  // Every proper prefix of a 16-bit file, a trailing byte, and dtypes flipped
  // to one of another size or to none.
  const std::string good = tmp / "good.safetensors";
  Generator gen(3);
  nn::save_tensors({{"h", randn({5}, DType::f32, &gen)}, {"b", randn({3}, DType::f32, &gen).to(DType::bf16)}}, good, kMeta,
                   {.floats = nn::FloatStorage::f16});
  const std::string bytes = read_bytes(good);
  write_bytes(p, bytes);
  for (size_t len = bytes.size(); len-- > 0;) {
    fs::resize_file(p, len);
    BOOST_CHECK_THROW(nn::load_tensors(p), nn::CheckpointError);
  }
  write_bytes(p, bytes + "x");
  expect_refused(p, "cover");
  const auto with = [&](const std::string& from, const std::string& to) {
    std::string f = bytes;
    f.replace(f.find(from), from.size(), to);
    return f;
  };
  check(with("\"F16\"", "\"F32\""), "span 10 bytes, but F32 (5) needs 20");
  check(with("\"BF16\"", "\"BF32\""), "dtype \"BF32\"");
  check(with("\"BF16\"", "\"F64\" "), "span 6 bytes, but F64 (3) needs 24");
}
