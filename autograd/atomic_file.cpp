#include "autograd/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "autograd/fault.h"

namespace tg::detail {
namespace {

// The writer's system calls. Each asks io_fault first, so that a
// test can make any one of them fail (autograd/fault.h); a failed close
// still releases the descriptor, as close(2) does.
using tg::detail::IoCall;
int injected(IoCall call) {
  const int e = io_fault(call);
  if (e != 0) errno = e;
  return e;
}
int sys_open(const char* path, int flags, mode_t mode = 0) { return injected(IoCall::open) ? -1 : ::open(path, flags, mode); }
ssize_t sys_write(int fd, const void* p, size_t n) { return injected(IoCall::write) ? -1 : ::write(fd, p, n); }
int sys_fsync(int fd) { return injected(IoCall::fsync) ? -1 : ::fsync(fd); }
int sys_close(int fd) {
  if (const int e = io_fault(IoCall::close)) {
    ::close(fd);
    errno = e;
    return -1;
  }
  return ::close(fd);
}
int sys_rename(const char* from, const char* to) { return injected(IoCall::rename) ? -1 : ::rename(from, to); }

}  // namespace

void remove_stale_temp_files(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string prefix = target.filename().string() + ".tmp-";
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    const std::string digits = name.substr(prefix.size());
    pid_t pid = 0;
    auto [stop, err] = std::from_chars(digits.data(), digits.data() + digits.size(), pid);
    // Exactly the name AtomicFile gives: the decimal pid, nothing before or after.
    if (err != std::errc() || stop != digits.data() + digits.size() || pid <= 0 || std::to_string(pid) != digits)
      continue;
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or EPERM: alive, not ours
    ::unlink(it->path().c_str());
  }
}

std::string errno_message(const std::string& path, const std::string& what) {
  const int e = errno;
  const char* name = strerrorname_np(e);
  return fmt::format("{}: {}: {} ({})", path, what, std::strerror(e), name ? name : std::to_string(e));
}

AtomicFile::AtomicFile(std::string target, ThrowFn throw_error)
    : target_(std::move(target)), path_(fmt::format("{}.tmp-{}", target_, ::getpid())), throw_error_(throw_error) {
  remove_stale_temp_files(target_);
  fd_ = sys_open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) fail(path_, "cannot create the temporary file");
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);  // after a failure: the error already thrown is the one to report
  if (!committed_) ::unlink(path_.c_str());
}

void AtomicFile::fail(const std::string& path, const std::string& what) const {
  throw_error_(errno_message(path, what));
  std::abort();  // a ThrowFn throws
}

void AtomicFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t k = sys_write(fd_, p, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) fail(path_, "write failed");
    p += k;
    n -= static_cast<size_t>(k);
  }
}

void AtomicFile::commit() {
  if (sys_fsync(fd_) != 0) fail(path_, "fsync failed");
  int fd = fd_;
  fd_ = -1;
  if (sys_close(fd) != 0) fail(path_, "close failed");
  if (sys_rename(path_.c_str(), target_.c_str()) != 0) fail(target_, fmt::format("cannot rename {} to it", path_));
  committed_ = true;
  const std::string dir = std::filesystem::path(target_).parent_path().string();
  int dfd = sys_open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) fail(target_, "cannot open its directory to fsync it");
  int rc = sys_fsync(dfd);
  const int fsync_errno = errno;
  ::close(dfd);
  errno = fsync_errno;
  if (rc != 0) fail(target_, "fsync of its directory failed");
}

}  // namespace tg::detail
