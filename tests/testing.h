// Helpers shared by the Boost.Test executables in tests/: fixture loading,
// relative-error comparison against torch, typed-exception checks and
// temporary directories. Include after <boost/test/unit_test.hpp>.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <nlohmann/json.hpp>

#include "autograd/autograd.h"
#include "autograd/gradcheck.h"
#include "autograd/op.h"
#include "nn/module.h"

namespace tg::testing {

// ---- JSON fixtures written by tests/fixtures/make_<area>.py

// The parsed fixture at path (relative to the project root, the tests' workdir),
// parsed once; fails the test if the file is missing.
inline const nlohmann::json& fixture(const std::string& path) {
  static std::map<std::string, nlohmann::json> parsed;
  auto it = parsed.find(path);
  if (it == parsed.end()) {
    std::ifstream f(path);
    BOOST_REQUIRE_MESSAGE(f, path << " not found (run the tests from the project root)");
    it = parsed.emplace(path, nlohmann::json::parse(f)).first;
  }
  return it->second;
}

// A fixture tensor {"shape": [...], "data": [...]}: its shape, its float64
// values (converted to dtype), its int64 values (indices, masks).
inline Shape shape_of(const nlohmann::json& j) { return Shape(j["shape"].get<std::vector<int64_t>>()); }
inline Tensor load(const nlohmann::json& j, DType dtype = DType::f64) {
  return from_vector(j["data"].get<std::vector<double>>(), shape_of(j)).to(dtype);
}
inline Tensor load_ids(const nlohmann::json& j) { return from_vector(j["data"].get<std::vector<int64_t>>(), shape_of(j)); }

// Index tensors from literals, e.g. ids({2, 2, 0, 0}, {2, 2}).
inline Tensor ids(std::initializer_list<int64_t> v, std::initializer_list<int64_t> shape) {
  return from_vector(std::vector<int64_t>(v), Shape(shape));
}
inline Tensor ids(std::initializer_list<int64_t> v) {
  return from_vector(std::vector<int64_t>(v), {static_cast<int64_t>(v.size())});
}

// Copies the fixture's weights (by tapegrad name) into m, converted to dtype;
// requires the fixture to hold exactly m's parameters.
inline void load_params(nn::Module& m, const nlohmann::json& params, DType dtype) {
  m.to(dtype);
  auto named = m.named_parameters();
  BOOST_REQUIRE_EQUAL(named.size(), params.size());
  NoGradGuard ng;
  for (auto& [name, p] : named) {
    BOOST_REQUIRE_MESSAGE(params.contains(name), "fixture lacks " << name);
    p.copy_(load(params[name], dtype));
  }
}

// ---- numeric comparison

// max |got - want| / max |want|: the relative error of the whole tensor, after
// requiring got to exist and the shapes to agree.
inline double rel_error(const Tensor& got, const Tensor& want) {
  BOOST_REQUIRE_MESSAGE(got.defined(), "missing tensor");
  BOOST_REQUIRE_MESSAGE(got.shape() == want.shape(), "shape " << got.shape().str() << " vs " << want.shape().str());
  auto a = got.to(DType::f64).contiguous().to_vector<double>(),
       b = want.to(DType::f64).contiguous().to_vector<double>();
  double diff = 0, scale = 1e-300;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && a[i] != b[i]) return INFINITY;  // NaN or a wrong infinity is never close
    diff = std::max(diff, std::abs(a[i] - b[i])), scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

// Checks a group of tensors against torch's: each rel_error must be <= tol
// (the failure names `what`); keeps the worst for the log.
struct Parity {
  double tol;
  double worst = 0;
  void check(const std::string& what, const Tensor& got, const Tensor& want) {
    double e = rel_error(got, want);
    worst = std::max(worst, e);
    BOOST_TEST(e <= tol, what << ": relative error " << e << " above " << tol);
  }
};

// The largest |a - b| over two tensors of the same shape (required); infinite
// where either holds a NaN.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  BOOST_REQUIRE(a.shape() == b.shape());
  auto x = a.to(DType::f64).contiguous().to_vector<double>(), y = b.to(DType::f64).contiguous().to_vector<double>();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double e = std::abs(x[i] - y[i]);
    if (std::isnan(e)) return std::numeric_limits<double>::infinity();  // std::max would drop it
    d = std::max(d, e);
  }
  return d;
}

// ---- typed exceptions

// Predicate for BOOST_CHECK_EXCEPTION(stmt, E, says<E>({...})): the message of
// the E (the macro checks the type) holds every one of parts; logs the first
// part it lacks.
template <class E>
std::function<bool(const E&)> says(std::vector<std::string> parts) {
  return [parts](const E& e) {
    std::string what = e.what();
    for (const auto& p : parts)
      if (what.find(p) == std::string::npos) {
        BOOST_TEST_MESSAGE("message '" << what << "' lacks '" << p << "'");
        return false;
      }
    return true;
  };
}

// Runs f, which must throw E with a message containing every one of parts;
// each failure names the caller's line and the missing part.
template <class E, class F>
void check_throws(F f, std::initializer_list<std::string> parts,
                  std::source_location where = std::source_location::current()) {
  try {
    f();
    BOOST_ERROR("line " << where.line() << ": no exception thrown");
  } catch (const E& e) {
    std::string msg = e.what();
    for (const std::string& p : parts)
      BOOST_TEST(msg.find(p) != std::string::npos, "line " << where.line() << ": '" << p << "' not in: " << msg);
  }
}

// ---- files

// A fresh directory under the system temp dir (unique per process and
// instance), removed with its contents when the test ends.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("tg_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  // The path of name inside the directory.
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // Writes content (bytes, as given) to name inside the directory; returns its path.
  std::string write(const std::string& name, const std::string& content) const {
    std::ofstream(path / name, std::ios::binary) << content;
    return (path / name).string();
  }
};

}  // namespace tg::testing
