#include "checkpoint/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string Scratch(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp == nullptr ? "/tmp" : tmp, "/files_test_", name);
}

bool Exists(const std::string& path) {
  struct stat info;
  return lstat(path.c_str(), &info) == 0;
}

TEST(RemoveTreeTest, RemovesNestedDirectoriesAgainAndAgain) {
  const std::string root = Scratch("nested");
  // Emptied and filled several times over, as FreshTestDir and checkpoint rotation do.
  for (int round = 0; round < 3; ++round) {
    ASSERT_TRUE(RemoveTree(root).ok());
    ASSERT_FALSE(Exists(root));
    fs::create_directories(root + "/a/b/c");
    fs::create_directories(root + "/.tmp-checkpoint-4/empty");
    ASSERT_TRUE(WriteFileAtomically(root + "/a/b/c/file", "x").ok());
    ASSERT_TRUE(WriteFileAtomically(root + "/a/top", std::string(1 << 16, 'y')).ok());
    ASSERT_TRUE(WriteFileAtomically(root + "/.tmp-checkpoint-4/shard", "z").ok());
  }
  ASSERT_TRUE(RemoveTree(root + "/.tmp-checkpoint-4").ok());
  EXPECT_FALSE(Exists(root + "/.tmp-checkpoint-4"));
  EXPECT_TRUE(Exists(root + "/a/b/c/file"));  // its sibling stays
  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
}

TEST(RemoveTreeTest, RemovesLinksWithoutFollowingThem) {
  const std::string root = Scratch("links");
  const std::string outside = Scratch("links_target");
  ASSERT_TRUE(RemoveTree(root).ok());
  ASSERT_TRUE(RemoveTree(outside).ok());
  fs::create_directories(root);
  fs::create_directories(outside);
  ASSERT_TRUE(WriteFileAtomically(outside + "/keep", "kept").ok());
  ASSERT_EQ(symlink(outside.c_str(), (root + "/to_dir").c_str()), 0);
  ASSERT_EQ(symlink((outside + "/keep").c_str(), (root + "/to_file").c_str()), 0);
  ASSERT_EQ(symlink("/nonexistent", (root + "/dangling").c_str()), 0);
  ASSERT_TRUE(RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
  auto kept = ReadFile(outside + "/keep");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(*kept, "kept");
}

TEST(RemoveTreeTest, MissingPathIsFineAndAFileIsRemoved) {
  EXPECT_TRUE(RemoveTree(Scratch("never_created")).ok());
  const std::string file = Scratch("single_file");
  ASSERT_TRUE(WriteFileAtomically(file, "1").ok());
  ASSERT_TRUE(RemoveTree(file).ok());
  EXPECT_FALSE(Exists(file));
}

TEST(RemoveTreeTest, ErrorNamesThePath) {
  // A path under a regular file cannot exist: ENOTDIR, reported with the path.
  const std::string file = Scratch("not_a_dir");
  ASSERT_TRUE(WriteFileAtomically(file, "1").ok());
  const absl::Status status = RemoveTree(file + "/child");
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(file + "/child"), absl::string_view::npos) << status;
  ASSERT_TRUE(RemoveTree(file).ok());
}

// /dev/full fails every write with ENOSPC, as a full disk does.
TEST(WriteAtTest, FullDiskNamesThePathTheBytesAndTheFreeSpace) {
  ScopedFd fd{::open("/dev/full", O_WRONLY | O_CLOEXEC)};
  ASSERT_GE(fd.fd, 0) << "no /dev/full";
  const std::string data(4096, 'x');
  const absl::Status status = WriteAt(fd.fd, data.data(), 4096, 8, "/ckpt/model.safetensors");
  EXPECT_TRUE(absl::IsResourceExhausted(status)) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("cannot write '/ckpt/model.safetensors': the disk is full"),
                    HasSubstr("4096 bytes at offset 8 did not fit"), HasSubstr("free there"),
                    HasSubstr("No space left on device")));
}

}  // namespace
}  // namespace cpptrain
