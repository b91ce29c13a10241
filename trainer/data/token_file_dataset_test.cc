#include "trainer/data/token_file_dataset.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "base/torch_status.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return ::testing::TempDir() + "/" + name; }

std::vector<unsigned char> ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(in), {});
}

void WriteBytes(const std::string& path, size_t n) {
  std::ofstream out(path, std::ios::binary);
  out << std::string(n, '\x01');
}

std::vector<int64_t> ToVector(const at::Tensor& t) {
  EXPECT_EQ(t.scalar_type(), at::kLong);
  const at::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

TEST(TokenFileDatasetTest, Uint16RoundTripCutsWholeSamples) {
  const std::string path = TempPath("u16.bin");
  const std::vector<int64_t> tokens = {0, 1, 65535, 258, 7, 40000, 9, 10, 11, 12, 13};
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenWidth::kUint16).ok());
  EXPECT_EQ(ReadBytes(path).size(), 22u);

  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 3);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->num_tokens(), 11);
  EXPECT_EQ((*ds)->size(), 3);  // 11 / 3: the two trailing tokens are dropped.
  for (int64_t i = 0; i < 3; ++i) {
    Example e = (*ds)->Get(i);
    EXPECT_FALSE(e.labels.defined());
    EXPECT_EQ(ToVector(e.inputs),
              std::vector<int64_t>(tokens.begin() + 3 * i, tokens.begin() + 3 * i + 3));
  }
  EXPECT_FALSE((*ds)->Get(3).inputs.defined());
  EXPECT_FALSE((*ds)->Get(-1).inputs.defined());
}

TEST(TokenFileDatasetTest, Uint32RoundTrip) {
  const std::string path = TempPath("u32.bin");
  const std::vector<int64_t> tokens = {4294967295LL, 70000, 0, 16909060, 5, 6};
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenWidth::kUint32).ok());
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint32, 2);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 3);
  EXPECT_EQ(ToVector((*ds)->Get(0).inputs), (std::vector<int64_t>{4294967295LL, 70000}));
  EXPECT_EQ(ToVector((*ds)->Get(1).inputs), (std::vector<int64_t>{0, 16909060}));
  EXPECT_EQ(ToVector((*ds)->Get(2).inputs), (std::vector<int64_t>{5, 6}));
}

TEST(TokenFileDatasetTest, TokensAtOrAboveTheVocabularyAreNamed) {
  for (TokenWidth width : {TokenWidth::kUint16, TokenWidth::kUint32}) {
    const std::string path = TempPath("vocab.bin");
    // The 1000 is in the dropped tail; the 64 at token 5 is the first at or above 64.
    const std::vector<int64_t> tokens = {1, 2, 3, 63, 0, 64, 70, 5, 1000};
    ASSERT_TRUE(WriteTokenFile(path, tokens, width).ok());
    auto ds = TokenFileDataset::Open(path, width, 4);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_TRUE((*ds)->CheckTokensBelow(71).ok());
    const absl::Status refused = (*ds)->CheckTokensBelow(64);
    EXPECT_THAT(
        std::string(refused.message()),
        ::testing::AllOf(
            HasSubstr(path),
            HasSubstr("token 64 at byte offset " + std::to_string(5 * TokenWidthBytes(width))),
            HasSubstr("vocab_size 64"), HasSubstr("largest token in the file: 70"),
            HasSubstr(std::string(TokenWidthName(width)))));
  }
}

// Writes a token file of `tokens` and its <file>.meta.json holding `meta`.
std::string TokenFileWithMeta(const std::string& name, const std::vector<int64_t>& tokens,
                              TokenWidth width, const std::string& meta) {
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteTokenFile(path, tokens, width).ok());
  std::ofstream(TokenFileMetadataPath(path)) << meta;
  return path;
}

std::string OpenError(const std::string& path, TokenWidth width) {
  auto ds = TokenFileDataset::Open(path, width, 2);
  EXPECT_FALSE(ds.ok()) << path;
  return ds.ok() ? "" : std::string(ds.status().message());
}

TEST(TokenFileDatasetTest, MetadataBesideTheFileIsReadAndChecked) {
  const std::string path = TokenFileWithMeta(
      "meta_ok.bin", {1, 2, 3, 4}, TokenWidth::kUint16,
      R"({"format": "cpptrain-tokens", "dtype": "uint16", "vocab_size": 10, "eos_id": 9,
          "num_tokens": 4, "tokenizer": "t.json"})");
  auto ds = TokenFileDataset::Open(path, TokenWidth::kUint16, 2);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_TRUE((*ds)->metadata().has_value());
  EXPECT_EQ((*ds)->metadata()->vocab_size, 10);
  EXPECT_EQ((*ds)->metadata()->eos_id, 9);
  EXPECT_TRUE((*ds)->CheckTokensBelow(10).ok());
  // The model's vocabulary may be larger (padded); a smaller one is refused by the metadata
  // even though every token here is below it.
  EXPECT_TRUE((*ds)->CheckTokensBelow(16).ok());
  EXPECT_THAT(std::string((*ds)->CheckTokensBelow(8).message()),
              ::testing::AllOf(HasSubstr(path + ".meta.json"), HasSubstr("vocab_size 10"),
                               HasSubstr("the model's vocab_size is 8")));
}

