// Paths for checkpoint tests: a fresh scratch directory per test, and files under
// checkpoint/testdata (run under Bazel, or CTest through cmake/run_test.sh); a file's bytes
// read or written whole; and a timeout for code that must not block on a FIFO.
//
//   const std::string dir = FreshTestDir();                   // TEST_TMPDIR/<suite>.<test>
//   const std::string golden = TestdataPath("golden.safetensors");
//   const std::string bytes = ReadBytes(WriteText(dir + "/x.json", "{}"));
//   absl::Status s = WithinTimeout<absl::Status>({fifo}, [&] { return Load(dir); });
#ifndef CPPTRAIN_CHECKPOINT_TEST_DIRS_H_
#define CPPTRAIN_CHECKPOINT_TEST_DIRS_H_

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <future>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "gtest/gtest.h"

namespace cpptrain {

// The whole file (empty when it cannot be read).
inline std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes `text` as the whole file and returns `path`.
inline std::string WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  return path;
}

// TEST_TMPDIR (else /tmp)/<test suite>.<test name>, emptied and created.
inline std::string FreshTestDir() {
  const ::testing::TestInfo* test = ::testing::UnitTest::GetInstance()->current_test_info();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(tmp == nullptr ? "/tmp" : tmp, "/", test->test_suite_name(), ".", test->name());
  const absl::Status removed = RemoveTree(dir);
  EXPECT_TRUE(removed.ok()) << removed;
  std::filesystem::create_directories(dir);
  return dir;
}

// checkpoint/testdata/`name` in the test's runfiles.
inline std::string TestdataPath(const std::string& name) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                      "/checkpoint/testdata/", name);
}

// Runs `body` on a thread of its own and returns its result. While it runs past `timeout` (a
// reader blocked in open() of a FIFO), every FIFO of `fifos` is opened for writing and closed
// again, every 100 ms, which lets a blocked open return and read an empty file, and the test
// fails: a regression fails instead of hanging the test.
template <typename T>
T WithinTimeout(const std::vector<std::string>& fifos, std::function<T()> body,
                std::chrono::seconds timeout = std::chrono::seconds(20)) {
  std::packaged_task<T()> task(std::move(body));
  std::future<T> result = task.get_future();
  std::thread thread(std::move(task));
  if (result.wait_for(timeout) != std::future_status::ready) {
    ADD_FAILURE() << "still blocked after " << timeout.count() << " s: a FIFO was opened";
    while (result.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
      for (const std::string& fifo : fifos) {
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
      }
    }
  }
  thread.join();
  return result.get();
}

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_TEST_DIRS_H_
