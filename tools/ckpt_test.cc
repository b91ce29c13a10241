#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/files.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/test_dirs.h"
#include "models/configs.h"
#include "models/decoder.h"
#include "sharding/host_group.h"
#include "proto/checkpoint.pb.h"
#include "tools/ckpt_lib.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;

// A fresh directory under TEST_TMPDIR named after the running test, plus `name`.
std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(tmp ? tmp : "/tmp") / info->name() / name;
  EXPECT_TRUE(RemoveTree(dir.string()).ok());
  fs::create_directories(dir.parent_path());
  return dir.string();
}

// The first line of `text` that contains `needle` (empty when none does).
std::string LineWith(const std::string& text, const std::string& needle) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(needle) != std::string::npos) return line;
  }
  return "";
}

std::shared_ptr<DecoderLM> TinyModel(uint64_t seed) {
  torch::manual_seed(seed);
  absl::StatusOr<proto::DecoderConfig> config = NamedDecoderConfig("tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  absl::StatusOr<std::shared_ptr<DecoderLM>> model = BuildDecoder(*config);
  EXPECT_TRUE(model.ok()) << model.status();
  return *model;
}

// Writes `model` with SaveModelState from one process, without an optimizer.
void SaveFull(const std::string& dir, DecoderLM& model, bool full_model = true) {
  fs::create_directories(dir);
  SingleProcessGroup alone;
  SaveModelStateOptions options;
  options.full_model = full_model;
  ASSERT_TRUE(SaveModelState(dir, model, /*optimizer=*/nullptr, alone, options).ok());
}

std::map<std::string, torch::Tensor> Parameters(DecoderLM& model) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    out[item.key()] = item.value().detach().clone();
  }
  return out;
}

std::string ShardName(int r, int n) {
  return absl::StrFormat("shard-%05d-of-%05d.safetensors", r, n);
}

// Every tensor of `path` equals the parameter of the same name, and there are no others.
void ExpectFileHoldsParameters(const std::string& path,
                               const std::map<std::string, torch::Tensor>& params) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::set<std::string> names((*file)->names().begin(), (*file)->names().end());
  std::set<std::string> expected;
  for (const auto& [name, p] : params) expected.insert(name);
  EXPECT_EQ(names, expected);
  for (const auto& [name, p] : params) {
    absl::StatusOr<at::Tensor> t = (*file)->Get(name);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_EQ(t->scalar_type(), p.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(*t, p)) << name;
  }
}

TEST(ShardRowRangeTest, SplitsLikeFullyShard) {
  // ceil(8 / 3) = 3: [0, 3), [3, 6), [6, 8).
  EXPECT_EQ(ShardRowRange(8, 3, 0).begin, 0);
  EXPECT_EQ(ShardRowRange(8, 3, 0).end, 3);
  EXPECT_EQ(ShardRowRange(8, 3, 1).begin, 3);
  EXPECT_EQ(ShardRowRange(8, 3, 1).end, 6);
  EXPECT_EQ(ShardRowRange(8, 3, 2).begin, 6);
  EXPECT_EQ(ShardRowRange(8, 3, 2).end, 8);
  // ceil(2 / 3) = 1: rank 2 gets nothing.
  EXPECT_EQ(ShardRowRange(2, 3, 1).rows(), 1);
  EXPECT_EQ(ShardRowRange(2, 3, 2).rows(), 0);
  EXPECT_EQ(ShardRowRange(2, 3, 2).begin, 2);
  EXPECT_EQ(ShardRowRange(0, 3, 0).rows(), 0);
  EXPECT_EQ(ShardRowRange(5, 1, 0).rows(), 5);
}