TEST(TokenFileDatasetTest, MetadataThatDisagreesWithTheFileIsRefused) {
  const std::string u16 =
      R"({"dtype": "uint16", "vocab_size": 10, "eos_id": null, "num_tokens": 4})";
  EXPECT_THAT(
      OpenError(TokenFileWithMeta("meta_dtype.bin", {1, 2, 3, 4}, TokenWidth::kUint32, u16),
                TokenWidth::kUint32),
      ::testing::AllOf(HasSubstr("meta_dtype.bin.meta.json"), HasSubstr("dtype \"uint16\""),
                       HasSubstr("token_dtype UINT32"), HasSubstr("set data.token_dtype: UINT16")));
  EXPECT_THAT(
      OpenError(TokenFileWithMeta("meta_count.bin", {1, 2, 3, 4, 5, 6}, TokenWidth::kUint16, u16),
                TokenWidth::kUint16),
      ::testing::AllOf(HasSubstr("holds 6 tokens"), HasSubstr("num_tokens 4")));
  EXPECT_THAT(OpenError(TokenFileWithMeta("meta_eos.bin", {1, 2}, TokenWidth::kUint16,
                                          R"({"dtype": "uint16", "vocab_size": 10, )"
                                          R"("eos_id": 10, "num_tokens": 2})"),
                        TokenWidth::kUint16),
              ::testing::AllOf(HasSubstr("eos_id is 10"), HasSubstr("vocab_size 10")));
  EXPECT_THAT(OpenError(TokenFileWithMeta("meta_missing.bin", {1, 2}, TokenWidth::kUint16,
                                          R"({"dtype": "uint16", "num_tokens": 2})"),
                        TokenWidth::kUint16),
              HasSubstr("vocab_size is missing or not an integer"));
  EXPECT_THAT(OpenError(TokenFileWithMeta("meta_bad.bin", {1, 2}, TokenWidth::kUint16,
                                          R"({"dtype": "uint16", "vocab_size": 1.5})"),
                        TokenWidth::kUint16),
              HasSubstr("not a flat JSON object"));
}

TEST(TokenFileDatasetTest, FileIsLittleEndian) {
  const std::string path = TempPath("le.bin");
  ASSERT_TRUE(WriteTokenFile(path, {0x0102, 0x0A0B}, TokenWidth::kUint16).ok());
  EXPECT_EQ(ReadBytes(path), (std::vector<unsigned char>{0x02, 0x01, 0x0B, 0x0A}));
  ASSERT_TRUE(WriteTokenFile(path, {0x01020304}, TokenWidth::kUint32).ok());
  EXPECT_EQ(ReadBytes(path), (std::vector<unsigned char>{0x04, 0x03, 0x02, 0x01}));
}

TEST(TokenFileDatasetTest, RewritingTheFileKeepsOpenDatasetsValid) {
  const std::string path = TempPath("rewrite.bin");
  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 3, 4}, TokenWidth::kUint16).ok());
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 2);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_TRUE(WriteTokenFile(path, {9}, TokenWidth::kUint16).ok());
  EXPECT_EQ(ToVector((*ds)->Get(1).inputs), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(ReadBytes(path).size(), 2u);
}

TEST(TokenFileDatasetTest, TruncatedFileNamesSizeAndDtype) {
  const std::string path = TempPath("truncated.bin");
  WriteBytes(path, 1001);
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 4);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(ds.status().message());
  EXPECT_THAT(message, HasSubstr(path));
  EXPECT_THAT(message, HasSubstr("1001 bytes, not a multiple of 2"));
  EXPECT_THAT(message, HasSubstr("UINT16"));
  EXPECT_THAT(message, HasSubstr("truncated"));

  WriteBytes(path, 1002);
  ds = TokenFileDataset::Open(path, TokenWidth::kUint32, 4);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()),
              HasSubstr("not a multiple of 4 (token_dtype UINT32)"));
  EXPECT_TRUE(TokenFileDataset::Open(path, TokenWidth::kUint16, 4).ok());
}

