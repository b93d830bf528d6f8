#pragma once
// Writing a file atomically, for the library's writers (checkpoints, word2vec
// vectors, the GEMM cache). Internal (not installed).
#include <cstddef>
#include <string>

namespace tg::detail {

// Throws the writer's own exception type with the message it is given.
using ThrowFn = void (*)(const std::string& message);

// "<path>: <what>: <strerror> (<errno name>)", for the call that just failed.
std::string errno_message(const std::string& path, const std::string& what);

// A writer killed mid-write leaves its <target>.tmp-<pid> behind. Removes
// those of writers that no longer run: the pid must be gone (kill(pid, 0)
// fails with ESRCH; so writers of one directory must share a pid namespace,
// as the processes of one machine do). A live writer's file is never
// touched, nor this process's own (it may be writing it now) nor any other
// name. Best effort: a directory that cannot be listed is left as it is.
void remove_stale_temp_files(const std::string& target);

// A file written as <target>.tmp-<pid> beside its target and renamed over it
// once whole: fsync'd, closed, renamed, then its directory fsync'd so that the
// rename survives a crash. A reader never meets half a file, and a failure
// keeps the old one (the temporary file is removed). Creating one first
// removes the temporary files that writers of the same target left when they
// were killed (their pids gone). Every system call asks autograd/fault.h's
// io_fault first, so that a test can make any one of them fail; a failure
// calls throw_error with errno_message's text.
class AtomicFile {
 public:
  AtomicFile(std::string target, ThrowFn throw_error);
  ~AtomicFile();  ///< removes the temporary file unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t n);
  void commit();  ///< the file becomes the target

 private:
  [[noreturn]] void fail(const std::string& path, const std::string& what) const;
  std::string target_, path_;
  ThrowFn throw_error_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace tg::detail
