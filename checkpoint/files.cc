#include "checkpoint/files.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cpptrain {

ScopedFd::~ScopedFd() {
  if (fd >= 0) ::close(fd);
}

namespace {

// A failed pwrite. A full disk (or quota) says how much did not fit and how much is free.
absl::Status WriteError(int error, int fd, int64_t size, int64_t offset, const std::string& path) {
  if (error != ENOSPC && error != EDQUOT) {
    return absl::ErrnoToStatus(error, absl::StrCat("cannot write ", size, " bytes at offset ",
                                                   offset, " of '", path, "'"));
  }
  struct statvfs fs;
  const std::string free =
      ::fstatvfs(fd, &fs) == 0
          ? absl::StrCat(static_cast<int64_t>(fs.f_bavail) * static_cast<int64_t>(fs.f_frsize),
                         " bytes are free there")
          : "the free space is unknown";
  return absl::ErrnoToStatus(
      error, absl::StrCat("cannot write '", path, "': the disk is full (", size,
                          " bytes at offset ", offset, " did not fit; ", free, ")"));
}

}  // namespace

absl::Status WriteAt(int fd, const char* data, int64_t size, int64_t offset,
                     const std::string& path) {
  while (size > 0) {
    const ssize_t n = ::pwrite(fd, data, static_cast<size_t>(size), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return WriteError(n < 0 ? errno : EIO, fd, size, offset, path);
    data += n;
    size -= n;
    offset += n;
  }
  return absl::OkStatus();
}

std::string TempPathFor(const std::string& path) { return absl::StrCat(path, ".tmp.", ::getpid()); }

absl::StatusOr<int> CreateTemp(const std::string& temp_path) {
  const int fd = ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot create '", temp_path,
                                            "': check that its directory exists and is writable"));
  }
  return fd;
}

absl::Status CommitTemp(int fd, const std::string& temp_path, const std::string& path) {
  int error = ::fsync(fd) == 0 ? 0 : errno;
  if (::close(fd) != 0 && error == 0) error = errno;
  if (error == 0 && ::rename(temp_path.c_str(), path.c_str()) != 0) error = errno;
  if (error != 0) {
    ::unlink(temp_path.c_str());
    return absl::ErrnoToStatus(error, absl::StrCat("cannot write '", path, "' (via '", temp_path,
                                                   "'); the previous file, if any, is unchanged"));
  }
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  ScopedFd dir_fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (dir_fd.fd < 0 || ::fsync(dir_fd.fd) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("wrote '", path, "' but cannot fsync directory '", dir,
                                            "': the rename may not survive a crash"));
  }
  return absl::OkStatus();
}

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents) {
  const std::string temp_path = TempPathFor(path);
  CT_ASSIGN_OR_RETURN(int fd, CreateTemp(temp_path));
  absl::Status written =
      WriteAt(fd, contents.data(), static_cast<int64_t>(contents.size()), 0, path);
  if (!written.ok()) {
    ::close(fd);
    ::unlink(temp_path.c_str());
    return written;
  }
  return CommitTemp(fd, temp_path, path);
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::ErrnoToStatus(errno != 0 ? errno : EIO, absl::StrCat("cannot read '", path, "'"));
  }
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status FsyncDirectory(const std::string& dir) {
  ScopedFd fd{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (fd.fd < 0 || ::fsync(fd.fd) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot fsync directory '", dir, "'"));
  }
  return absl::OkStatus();
}

namespace {

// nftw passes no context: the failing entry and its errno, per thread.
thread_local std::string remove_failed_path;
thread_local int remove_failed_errno = 0;

int RemoveEntry(const char* path, const struct stat*, int, struct FTW*) {
  if (std::remove(path) == 0 || errno == ENOENT) return 0;
  remove_failed_path = path;
  remove_failed_errno = errno;
  return 1;  // stops the walk
}

}  // namespace

absl::Status RemoveTree(const std::string& path) {
  struct stat info;
  if (lstat(path.c_str(), &info) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(
        absl::StrCat("cannot remove '", path, "': ", std::strerror(errno)));
  }
  remove_failed_path.clear();
  remove_failed_errno = 0;
  // Depth first (children before their directory), not following links, 32 descriptors.
  const int walked = nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS);
  if (walked == 0) return absl::OkStatus();
  const int error = remove_failed_path.empty() ? errno : remove_failed_errno;
  return absl::InternalError(absl::StrCat(
      "cannot remove '", remove_failed_path.empty() ? path : remove_failed_path, "': ",
      std::strerror(error)));
}

}  // namespace cpptrain
