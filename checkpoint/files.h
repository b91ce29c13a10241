// Small file-system helpers for checkpoints: atomic writes (write beside, fsync, rename,
// fsync the directory), whole-file reads, directory syncs and recursive removal, and the one
// check every checkpoint reader makes before it opens a file a manifest or an index names.
//
//   CT_RETURN_IF_ERROR(WriteFileAtomically(dir + "/manifest.pb", manifest.SerializeAsString()));
//   CT_ASSIGN_OR_RETURN(std::string path, CheckpointFilePath(dir, piece.file()));
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

// Whether a checkpoint reader may reach a file through a symbolic link. Trainer checkpoints
// (manifest.pb and the files it names, trainer_state, rng_state) are written by this code,
// which never makes a link: one there was put there by someone else, and may point anywhere.
// Hugging Face model directories from the Hub's cache are links into ../../blobs by design.
enum class FileLinks { kRefuse, kFollow };

// The path of `name`, a file that a checkpoint's manifest (or a Hugging Face index, or this
// code) names inside `dir`, once it is known to be safe to open: `name` is a plain file name
// (not empty, no '/', so neither absolute nor in another directory, not "." or ".."), and
// `dir`/`name` is a regular file, checked with lstat (kRefuse: a symbolic link is refused) or
// stat (kFollow: it must lead to a regular file). A FIFO, a socket, a device or a directory is
// refused here, before anything opens it (opening a FIFO blocks until a writer comes).
// Errors: NotFound when it does not exist; DataLoss naming the directory, the name, what it is
// and what to do, otherwise (a checkpoint in this state is damaged or was tampered with).
absl::StatusOr<std::string> CheckpointFilePath(const std::string& dir, const std::string& name,
                                               FileLinks links = FileLinks::kRefuse);

// The whole of the regular file `dir`/`name` (CheckpointFilePath first). It is opened with
// O_NONBLOCK (and O_NOFOLLOW for kRefuse) and checked again with fstat, so a file swapped for a
// FIFO or a link after the check is refused too instead of blocking or being followed.
absl::StatusOr<std::string> ReadCheckpointFile(const std::string& dir, const std::string& name,
                                               FileLinks links = FileLinks::kRefuse);

// fsync on the directory itself, so renames and creations inside it are durable.
absl::Status FsyncDirectory(const std::string& dir);

// Removes `path` and, for a directory, everything below it (symbolic links are removed, not
// followed). A missing `path` is not an error. (std::filesystem::remove_all crashed on
// non-empty directories with the GPU hosts' libstdc++; this walks with nftw.)
absl::Status RemoveTree(const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_FILES_H_
