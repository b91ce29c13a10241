// The files a checkpoint's manifest names, on real files: a name that leaves the directory
// ("..", an absolute path), a symbolic link (out of the directory or within it), a FIFO and a
// directory in a data file's or manifest.pb's place are refused by the loader and by
// verification before anything opens them, and a FIFO never blocks either. Each FIFO case runs
// under a timeout: a reader blocked on the FIFO is let go (the FIFO opened for writing) and the
// test fails, instead of hanging.
#include <ATen/core/Tensor.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/utils.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/files.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "checkpoint/verify.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "sharding/host_group.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::shared_ptr<DecoderLM> Tiny(uint64_t seed) {
  torch::manual_seed(seed);
  return BuildDecoder(NamedDecoderConfig("tiny").value()).value();
}

// `root`/run/checkpoint-1: the full model of a tiny decoder (manifest.pb, model.safetensors).
std::string SavedCheckpoint(const std::string& root) {
  const std::string dir = root + "/run/checkpoint-1";
  fs::create_directories(dir);
  SingleProcessGroup alone;
  SaveModelStateOptions options;
  options.full_model = true;
  const absl::Status saved = SaveModelState(dir, *Tiny(1), nullptr, alone, options);
  EXPECT_TRUE(saved.ok()) << saved;
  return dir;
}

// Rewrites the manifest (with a valid checksum) so that every piece in `from` names `to`.
void RenameInManifest(const std::string& dir, const std::string& from, const std::string& to) {
  absl::StatusOr<proto::CheckpointManifest> manifest = ReadManifest(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  int renamed = 0;
  for (proto::CheckpointTensor& t : *manifest->mutable_tensors()) {
    for (proto::TensorPiece& piece : *t.mutable_pieces()) {
      if (piece.file() == from) {
        piece.set_file(to);
        ++renamed;
      }
    }
  }
  ASSERT_GT(renamed, 0);
  ASSERT_TRUE(WriteManifest(dir, *manifest).ok());
}

void MakeFifo(const std::string& path) {
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0) << path;
}

std::string VerifyProblems(const absl::StatusOr<CheckpointVerification>& report) {
  if (!report.ok()) return std::string(report.status().message());
  std::vector<std::string> messages;
  for (const absl::Status& problem : report->problems) messages.emplace_back(problem.message());
  return absl::StrJoin(messages, "\n");
}

// The checkpoint `dir` is refused, by LoadModelState (DataLoss, nothing loaded) and by
// VerifyCheckpoint (an error or a problem), each message holding every one of `want`; neither
// blocks on `fifos`.
void ExpectRefused(const std::string& dir, const std::vector<std::string>& want,
                   const std::vector<std::string>& fifos = {}) {
  auto model = Tiny(2);
  const at::Tensor before = model->named_parameters()["model.norm.weight"].detach().clone();
  const absl::Status loaded = WithinTimeout<absl::Status>(
      fifos, [&] { return LoadModelState(dir, *model, nullptr); });
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  for (const std::string& text : want) {
    EXPECT_THAT(std::string(loaded.message()), HasSubstr(text)) << "load";
  }
  EXPECT_TRUE(model->named_parameters()["model.norm.weight"].equal(before));

  const std::string problems = WithinTimeout<std::string>(
      fifos, [&] { return VerifyProblems(VerifyCheckpoint(dir)); });
  EXPECT_FALSE(problems.empty()) << "verify passed";
  for (const std::string& text : want) EXPECT_THAT(problems, HasSubstr(text)) << "verify";
}

TEST(CheckpointPathsTest, IntactCheckpointLoadsAndVerifies) {
  const std::string dir = SavedCheckpoint(FreshTestDir());
  auto model = Tiny(2);
  EXPECT_TRUE(LoadModelState(dir, *model, nullptr).ok());
  EXPECT_EQ(VerifyProblems(VerifyCheckpoint(dir)), "");
}

TEST(CheckpointPathsTest, DotDotInTheManifestIsRefused) {
  const std::string root = FreshTestDir();
  const std::string dir = SavedCheckpoint(root);
  // A real copy where the name leads: before the check, it loaded and verified.
  fs::create_directories(root + "/elsewhere");
  fs::copy_file(dir + "/model.safetensors", root + "/elsewhere/x.safetensors");
  RenameInManifest(dir, "model.safetensors", "../../elsewhere/x.safetensors");
  ExpectRefused(dir, {"\"../../elsewhere/x.safetensors\"", "not a plain file name"});
}

TEST(CheckpointPathsTest, DotDotToAFifoIsRefusedWithoutOpeningIt) {
  const std::string root = FreshTestDir();
  const std::string dir = SavedCheckpoint(root);
  fs::create_directories(root + "/elsewhere");
  MakeFifo(root + "/elsewhere/pipe");
  RenameInManifest(dir, "model.safetensors", "../../elsewhere/pipe");
  ExpectRefused(dir, {"\"../../elsewhere/pipe\"", "not a plain file name"},
                {root + "/elsewhere/pipe"});
}

