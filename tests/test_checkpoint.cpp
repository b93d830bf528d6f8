// safetensors checkpoints: round trips (float32, float64, int64, metadata),
// an independent parse of the raw bytes, modules and optimizers (training
// resumes to identical numbers), refusal of truncated, bit-flipped and
// hostile files with a CheckpointError naming the file and field, atomic
// writes that leave the old file intact when writing fails or the writer is
// killed, and removal of the temporary files that dead writers leave.
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
  check(raw_file(R"({"a":{"dtype":"F16","shape":[4],"data_offsets":[0,8]}})", d8), "dtype \"F16\"");
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
