// One job per output_dir: rank 0 holds an exclusive flock(2) on <output_dir>/.cpptrain.lock
// for as long as it trains, the file naming the holder (pid and host). A second job on the
// same directory is refused at its start with those and the way out, instead of both writing
// checkpoints, rotating each other's away and resuming each other's state. The kernel drops a
// flock when its process ends however it ends (an error, SIGTERM, SIGKILL, a crash), so a lock
// is never left held by a dead process; a file still naming a process that did not release it
// (it was killed) is taken over with a warning.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<OutputDirLock> lock, OutputDirLock::Acquire(dir));
//   ... train ...                             // ~OutputDirLock releases it
//
// Across hosts the lock holds where the file system carries flock (local disks; NFSv4, where
// Linux maps it to a byte-range lock); where it does not, a warning says the directory is
// unguarded and the job goes on.
#ifndef CPPTRAIN_TRAINER_OUTPUT_DIR_LOCK_H_
#define CPPTRAIN_TRAINER_OUTPUT_DIR_LOCK_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace cpptrain {

inline constexpr char kOutputDirLockFileName[] = ".cpptrain.lock";

class OutputDirLock {
 public:
  // Takes the lock of `dir` (which must exist) without waiting. FailedPrecondition naming the
  // holder's pid and host, and what to do, when another process holds it.
  static absl::StatusOr<std::unique_ptr<OutputDirLock>> Acquire(const std::string& dir);

  // Empties the file (a clean release leaves no name behind) and releases the lock.
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

  const std::string& path() const { return path_; }

 private:
  OutputDirLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;  // -1: the file system has no flock; nothing is held
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_OUTPUT_DIR_LOCK_H_