TEST(CheckpointPathsTest, AbsolutePathInTheManifestIsRefused) {
  const std::string root = FreshTestDir();
  const std::string dir = SavedCheckpoint(root);
  fs::create_directories(root + "/elsewhere");
  const std::string outside = root + "/elsewhere/x.safetensors";
  fs::copy_file(dir + "/model.safetensors", outside);
  RenameInManifest(dir, "model.safetensors", outside);
  ExpectRefused(dir, {"\"" + outside + "\"", "not a plain file name"});
}

TEST(CheckpointPathsTest, SymlinkOutOfTheDirectoryIsRefused) {
  const std::string root = FreshTestDir();
  const std::string dir = SavedCheckpoint(root);
  fs::create_directories(root + "/elsewhere");
  fs::rename(dir + "/model.safetensors", root + "/elsewhere/x.safetensors");
  fs::create_symlink(root + "/elsewhere/x.safetensors", dir + "/model.safetensors");
  ExpectRefused(dir, {"'model.safetensors' is a symbolic link"});
}

TEST(CheckpointPathsTest, SymlinkWithinTheDirectoryIsRefused) {
  const std::string dir = SavedCheckpoint(FreshTestDir());
  fs::rename(dir + "/model.safetensors", dir + "/data.bin");
  fs::create_symlink("data.bin", dir + "/model.safetensors");
  ExpectRefused(dir, {"'model.safetensors' is a symbolic link"});
}

TEST(CheckpointPathsTest, FifoInPlaceOfTheDataFileIsRefusedWithoutBlocking) {
  const std::string dir = SavedCheckpoint(FreshTestDir());
  MakeFifo(dir + "/model.safetensors");
  ExpectRefused(dir, {"'model.safetensors' is a FIFO (named pipe), not a regular file"},
                {dir + "/model.safetensors"});
}

TEST(CheckpointPathsTest, DirectoryInPlaceOfTheDataFileIsRefused) {
  const std::string dir = SavedCheckpoint(FreshTestDir());
  fs::remove(dir + "/model.safetensors");
  fs::create_directory(dir + "/model.safetensors");
  ExpectRefused(dir, {"'model.safetensors' is a directory, not a regular file"});
}

TEST(CheckpointPathsTest, FifoInPlaceOfTheManifestIsRefusedWithoutBlocking) {
  const std::string dir = SavedCheckpoint(FreshTestDir());
  MakeFifo(dir + "/manifest.pb");
  ExpectRefused(dir, {"'manifest.pb' is a FIFO (named pipe), not a regular file"},
                {dir + "/manifest.pb"});
}

TEST(CheckpointPathsTest, DirectoryOrSymlinkInPlaceOfTheManifestIsRefused) {
  const std::string dir = SavedCheckpoint(FreshTestDir());
  fs::rename(dir + "/manifest.pb", dir + "/manifest.copy");
  fs::create_symlink("manifest.copy", dir + "/manifest.pb");
  ExpectRefused(dir, {"'manifest.pb' is a symbolic link"});
  fs::remove(dir + "/manifest.pb");
  fs::create_directory(dir + "/manifest.pb");
  ExpectRefused(dir, {"'manifest.pb' is a directory, not a regular file"});
}

// A Hugging Face directory (no manifest): links are followed (the Hub's cache is made of
// them), but a FIFO is refused without blocking, and names stay inside the directory.
TEST(CheckpointPathsTest, HuggingFaceDirectoryRefusesFifosAndNamesOutside) {
  const std::string root = FreshTestDir();
  const std::string dir = SavedCheckpoint(root);
  fs::remove(dir + "/manifest.pb");
  fs::create_directories(root + "/blobs");
  fs::rename(dir + "/model.safetensors", root + "/blobs/abc");
  fs::create_symlink("../../blobs/abc", dir + "/model.safetensors");
  EXPECT_EQ(VerifyProblems(VerifyCheckpoint(dir)), "");  // a link, as in the Hub's cache

  fs::remove(dir + "/model.safetensors");
  MakeFifo(dir + "/model.safetensors");
  const std::string fifo = dir + "/model.safetensors";
  EXPECT_THAT(WithinTimeout<std::string>({fifo}, [&] { return VerifyProblems(VerifyCheckpoint(dir)); }),
              HasSubstr("'model.safetensors' is a FIFO (named pipe), not a regular file"));
  EXPECT_THAT(
      std::string(WithinTimeout<absl::Status>({fifo}, [&] {
                    return SafetensorsFile::Open(fifo).status();
                  }).message()),
      HasSubstr("not a regular file (a FIFO)"));

  fs::remove(fifo);
  ASSERT_TRUE(WriteFileAtomically(dir + "/model.safetensors.index.json",
                                  "{\"weight_map\": {\"model.norm.weight\": \"/etc/passwd\"}}")
                  .ok());
  EXPECT_THAT(VerifyProblems(VerifyCheckpoint(dir)), HasSubstr("\"/etc/passwd\""));
}

}  // namespace
}  // namespace cpptrain
