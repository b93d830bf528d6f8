// Helpers for the tests that run the built programs (examples, the study):
// where meson put an executable, running a command with its output captured,
// reading a file whole.
#pragma once

#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace testing {

// The path meson passes in the environment variable `var`.
inline std::string exe(const char* var) {
  const char* p = std::getenv(var);
  BOOST_REQUIRE_MESSAGE(p && *p, var << " is not set (run the tests through meson)");
  return p;
}

inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Runs a shell command; returns its exit status (-1 when it did not exit) and
// what it printed on stdout and stderr together.
inline std::pair<int, std::string> run(const std::string& cmd) {
  namespace fs = std::filesystem;
  static int counter = 0;
  fs::path log = fs::temp_directory_path() / fmt::format("tg_run_{}_{}.log", ::getpid(), counter++);
  int rc = std::system(fmt::format("{} >'{}' 2>&1", cmd, log.string()).c_str());
  std::string out = read_text(log);
  fs::remove(log);
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, out};
}

}  // namespace testing
