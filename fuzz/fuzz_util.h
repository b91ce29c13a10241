// Helpers shared by the libFuzzer targets in fuzz/ (built by tools/fuzz.sh with clang and
// ASan/UBSan, not by Bazel or CMake): a scratch directory for the parsers that take a path, and
// a check that turns a broken property into a crash libFuzzer records.
//
//   const std::string path = cpptrain::fuzz::ScratchPath("input.safetensors");
//   cpptrain::fuzz::WriteFileOrDie(path, data, size);
//   FUZZ_CHECK(reopened.ok(), "a file the writer wrote must open: " << reopened.status());
#ifndef CPPTRAIN_FUZZ_FUZZ_UTIL_H_
#define CPPTRAIN_FUZZ_FUZZ_UTIL_H_

#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>

#include "checkpoint/files.h"

// A property of the code under test that failed: prints the message and aborts, which libFuzzer
// reports as a crash and saves the input for.
#define FUZZ_CHECK(condition, message)                                                    \
  do {                                                                                    \
    if (!(condition)) {                                                                   \
      std::cerr << __FILE__ << ":" << __LINE__ << ": FUZZ_CHECK failed: " #condition ": " \
                << message << std::endl;                                                  \
      std::abort();                                                                       \
    }                                                                                     \
  } while (false)

namespace cpptrain {
namespace fuzz {

// A directory private to this process, made on first use under $CPPTRAIN_FUZZ_TMPDIR, else
// /dev/shm (tmpfs: the fsyncs of atomic writes cost nothing there), else /tmp; removed at exit.
inline std::string* scratch_dir = nullptr;

inline const std::string& ScratchDir() {
  if (scratch_dir == nullptr) {
    const char* base = std::getenv("CPPTRAIN_FUZZ_TMPDIR");
    const std::string root = base != nullptr && *base != '\0'         ? base
                             : ::access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm"
                                                                      : "/tmp";
    std::string pattern = root + "/cpptrain-fuzz-XXXXXX";
    if (::mkdtemp(pattern.data()) == nullptr) {
      std::cerr << "cannot create a scratch directory under " << root << std::endl;
      std::abort();
    }
    scratch_dir = new std::string(pattern);
    std::atexit([] { (void)RemoveTree(*scratch_dir); });
  }
  return *scratch_dir;
}

inline std::string ScratchPath(const std::string& name) { return ScratchDir() + "/" + name; }

// Writes the bytes to `path`, replacing it; aborts when it cannot (the run itself is broken).
inline void WriteFileOrDie(const std::string& path, const void* data, size_t size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const char* bytes = static_cast<const char*>(data);
  size_t left = size;
  while (fd >= 0 && left > 0) {
    const ssize_t n = ::write(fd, bytes, left);
    if (n <= 0) break;
    bytes += n;
    left -= static_cast<size_t>(n);
  }
  if (fd < 0 || left != 0 || ::close(fd) != 0) {
    std::cerr << "cannot write the fuzz input to " << path << std::endl;
    std::abort();
  }
}

inline void WriteFileOrDie(const std::string& path, const std::string& contents) {
  WriteFileOrDie(path, contents.data(), contents.size());
}

}  // namespace fuzz
}  // namespace cpptrain

#endif  // CPPTRAIN_FUZZ_FUZZ_UTIL_H_