TEST(CkptTest, ToShardedLoadsAndConvertsBackToFull) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::map<std::string, torch::Tensor> original = Parameters(*model);
  const std::string full = TestDir("full");
  const std::string sharded = TestDir("sharded");
  const std::string back = TestDir("back");
  SaveFull(full, *model);

  absl::StatusOr<ConvertResult> to_sharded = ConvertToSharded(full, sharded, 3);
  ASSERT_TRUE(to_sharded.ok()) << to_sharded.status();
  EXPECT_EQ(to_sharded->tensors, static_cast<int64_t>(original.size()));
  for (int r = 0; r < 3; ++r) EXPECT_TRUE(fs::exists(fs::path(sharded) / ShardName(r, 3))) << r;
  EXPECT_TRUE(fs::exists(fs::path(sharded) / kManifestFileName));
  EXPECT_FALSE(fs::exists(fs::path(sharded) / kSafetensorsFileName));
  EXPECT_EQ(to_sharded->files.size(), 4u);

  // The manifest: every parameter, its full shape and dtype, and FullyShard's split.
  absl::StatusOr<proto::CheckpointManifest> manifest = ReadManifest(sharded);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->world_size(), 3);
  ASSERT_EQ(manifest->tensors_size(), static_cast<int>(original.size()));
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards;
  for (int r = 0; r < 3; ++r) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open((fs::path(sharded) / ShardName(r, 3)).string());
    ASSERT_TRUE(file.ok()) << file.status();
    shards[ShardName(r, 3)] = std::move(*file);
  }
  for (const proto::CheckpointTensor& t : manifest->tensors()) {
    ASSERT_EQ(t.name().rfind("model.", 0), 0u) << t.name();
    const std::string param = t.name().substr(6);
    ASSERT_EQ(original.count(param), 1u) << t.name();
    const torch::Tensor& p = original.at(param);
    EXPECT_EQ(std::vector<int64_t>(t.shape().begin(), t.shape().end()), p.sizes().vec());
    EXPECT_EQ(t.dtype(), c10::toString(p.scalar_type()));
    int piece = 0;
    for (int r = 0; r < 3; ++r) {
      const RowRange range = ShardRowRange(p.size(0), 3, r);
      if (range.rows() == 0) continue;
      ASSERT_LT(piece, t.pieces_size()) << t.name();
      const proto::TensorPiece& pc = t.pieces(piece++);
      EXPECT_EQ(pc.file(), ShardName(r, 3));
      EXPECT_EQ(pc.key(), t.name());
      EXPECT_EQ(pc.row_begin(), range.begin);
      EXPECT_EQ(pc.rows(), range.rows());
      absl::StatusOr<at::Tensor> rows = shards.at(pc.file())->Get(pc.key());
      ASSERT_TRUE(rows.ok()) << rows.status();
      EXPECT_TRUE(torch::equal(*rows, p.narrow(0, range.begin, range.rows()))) << t.name();
    }
    EXPECT_EQ(piece, t.pieces_size()) << t.name();
  }

  // LoadModelState reads the sharded form into a model drawn from another seed.
  std::shared_ptr<DecoderLM> fresh = TinyModel(2);
  bool differs = false;
  for (const auto& [name, p] : Parameters(*fresh)) differs |= !torch::equal(p, original.at(name));
  ASSERT_TRUE(differs) << "seeds 1 and 2 drew the same model; the load below would prove nothing";
  absl::Status loaded = LoadModelState(sharded, *fresh, /*optimizer=*/nullptr);
  ASSERT_TRUE(loaded.ok()) << loaded;
  for (const auto& [name, p] : Parameters(*fresh)) {
    EXPECT_TRUE(torch::equal(p, original.at(name))) << name;
  }

  // And back to the full form.
  absl::StatusOr<ConvertResult> to_full = ConvertToFull(sharded, back);
  ASSERT_TRUE(to_full.ok()) << to_full.status();
  EXPECT_EQ(to_full->tensors, static_cast<int64_t>(original.size()));
  // model.safetensors, and the configs from the decoder config the manifests carried along.
  int64_t bytes = 0;
  for (const std::string& file : to_full->files) bytes += fs::file_size(file);
  EXPECT_EQ(to_full->bytes, bytes);
  EXPECT_EQ(std::distance(fs::directory_iterator(back), fs::directory_iterator()), 3);
  EXPECT_TRUE(fs::exists(fs::path(back) / "config.json"));
  ExpectFileHoldsParameters((fs::path(back) / kSafetensorsFileName).string(), original);
}

