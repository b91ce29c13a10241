// Small file-system helpers for checkpoints: atomic writes (write beside, fsync, rename,
// fsync the directory), whole-file reads, directory syncs and recursive removal.
//
//   CT_RETURN_IF_ERROR(WriteFileAtomically(dir + "/manifest.pb", manifest.SerializeAsString()));
#ifndef CPPTRAIN_CHECKPOINT_FILES_H_
#define CPPTRAIN_CHECKPOINT_FILES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace cpptrain {

// Closes the descriptor it holds.
struct ScopedFd {
  int fd = -1;
  ~ScopedFd();
};

// Writes all `size` bytes at `offset` (pwrite, retried on EINTR); `path` names the file in
// errors.
absl::Status WriteAt(int fd, const char* data, int64_t size, int64_t offset,
                     const std::string& path);

// `path`.tmp.<pid>: where an atomic write of `path` goes first.
std::string TempPathFor(const std::string& path);

// Creates (truncates) `temp_path` for writing.
absl::StatusOr<int> CreateTemp(const std::string& temp_path);

// Makes the written temporary file `path`: fsyncs and closes `fd`, renames the file over `path`
// and fsyncs the directory so the rename survives a crash. Removes the temporary on failure.
absl::Status CommitTemp(int fd, const std::string& temp_path, const std::string& path);

absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

absl::StatusOr<std::string> ReadFile(const std::string& path);

// fsync on the directory itself, so renames and creations inside it are durable.
absl::Status FsyncDirectory(const std::string& dir);

// Removes `path` and, for a directory, everything below it (symbolic links are removed, not
// followed). A missing `path` is not an error. (std::filesystem::remove_all crashed on
// non-empty directories with the GPU hosts' libstdc++; this walks with nftw.)
absl::Status RemoveTree(const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_FILES_H_
