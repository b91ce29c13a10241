// Paths for checkpoint tests: a fresh scratch directory per test, and files under
// checkpoint/testdata (run under Bazel, or CTest through cmake/run_test.sh).
//
//   const std::string dir = FreshTestDir();                   // TEST_TMPDIR/<suite>.<test>
//   const std::string golden = TestdataPath("golden.safetensors");
#ifndef CPPTRAIN_CHECKPOINT_TEST_DIRS_H_
#define CPPTRAIN_CHECKPOINT_TEST_DIRS_H_

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/files.h"
#include "gtest/gtest.h"

namespace cpptrain {

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

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_TEST_DIRS_H_