TEST(CkptTest, ToFullReadsTheShardFilesOfASave) {
  std::shared_ptr<DecoderLM> model = TinyModel(3);
  const std::string saved = TestDir("saved");
  const std::string out = TestDir("out");
  SaveFull(saved, *model, /*full_model=*/false);
  ASSERT_FALSE(fs::exists(fs::path(saved) / kSafetensorsFileName));
  absl::StatusOr<ConvertResult> result = ConvertToFull(saved, out);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectFileHoldsParameters((fs::path(out) / kSafetensorsFileName).string(), Parameters(*model));
  // A Hugging Face model directory: config.json (the model's config, read back equal) and
  // generation_config.json beside the weights.
  EXPECT_EQ(result->files.size(), 3u);
  absl::StatusOr<proto::DecoderConfig> config =
      DecoderConfigFromHfConfig((fs::path(out) / "config.json").string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(HfConfigJson(*config), HfConfigJson(model->config()));
  EXPECT_TRUE(fs::exists(fs::path(out) / "generation_config.json"));
}

TEST(CkptTest, HuggingFaceDirWithScalarsAndEmptyChunksRoundTrips) {
  const std::string hf = TestDir("hf");
  const std::string sharded = TestDir("sharded");
  const std::string back = TestDir("back");
  fs::create_directories(hf);
  const std::map<std::string, torch::Tensor> tensors = {
      {"a", torch::arange(8, torch::kFloat).view({2, 4})},    // rank 2 of 3 gets no rows
      {"b", torch::arange(7, torch::kFloat).to(torch::kBFloat16)},
      {"s", torch::scalar_tensor(42, torch::kLong)},  // 0-d: whole in shard 0
  };
  ASSERT_TRUE(WriteSafetensors((fs::path(hf) / kSafetensorsFileName).string(),
                               {tensors.begin(), tensors.end()})
                  .ok());

  absl::StatusOr<ConvertResult> to_sharded = ConvertToSharded(hf, sharded, 3);
  ASSERT_TRUE(to_sharded.ok()) << to_sharded.status();
  absl::StatusOr<proto::CheckpointManifest> manifest = ReadManifest(sharded);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  std::map<std::string, const proto::CheckpointTensor*> by_name;
  for (const auto& t : manifest->tensors()) by_name[t.name()] = &t;
  ASSERT_EQ(by_name.size(), 3u);
  EXPECT_EQ(by_name.at("model.a")->pieces_size(), 2);
  EXPECT_EQ(by_name.at("model.b")->pieces_size(), 3);
  EXPECT_EQ(by_name.at("model.b")->dtype(), "BFloat16");
  const proto::CheckpointTensor& s = *by_name.at("model.s");
  EXPECT_EQ(s.shape_size(), 0);
  ASSERT_EQ(s.pieces_size(), 1);
  EXPECT_EQ(s.pieces(0).file(), ShardName(0, 3));
  EXPECT_EQ(s.pieces(0).rows(), 1);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> shard2 =
      SafetensorsFile::Open((fs::path(sharded) / ShardName(2, 3)).string());
  ASSERT_TRUE(shard2.ok()) << shard2.status();
  EXPECT_FALSE((*shard2)->Has("model.a"));
  EXPECT_FALSE((*shard2)->Has("model.s"));

  absl::StatusOr<ConvertResult> to_full = ConvertToFull(sharded, back);
  ASSERT_TRUE(to_full.ok()) << to_full.status();
  ExpectFileHoldsParameters((fs::path(back) / kSafetensorsFileName).string(), tensors);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open((fs::path(back) / kSafetensorsFileName).string());
  ASSERT_TRUE(file.ok());
  EXPECT_TRUE((*file)->Info("s")->shape.empty());

  std::ostringstream text;
  ASSERT_TRUE(InspectCheckpoint(hf, text).ok());
  EXPECT_NE(text.str().find("model directory"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("BFloat16"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("3 tensors"), std::string::npos) << text.str();
}

TEST(CkptTest, IndexedHuggingFaceDirConvertsToOneFile) {
  const std::string hf = TestDir("hf");
  const std::string out = TestDir("out");
  fs::create_directories(hf);
  const std::map<std::string, torch::Tensor> tensors = {
      {"x", torch::arange(6, torch::kFloat).view({3, 2})},
      {"y", torch::arange(5, torch::kInt)},
  };
  ASSERT_TRUE(WriteSafetensors((fs::path(hf) / "part-1.safetensors").string(),
                               {{"x", tensors.at("x")}})
                  .ok());
  ASSERT_TRUE(WriteSafetensors((fs::path(hf) / "part-2.safetensors").string(),
                               {{"y", tensors.at("y")}})
                  .ok());
  ASSERT_TRUE(WriteSafetensorsIndex(hf, {{"x", "part-1.safetensors"}, {"y", "part-2.safetensors"}},
                                    6 * 4 + 5 * 4)
                  .ok());

  std::ostringstream text;
  ASSERT_TRUE(InspectCheckpoint(hf, text).ok());
  EXPECT_NE(LineWith(text.str(), "  y ").find("part-2.safetensors"), std::string::npos)
      << text.str();
  absl::StatusOr<ConvertResult> result = ConvertToFull(hf, out);
  ASSERT_TRUE(result.ok()) << result.status();
  ExpectFileHoldsParameters((fs::path(out) / kSafetensorsFileName).string(), tensors);
}

TEST(CkptTest, InspectNamesTheEngineAndTheTensors) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string full = TestDir("full");
  SaveFull(full, *model);
  const std::string first = model->named_parameters(/*recurse=*/true).begin()->key();

  std::ostringstream text;
  absl::Status status = InspectCheckpoint(full, text);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_NE(text.str().find("engine: local, world size: 1"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("model." + first), std::string::npos) << text.str();
  EXPECT_NE(LineWith(text.str(), "trainer_state.textproto").find("absent"), std::string::npos)
      << text.str();
  EXPECT_NE(LineWith(text.str(), "model.safetensors ").find("present"), std::string::npos)
      << text.str();
  EXPECT_NE(text.str().find(absl::StrCat(model->named_parameters().size(), " tensors (")),
            std::string::npos)
      << text.str();

  const std::string sharded = TestDir("sharded");
  ASSERT_TRUE(ConvertToSharded(full, sharded, 3).ok());
  std::ostringstream sharded_text;
  ASSERT_TRUE(InspectCheckpoint(sharded, sharded_text).ok());
  EXPECT_NE(sharded_text.str().find("world size: 3"), std::string::npos) << sharded_text.str();
  EXPECT_NE(LineWith(sharded_text.str(), ShardName(2, 3)).find("named by the manifest, present"),
            std::string::npos)
      << sharded_text.str();
}

TEST(CkptTest, DirectoryWithoutAModelIsAClearError) {
  const std::string empty = TestDir("empty");
  fs::create_directories(empty);
  const std::string out1 = TestDir("out1");
  std::ostringstream text;
  for (const absl::Status& status :
       {InspectCheckpoint(empty, text), ConvertToFull(empty, out1).status(),
        ConvertToSharded(empty, TestDir("out2"), 2).status()}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
    EXPECT_NE(status.message().find(empty), std::string::npos) << status;
    EXPECT_NE(status.message().find("manifest.pb"), std::string::npos) << status;
    EXPECT_NE(status.message().find("model.safetensors"), std::string::npos) << status;
  }
  EXPECT_FALSE(fs::exists(out1));  // nothing is created for a bad input

  const absl::Status missing = InspectCheckpoint(empty + "/no_such_dir", text);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  EXPECT_NE(missing.message().find("is not a directory"), std::string::npos) << missing;
}

TEST(CkptTest, RefusesBadRanksAndAnOutputThatHoldsAModel) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string full = TestDir("full");
  SaveFull(full, *model);

  const absl::Status zero = ConvertToSharded(full, TestDir("zero"), 0).status();
  EXPECT_EQ(zero.code(), absl::StatusCode::kInvalidArgument) << zero;
  EXPECT_NE(zero.message().find("ranks is 0"), std::string::npos) << zero;

  const absl::Status same = ConvertToFull(full, full).status();
  EXPECT_FALSE(same.ok());
  EXPECT_NE(same.message().find("is the input directory"), std::string::npos) << same;

  const std::string taken = TestDir("taken");
  ASSERT_TRUE(ConvertToFull(full, taken).ok());
  const auto written = fs::last_write_time(fs::path(taken) / kSafetensorsFileName);
  const absl::Status again = ConvertToFull(full, taken).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_NE(again.message().find("already holds model.safetensors"), std::string::npos) << again;
  EXPECT_EQ(fs::last_write_time(fs::path(taken) / kSafetensorsFileName), written);
}

TEST(CkptTest, ManifestWithAMissingShardIsAClearError) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string full = TestDir("full");
  const std::string sharded = TestDir("sharded");
  SaveFull(full, *model);
  ASSERT_TRUE(ConvertToSharded(full, sharded, 3).ok());
  fs::remove(fs::path(sharded) / ShardName(1, 3));
  const absl::Status status = ConvertToFull(sharded, TestDir("out")).status();
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(ShardName(1, 3)), std::string::npos) << status;
}