// A file cut short while a run reads it (another job rewrote it in place) used to be a SIGBUS
// on the first sample past the new end (the memory mapping); now reading that sample is an
// error naming the file and both sizes, which the data loader (CatchTorch) returns as a status.
TEST(TokenFileDatasetTest, FileTruncatedWhileOpenIsAnErrorNotACrash) {
  const std::string path = TempPath("shrinking.bin");
  std::vector<int64_t> tokens(8192);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i % 1000) + 1;
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenWidth::kUint16).ok());
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 64);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 128);
  ASSERT_EQ(::truncate(path.c_str(), 1000), 0);
  // The samples still wholly in the file read as before.
  EXPECT_EQ(ToVector((*ds)->Get(3).inputs)[0], 3 * 64 + 1);
  const absl::Status read = CatchTorch([&] { (*ds)->Get(127); });
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.message()),
              AllOf(HasSubstr(path), HasSubstr("was truncated while in use"),
                    HasSubstr("now holds 1000 bytes"), HasSubstr("16384 bytes when it was opened"),
                    HasSubstr("sample 127 needs bytes [16256, 16384)")));
  const absl::Status check = (*ds)->CheckTokensBelow(2000);
  EXPECT_THAT(std::string(check.message()), AllOf(HasSubstr(path), HasSubstr("now holds 1000")));
}

// uint32 ids below 65536 read as uint16 without a metadata file: every second 16-bit word is
// the zero high half, and every id is below the vocabulary, so nothing else notices.
TEST(TokenFileDatasetTest, Uint32IdsReadAsUint16AreRecognised) {
  const std::string path = TempPath("wide.bin");
  std::vector<int64_t> tokens(300);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int64_t>(i * 7 % 500) + 1;
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenWidth::kUint32).ok());
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 15);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const absl::Status check = (*ds)->CheckTokensBelow(1000);
  EXPECT_EQ(check.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(check.message()),
              AllOf(HasSubstr(path), HasSubstr("every second one of the 600 16-bit words in its samples is 0"),
                    HasSubstr("set data.token_dtype: UINT32")));
  // Read as what it is, it passes.
  ds = TokenFileDataset::Open(path, TokenWidth::kUint32, 16);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE((*ds)->CheckTokensBelow(1000).ok());
  // A real uint16 file with many zeros, but not at every odd position, passes.
  for (size_t i = 0; i < tokens.size(); i += 2) tokens[i + 1] = i % 10 == 0 ? 5 : 0;
  ASSERT_TRUE(WriteTokenFile(path, tokens, TokenWidth::kUint16).ok());
  ds = TokenFileDataset::Open(path, TokenWidth::kUint16, 16);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_TRUE((*ds)->CheckTokensBelow(1000).ok());
}

TEST(TokenFileDatasetTest, MissingFileSaysCheckThePath) {
  const std::string path = TempPath("no_such_file.bin");
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 4);
  ASSERT_FALSE(ds.ok());
  EXPECT_EQ(ds.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("check the path"));
}

TEST(TokenFileDatasetTest, ShorterThanOneSample) {
  const std::string path = TempPath("short.bin");
  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 3, 4, 5}, TokenWidth::kUint16).ok());
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 8);
  ASSERT_FALSE(ds.ok());
  const std::string message(ds.status().message());
  EXPECT_THAT(message, HasSubstr("holds 5 tokens"));
  EXPECT_THAT(message, HasSubstr("shorter than one sample of seq_len 8"));
  EXPECT_TRUE(TokenFileDataset::Open(path, TokenWidth::kUint16, 5).ok());

  const std::string empty = TempPath("empty.bin");
  WriteBytes(empty, 0);
  ds = TokenFileDataset::Open(empty, TokenWidth::kUint16, 1);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("shorter than one sample"));
}

TEST(TokenFileDatasetTest, RejectsBadSeqLenAndDirectory) {
  const std::string path = TempPath("seq.bin");
  ASSERT_TRUE(WriteTokenFile(path, {1, 2, 3}, TokenWidth::kUint16).ok());
  absl::StatusOr<std::shared_ptr<TokenFileDataset>> ds =
      TokenFileDataset::Open(path, TokenWidth::kUint16, 0);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("seq_len is 0"));

  ds = TokenFileDataset::Open(::testing::TempDir(), TokenWidth::kUint16, 1);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("not a regular file"));
}

TEST(TokenFileDatasetTest, WriteRangeChecksTokens) {
  const std::string path = TempPath("range.bin");
  absl::Status status = WriteTokenFile(path, {1, 65536}, TokenWidth::kUint16);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("token 65536 at position 1"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("UINT32"));
  status = WriteTokenFile(path, {3, -1}, TokenWidth::kUint32);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("token -1 at position 1"));
  EXPECT_FALSE(WriteTokenFile(path, {4294967296LL}, TokenWidth::kUint32).ok());
  EXPECT_TRUE(WriteTokenFile(path, {65536}, TokenWidth::kUint32).ok());

  status = WriteTokenFile(TempPath("no_dir/x.bin"), {1}, TokenWidth::kUint16);
  ASSERT_FALSE(status.ok());
  EXPECT_THAT(std::string(status.message()), HasSubstr("directory does not exist"));
}

}  // namespace
}  // namespace cpptrain
