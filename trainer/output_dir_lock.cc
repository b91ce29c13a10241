#include "trainer/output_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/logging.h"

namespace cpptrain {
namespace {

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "unknown";
  return host;
}

// What the file says about its holder: "pid <n> on host <h>", or "" when it is empty.
std::string Holder(int fd) {
  char buffer[512] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  if (n <= 0) return "";
  std::string pid = "?", host = "?";
  for (absl::string_view line : absl::StrSplit(absl::string_view(buffer, n), '\n')) {
    if (absl::ConsumePrefix(&line, "pid ")) pid = std::string(line);
    if (absl::ConsumePrefix(&line, "host ")) host = std::string(line);
  }
  return absl::StrCat("pid ", pid, " on host ", host);
}

}  // namespace

absl::StatusOr<std::unique_ptr<OutputDirLock>> OutputDirLock::Acquire(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kOutputDirLockFileName);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(
        errno, absl::StrCat("cannot open the output_dir lock '", path,
                            "': output_dir must be a writable directory (and the lock file not "
                            "a link); choose another output_dir"));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      const std::string holder = Holder(fd);
      ::close(fd);
      return absl::FailedPreconditionError(absl::StrCat(
          "output_dir '", dir, "' is in use by another training job (",
          holder.empty() ? "its pid and host not yet written" : holder, ", which holds '", path,
          "'): two jobs in one output_dir would overwrite and rotate away each other's "
          "checkpoints. Choose another output_dir, or stop the other job first"));
    }
    ::close(fd);
    LOG(WARNING) << "output_dir '" << dir << "': the file system does not lock files (flock: "
                 << std::strerror(error) << "), so nothing keeps a second job out of it";
    return std::unique_ptr<OutputDirLock>(new OutputDirLock(path, -1));
  }
  // Held. A name still in the file belongs to a process that ended without releasing it.
  if (const std::string stale = Holder(fd); !stale.empty()) {
    LOG(WARNING) << "output_dir '" << dir << "': taking over the lock '" << path
                 << "' left by " << stale
                 << ", which ended without releasing it (it was killed, or crashed)";
  }
  const std::string mine = absl::StrCat("pid ", ::getpid(), "\nhost ", HostName(), "\n");
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, mine.data(), mine.size(), 0) != static_cast<ssize_t>(mine.size())) {
    LOG(WARNING) << "cannot write the holder into '" << path << "': " << std::strerror(errno)
                 << " (the lock is held all the same)";
  }
  return std::unique_ptr<OutputDirLock>(new OutputDirLock(path, fd));
}

OutputDirLock::~OutputDirLock() {
  if (fd_ < 0) return;
  if (::ftruncate(fd_, 0) != 0) {
    LOG(WARNING) << "cannot empty '" << path_ << "' on release: " << std::strerror(errno);
  }
  ::flock(fd_, LOCK_UN);
  ::close(fd_);
}

}  // namespace cpptrain