// ---------------------------------------------------------------------------------------------
// Checksums: inspect shows them, verify checks every byte, conversions keep them

// Flips one bit of tensor `key`'s data in the safetensors file `path`.
void DamageTensor(const std::string& path, const std::string& key) {
  int64_t begin = 0;
  {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    begin = (*file)->Info(key)->begin;
  }
  std::string bytes = ReadBytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  bytes[8 + header + begin] ^= 0x04;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

constexpr char kNorm[] = "model.norm.weight";

TEST(CkptChecksumTest, InspectShowsEachChecksumAndThatItVerifies) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string full = TestDir("full");
  SaveFull(full, *model);
  absl::StatusOr<proto::CheckpointManifest> manifest = ReadManifest(full);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  uint32_t norm_crc = 0;
  for (const auto& t : manifest->tensors()) {
    if (t.name() == std::string("model.") + kNorm) norm_crc = t.pieces(0).crc32c();
  }
  std::ostringstream text;
  ASSERT_TRUE(InspectCheckpoint(full, text).ok());
  EXPECT_NE(LineWith(text.str(), "tensor ").find("crc32c"), std::string::npos) << text.str();
  const std::string row = LineWith(text.str(), std::string("model.") + kNorm);
  EXPECT_NE(row.find(Crc32cHex(norm_crc)), std::string::npos) << text.str();
  EXPECT_NE(row.find(" ok"), std::string::npos) << text.str();
  EXPECT_NE(text.str().find("every checksum matches, every value is finite"), std::string::npos)
      << text.str();

  std::ostringstream verified;
  EXPECT_TRUE(VerifyDirectory(full, verified).ok()) << verified.str();
  EXPECT_NE(verified.str().find("manifest format 2"), std::string::npos) << verified.str();
}

