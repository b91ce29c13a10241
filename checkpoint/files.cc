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

namespace {

std::string KindOf(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

absl::Status NotRegular(const std::string& dir, const std::string& name, mode_t mode,
                        FileLinks links) {
  const std::string where = absl::StrCat("checkpoint directory '", dir, "': '", name, "' is ");
  if (S_ISLNK(mode)) {
    return absl::DataLossError(absl::StrCat(
        where, "a symbolic link, which a checkpoint never holds (its files are written in "
               "place), so it may lead outside the checkpoint; replace it with the file itself, "
               "or use another checkpoint"));
  }
  return absl::DataLossError(absl::StrCat(
      where, KindOf(mode), ", not a regular file", links == FileLinks::kFollow ? " (after links)" : "",
      "; it is refused without being opened (a FIFO would block the reader): put the file "
      "itself there, or use another checkpoint"));
}

}  // namespace

absl::StatusOr<std::string> CheckpointFilePath(const std::string& dir, const std::string& name,
                                               FileLinks links) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint directory '", dir, "': its index names the file \"", name,
        "\", which is not a plain file name inside the directory (expected a name without '/', "
        "not \".\" or \"..\", so not an absolute path or one in another directory): the "
        "manifest or index is damaged or was edited; use another checkpoint"));
  }
  const std::string path = absl::StrCat(dir, "/", name);
  struct stat info;
  const int found = links == FileLinks::kRefuse ? ::lstat(path.c_str(), &info)
                                                : ::stat(path.c_str(), &info);
  if (found != 0) {
    const int error = errno;
    if (error == ENOENT) {
      return absl::NotFoundError(absl::StrCat("'", path, "' does not exist"));
    }
    return absl::ErrnoToStatus(error, absl::StrCat("checkpoint directory '", dir,
                                                   "': cannot look at '", name, "'"));
  }
  if (!S_ISREG(info.st_mode)) return NotRegular(dir, name, info.st_mode, links);
  return path;
}

absl::StatusOr<std::string> ReadCheckpointFile(const std::string& dir, const std::string& name,
                                               FileLinks links) {
  CT_ASSIGN_OR_RETURN(const std::string path, CheckpointFilePath(dir, name, links));
  const int flags =
      O_RDONLY | O_NONBLOCK | O_CLOEXEC | (links == FileLinks::kRefuse ? O_NOFOLLOW : 0);
  ScopedFd fd{::open(path.c_str(), flags)};
  struct stat info;
  if (fd.fd < 0 || ::fstat(fd.fd, &info) != 0) {
    const int error = errno;
    if (error == ELOOP) return NotRegular(dir, name, S_IFLNK, links);  // became a link
    return absl::ErrnoToStatus(error, absl::StrCat("cannot read '", path, "'"));
  }
  if (!S_ISREG(info.st_mode)) return NotRegular(dir, name, info.st_mode, links);
  std::string contents;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd.fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot read '", path, "'"));
    if (n == 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  return contents;
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
