#pragma once
// What every fuzz target shares. The loaders read paths, so each input is
// written to a file in a private scratch directory first. A loader may refuse
// a file only with the library's typed error (tg::ValueError, of which
// DataError and CheckpointError are kinds); anything else -- a sanitizer
// report, std::bad_alloc, std::length_error, an nlohmann::json exception --
// escapes LLVMFuzzerTestOneInput, ends the process, and libFuzzer saves the
// input as a crash. What a target checks on an accepted file goes through
// require(), so a broken promise is a crash too.
#include <fcntl.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "autograd/error.h"

namespace tg::fuzz {

// Created on first use under $TMPDIR (scripts/fuzz.sh points it into
// build-fuzz/), removed when the process exits normally.
inline const std::string& scratch_dir() {
  struct Dir {
    std::string path;
    Dir() {
      std::string tmpl = (std::filesystem::temp_directory_path() / "tapegrad-fuzz-XXXXXX").string();
      if (!::mkdtemp(tmpl.data())) {
        std::perror("fuzz: mkdtemp");
        std::abort();
      }
      path = tmpl;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

// Writes the input to scratch_dir()/name, replacing what was there; returns the path.
inline std::string write_input(const uint8_t* data, size_t size, const std::string& name = "input") {
  std::string path = scratch_dir() + "/" + name;
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    std::perror(("fuzz: " + path).c_str());
    std::abort();
  }
  for (size_t done = 0; done < size;) {
    ssize_t k = ::write(fd, data + done, size - done);
    if (k <= 0) {
      std::perror(("fuzz: " + path).c_str());
      std::abort();
    }
    done += static_cast<size_t>(k);
  }
  ::close(fd);
  return path;
}

// Runs load(): true when it returns, false when it refuses the file with a
// tg::ValueError. Any other exception propagates (a finding).
template <class F>
bool accepted(F&& load) {
  try {
    load();
    return true;
  } catch (const ValueError&) {
    return false;
  }
}

// A property of an accepted file that the loader's documentation promises.
inline void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz: broken promise: %s\n", what);
  std::abort();
}

}  // namespace tg::fuzz