TEST(CkptChecksumTest, VerifyNamesTheDamagedFileAndTensor) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string full = TestDir("full");
  SaveFull(full, *model);
  DamageTensor((fs::path(full) / kSafetensorsFileName).string(), kNorm);

  std::ostringstream text;
  const absl::Status status = VerifyDirectory(full, text);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find(absl::StrCat("file 'model.safetensors', tensor '", kNorm, "'")),
            std::string::npos)
      << status;
  EXPECT_NE(status.message().find("checksum mismatch: expected crc32c"), std::string::npos)
      << status;
  EXPECT_NE(text.str().find("1 problem(s)"), std::string::npos) << text.str();

  // inspect shows it, and still succeeds (it describes; verify judges).
  std::ostringstream inspected;
  ASSERT_TRUE(InspectCheckpoint(full, inspected).ok());
  EXPECT_NE(LineWith(inspected.str(), std::string("model.") + kNorm).find("FAILED"),
            std::string::npos)
      << inspected.str();

  // A conversion refuses to give the damaged bytes fresh checksums.
  const std::string out = TestDir("out");
  const absl::Status converted = ConvertToFull(full, out).status();
  EXPECT_EQ(converted.code(), absl::StatusCode::kDataLoss) << converted;
  EXPECT_NE(converted.message().find("ckpt verify"), std::string::npos) << converted;
  EXPECT_FALSE(fs::exists(fs::path(out) / kSafetensorsFileName));
}

TEST(CkptChecksumTest, ToShardedWritesChecksumsThatLoadingVerifies) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string full = TestDir("full");
  const std::string sharded = TestDir("sharded");
  SaveFull(full, *model);
  ASSERT_TRUE(ConvertToSharded(full, sharded, 3).ok());
  absl::StatusOr<proto::CheckpointManifest> manifest = ReadManifest(sharded);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->format_version(), 2);
  for (const auto& t : manifest->tensors()) {
    for (const auto& piece : t.pieces()) EXPECT_TRUE(piece.has_crc32c()) << t.name();
  }
  std::ostringstream text;
  EXPECT_TRUE(VerifyDirectory(sharded, text).ok()) << text.str();

  DamageTensor((fs::path(sharded) / ShardName(1, 3)).string(), "model.model.embed_tokens.weight");
  std::shared_ptr<DecoderLM> fresh = TinyModel(2);
  const absl::Status loaded = LoadModelState(sharded, *fresh, /*optimizer=*/nullptr);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_NE(loaded.message().find(ShardName(1, 3)), std::string::npos) << loaded;
}

// A Trainer checkpoint (trainer_state.textproto beside the data) whose manifest.pb is gone:
// verify names the missing file instead of passing model.safetensors as a model directory,
// and so does every command.
TEST(CkptChecksumTest, VerifyRefusesATrainerCheckpointWithoutItsManifest) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  for (const bool full : {true, false}) {
    const std::string dir = TestDir(full ? "full" : "sharded");
    SaveFull(dir, *model, full);
    ASSERT_TRUE(WriteFileAtomically((fs::path(dir) / kTrainerStateFileName).string(),
                                    WithChecksumLine("global_step: 1\n"))
                    .ok());
    std::ostringstream text;
    ASSERT_TRUE(VerifyDirectory(dir, text).ok()) << text.str();
    fs::remove(fs::path(dir) / kManifestFileName);
    const absl::Status status = VerifyDirectory(dir, text);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
    EXPECT_NE(status.message().find(dir + "/manifest.pb' is missing, but trainer_state.textproto"),
              std::string::npos)
        << status;
    std::ostringstream inspected;
    EXPECT_EQ(InspectCheckpoint(dir, inspected).code(), absl::StatusCode::kDataLoss);
  }
}

// ckpt verify of a checkpoint with a FIFO for its data: refused without blocking.
TEST(CkptChecksumTest, VerifyRefusesAFifoWithoutBlocking) {
  std::shared_ptr<DecoderLM> model = TinyModel(1);
  const std::string dir = TestDir("fifo");
  SaveFull(dir, *model);
  const std::string fifo = (fs::path(dir) / kSafetensorsFileName).string();
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::ostringstream text;
  const absl::Status status = WithinTimeout<absl::Status>(
      {fifo}, [&] { return VerifyDirectory(dir, text); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  EXPECT_NE(status.message().find("'model.safetensors' is a FIFO (named pipe)"),
            std::string::npos)
      << status;
}

TEST(CkptChecksumTest, ModelDirectoriesWithAndWithoutChecksums) {
  const std::string hf = TestDir("hf");
  fs::create_directories(hf);
  const std::string path = (fs::path(hf) / kSafetensorsFileName).string();
  ASSERT_TRUE(WriteSafetensors(path, {{"w", torch::arange(8, torch::kFloat)}}).ok());
  std::ostringstream text;
  EXPECT_TRUE(VerifyDirectory(hf, text).ok()) << text.str();
  DamageTensor(path, "w");
  EXPECT_EQ(VerifyDirectory(hf, text).code(), absl::StatusCode::kDataLoss);

  SafetensorsWriteOptions plain;  // as transformers writes them: no checksums
  plain.checksums = false;
  ASSERT_TRUE(WriteSafetensors(path, {{"w", torch::arange(8, torch::kFloat)}}, {}, plain).ok());
  std::ostringstream unchecked;
  EXPECT_TRUE(VerifyDirectory(hf, unchecked).ok()) << unchecked.str();
  EXPECT_NE(unchecked.str().find("1 without a checksum"), std::string::npos) << unchecked.str();
}

}  // namespace
}  // namespace cpptrain
