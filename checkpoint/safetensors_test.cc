#include "checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <sys/stat.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/crc32c.h"
#include "checkpoint/test_dirs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using Tensors = std::vector<std::pair<std::string, at::Tensor>>;

SafetensorsWriteOptions NoChecksums() {
  SafetensorsWriteOptions options;
  options.checksums = false;
  return options;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Writes a safetensors file by hand: the little-endian length (of `header` unless `length` is
// given), the header, then `data`.
std::string WriteRaw(const std::string& path, const std::string& header, const std::string& data,
                     std::optional<uint64_t> length = std::nullopt) {
  const uint64_t n = length.value_or(header.size());
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  std::ofstream(path, std::ios::binary) << bytes << header << data;
  return path;
}

// The message of Open's error on `path`, checked to be InvalidArgument naming the file.
std::string OpenError(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  EXPECT_FALSE(file.ok()) << path << " opened";
  if (file.ok()) return "";
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument) << file.status();
  EXPECT_THAT(std::string(file.status().message()), HasSubstr(path));
  return std::string(file.status().message());
}

std::string HeaderError(const std::string& header, size_t data_bytes) {
  return OpenError(
      WriteRaw(FreshTestDir() + "/bad.safetensors", header, std::string(data_bytes, 0)));
}

void ExpectSameTensor(const at::Tensor& got, const at::Tensor& want, const std::string& name) {
  SCOPED_TRACE(name);
  EXPECT_EQ(got.scalar_type(), want.scalar_type());
  EXPECT_EQ(got.sizes(), want.sizes());
  if (got.scalar_type() == want.scalar_type() && got.sizes() == want.sizes()) {
    EXPECT_TRUE(at::equal(got, want)) << got << "\nexpected\n" << want;
  }
}

// The tensors of checkpoint/testdata/golden.safetensors, by the formulas of
// tests/golden/gen_safetensors_golden.py.
Tensors GoldenTensors() {
  auto arange = [](int64_t n, at::ScalarType dtype = at::kLong) {
    return at::arange(n, at::TensorOptions().dtype(dtype));
  };
  return {
      {"f64", arange(5, at::kDouble) / 3},
      {"f32", ((arange(12, at::kFloat) - 5) * 0.25).reshape({3, 4})},
      {"bf16", (arange(16, at::kFloat) * 0.1).to(at::kBFloat16).reshape({2, 8})},
      {"f16", ((arange(8, at::kFloat) - 3.5) * 0.3).to(at::kHalf).reshape({4, 2})},
      {"i64", (arange(6) * 1000000007 - 3).reshape({2, 3})},
      {"i32", (arange(4) * -7).to(at::kInt)},
      {"i16", ((arange(3) - 1) * 300).to(at::kShort)},
      {"i8", (60 - arange(4) * 40).to(at::kChar)},
      {"u8", (arange(5) * 50).to(at::kByte)},
      {"bool", arange(6) % 3 == 0},
      {"scalar", at::scalar_tensor(2.5, at::kFloat)},
      {"empty", at::zeros({0, 3}, at::kFloat)},
  };
}

std::unique_ptr<SafetensorsFile> OpenOrDie(const std::string& path) {
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status();
  return file.ok() ? std::move(file).value() : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Round trips

TEST(SafetensorsTest, RoundTripsEveryDtype) {
  const std::string path = FreshTestDir() + "/all.safetensors";
  const at::Tensor base = at::arange(24, at::kLong).reshape({2, 3, 4});
  Tensors tensors;
  for (at::ScalarType dtype : {at::kDouble, at::kFloat, at::kHalf, at::kBFloat16, at::kLong,
                               at::kInt, at::kShort, at::kChar, at::kByte, at::kBool}) {
    tensors.emplace_back(c10::toString(dtype),
                         (dtype == at::kBool ? base % 2 : base - 7).to(dtype));
  }
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->names().size(), tensors.size());
  EXPECT_TRUE(file->metadata().empty());
  for (const auto& [name, want] : tensors) {
    ASSERT_TRUE(file->Has(name)) << name;
    absl::StatusOr<SafetensorsTensorInfo> info = file->Info(name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(info->dtype, want.scalar_type());
    EXPECT_THAT(info->shape, ElementsAre(2, 3, 4));
    EXPECT_EQ(info->end - info->begin, 24 * static_cast<int64_t>(want.element_size()));
    EXPECT_EQ(info->begin % want.element_size(), 0) << name << " is not aligned";
    ExpectSameTensor(file->Get(name).value(), want, name);
    ExpectSameTensor(file->GetCopy(name).value(), want, name);
  }
}

TEST(SafetensorsTest, RoundTripsScalarEmptyAndNonContiguousTensors) {
  const std::string path = FreshTestDir() + "/shapes.safetensors";
  const at::Tensor matrix = at::arange(12, at::kFloat).reshape({3, 4});
  const Tensors tensors = {
      {"scalar", at::scalar_tensor(-1.5, at::kDouble)},
      {"empty", at::zeros({0, 5}, at::kHalf)},
      {"transposed", matrix.t()},
      {"strided", matrix.slice(/*dim=*/1, 0, 4, /*step=*/2)},
      {"broadcast", at::arange(3, at::kInt).expand({4, 3})},
  };
  ASSERT_FALSE(tensors[2].second.is_contiguous());
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  for (const auto& [name, want] : tensors) ExpectSameTensor(file->Get(name).value(), want, name);
  EXPECT_TRUE(file->Info("scalar")->shape.empty());
  EXPECT_EQ(file->Info("empty")->begin, file->Info("empty")->end);
}

TEST(SafetensorsTest, RoundTripsMetadataAndUnusualNames) {
  const std::string path = FreshTestDir() + "/meta.safetensors";
  const std::map<std::string, std::string> metadata = {
      {"format", "pt"},
      {"note", "quote \" backslash \\ newline \n tab \t bell \x07 u-umlaut \xC3\xBC"}};
  const std::string odd_name = "layer.0/\"w\"\\\xC3\xBC";
  ASSERT_TRUE(WriteSafetensors(path, {{odd_name, at::ones({2})}}, metadata).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->metadata(), metadata);
  EXPECT_THAT(file->names(), ElementsAre(odd_name));
}

TEST(SafetensorsTest, LaysOutLikeTheReferenceWriter) {
  const std::string path = FreshTestDir() + "/layout.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"b_half", at::ones({3}, at::kHalf)},
                                      {"a_bool", at::ones({1}, at::kBool)},
                                      {"z_long", at::ones({1}, at::kLong)},
                                      {"a_half", at::ones({1}, at::kHalf)},
                                      {"y_float", at::ones({1}, at::kFloat)}})
                  .ok());
  const std::string bytes = ReadBytes(path);
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  EXPECT_EQ(header_size % 8, 0u);
  EXPECT_EQ(bytes[8 + header_size - 1], ' ');  // padded with spaces
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  // By dtype (8-byte types first), then name: every tensor starts aligned.
  EXPECT_THAT(file->names(), ElementsAre("z_long", "y_float", "a_half", "b_half", "a_bool"));
}

// ---------------------------------------------------------------------------------------------
// Interoperability with Python's safetensors

TEST(SafetensorsTest, ReadsFileWrittenByPython) {
  auto file = OpenOrDie(TestdataPath("golden.safetensors"));
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  EXPECT_THAT(file->names(), ElementsAre("i64", "f64", "empty", "f32", "scalar", "i32", "bf16",
                                         "f16", "i16", "i8", "u8", "bool"));
  for (const auto& [name, want] : GoldenTensors()) {
    absl::StatusOr<at::Tensor> got = file->Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectSameTensor(*got, want, name);
  }
}

TEST(SafetensorsTest, WritesTheSameBytesAsPython) {
  const std::string path = FreshTestDir() + "/golden.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, GoldenTensors(), {{"format", "pt"}}, NoChecksums()).ok());
  EXPECT_EQ(ReadBytes(path), ReadBytes(TestdataPath("golden.safetensors")));
  // For `tests/golden/gen_safetensors_golden.py --check` (bazel-testlogs/.../outputs.zip).
  if (const char* outputs = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::filesystem::copy_file(path, absl::StrCat(outputs, "/cpp_golden.safetensors"),
                               std::filesystem::copy_options::overwrite_existing);
  }
}

// ---------------------------------------------------------------------------------------------
// Checksums

// The raw "__metadata__" object of `path`'s header, as text.
std::string RawHeader(const std::string& path) {
  const std::string bytes = ReadBytes(path);
  uint64_t length = 0;
  std::memcpy(&length, bytes.data(), 8);
  return bytes.substr(8, length);
}

TEST(SafetensorsChecksumTest, WritesOneCrc32cPerTensorAsAStringOfMetadata) {
  const std::string path = FreshTestDir() + "/crc.safetensors";
  const at::Tensor w = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor b = at::arange(5, at::kBFloat16);
  ASSERT_TRUE(WriteSafetensors(path, {{"w", w}, {"b", b}}, {{"format", "pt"}}).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  // Hidden from metadata(), which holds what the writer was given.
  EXPECT_EQ(file->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const uint32_t w_crc = Crc32c(w.data_ptr(), w.numel() * 4);
  EXPECT_EQ(file->StoredCrc32c("w").value(), w_crc);
  EXPECT_EQ(file->ComputeCrc32c("w").value(), w_crc);
  EXPECT_EQ(file->StoredCrc32c("b").value(), file->ComputeCrc32c("b").value());
  // In the header as string values (what the format allows), keyed by the tensor name.
  EXPECT_THAT(RawHeader(path), HasSubstr(absl::StrCat("\"crc32c.w\":\"", Crc32cHex(w_crc), "\"")));
  EXPECT_THAT(RawHeader(path), HasSubstr("\"format\":\"pt\""));
  EXPECT_EQ(RawHeader(path).size() % 8, 0u);
}

TEST(SafetensorsChecksumTest, StreamingWriterChecksumsWhatItAppends) {
  const std::string path = FreshTestDir() + "/stream.safetensors";
  const at::Tensor a = at::arange(6, at::kDouble).reshape({2, 3}).t();  // not contiguous
  auto writer =
      SafetensorsWriter::Create(path, {{"a", at::kDouble, {3, 2}}, {"e", at::kFloat, {0}}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_FALSE((*writer)->Crc32cOf("a").ok());  // not appended yet
  ASSERT_TRUE((*writer)->Append("a", a).ok());
  ASSERT_TRUE((*writer)->Append("e", at::zeros({0})).ok());
  const at::Tensor contiguous = a.contiguous();
  EXPECT_EQ((*writer)->Crc32cOf("a").value(), Crc32c(contiguous.data_ptr(), 6 * 8));
  EXPECT_EQ((*writer)->Crc32cOf("e").value(), 0u);  // no bytes
  ASSERT_TRUE((*writer)->Finish().ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  EXPECT_EQ(file->StoredCrc32c("a").value(), Crc32c(contiguous.data_ptr(), 6 * 8));
  ExpectSameTensor(file->Get("a").value(), a, "a");
}

TEST(SafetensorsChecksumTest, ChangedBytesNoLongerMatchTheStoredChecksum) {
  const std::string path = FreshTestDir() + "/flip.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"w", at::ones({64})}}).ok());
  std::string bytes = ReadBytes(path);
  bytes[bytes.size() - 10] ^= 0x40;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  EXPECT_NE(file->ComputeCrc32c("w").value(), file->StoredCrc32c("w").value().value());
  const absl::Status verified = file->VerifyCrc32c("w");
  EXPECT_EQ(verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(verified.message()),
              AllOf(HasSubstr(path), HasSubstr("tensor 'w': checksum mismatch: expected crc32c "),
                    HasSubstr(Crc32cHex(file->StoredCrc32c("w").value().value()))));
}

TEST(SafetensorsChecksumTest, FilesWithoutChecksumsHaveNone) {
  const std::string path = FreshTestDir() + "/plain.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"w", at::ones({2})}}, {}, NoChecksums()).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  EXPECT_FALSE(file->StoredCrc32c("w").value().has_value());
  EXPECT_THAT(RawHeader(path), Not(HasSubstr("crc32c")));
  auto golden = OpenOrDie(TestdataPath("golden.safetensors"));  // written by Python
  ASSERT_NE(golden, nullptr);
  EXPECT_FALSE(golden->StoredCrc32c("f32").value().has_value());
  EXPECT_EQ(golden->StoredCrc32c("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(SafetensorsChecksumTest, DamagedOrReservedChecksumEntriesAreErrors) {
  EXPECT_THAT(HeaderError(R"({"__metadata__":{"crc32c.w":"12345g78"},)"
                          R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                          1),
              HasSubstr(R"("crc32c.w" is "12345g78", expected 8 hex digits)"));
  EXPECT_THAT(HeaderError(R"({"__metadata__":{"crc32c.v":"00000000"},)"
                          R"("w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
                          1),
              HasSubstr("the checksum of tensor 'v', which the file does not hold"));
  EXPECT_THAT(SafetensorsWriter::Create(FreshTestDir() + "/x.safetensors", {{"w", at::kFloat, {1}}},
                                        {{"crc32c.w", "mine"}})
                  .status()
                  .message(),
              HasSubstr("metadata key \"crc32c.w\" starts with \"crc32c.\""));
}

// ---------------------------------------------------------------------------------------------
// Get, GetCopy, GetSlice

TEST(SafetensorsTest, GetViewsTheMappingAndOutlivesTheFile) {
  const std::string path = FreshTestDir() + "/view.safetensors";
  const at::Tensor want = at::arange(8, at::kFloat);
  ASSERT_TRUE(WriteSafetensors(path, {{"w", want}}).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  at::Tensor view = file->Get("w").value();
  EXPECT_EQ(view.data_ptr(), file->Get("w")->data_ptr());  // no copy
  at::Tensor copy = file->GetCopy("w").value();
  EXPECT_NE(copy.data_ptr(), view.data_ptr());
  copy.add_(1);  // the copy is writable
  file.reset();
  ExpectSameTensor(view, want, "view after the file is closed");
  ExpectSameTensor(copy, want + 1, "copy");
}

TEST(SafetensorsTest, GetSliceReadsRowsAlongDimZero) {
  const std::string path = FreshTestDir() + "/slice.safetensors";
  const at::Tensor matrix = at::arange(24, at::kBFloat16).reshape({6, 2, 2});
  ASSERT_TRUE(WriteSafetensors(path, {{"m", matrix}, {"s", at::scalar_tensor(1.0)}}).ok());
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  ExpectSameTensor(file->GetSlice("m", 2, 5).value(), matrix.slice(0, 2, 5), "rows 2..5");
  ExpectSameTensor(file->GetSlice("m", 0, 6).value(), matrix, "all rows");
  EXPECT_EQ(file->GetSlice("m", 3, 3)->sizes(), (std::vector<int64_t>{0, 2, 2}));

  for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 7}, {4, 3}, {-1, 2}}) {
    absl::StatusOr<at::Tensor> bad = file->GetSlice("m", begin, end);
    EXPECT_EQ(bad.status().code(), absl::StatusCode::kOutOfRange);
    EXPECT_THAT(bad.status().message(),
                AllOf(HasSubstr("'m'"), HasSubstr(absl::StrCat("rows [", begin, ", ", end, ")")),
                      HasSubstr("expected 0 <= begin <= end <= 6")));
  }
  EXPECT_THAT(file->GetSlice("s", 0, 1).status().message(), HasSubstr("0-d"));
  EXPECT_EQ(file->Get("missing").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file->Get("missing").status().message(), HasSubstr("no tensor 'missing'"));
}

// ---------------------------------------------------------------------------------------------
// The streaming writer and atomic replacement

TEST(SafetensorsWriterTest, AppendsInAnyOrder) {
  const std::string dir = FreshTestDir();
  const std::string path = dir + "/stream.safetensors";
  const at::Tensor a = at::arange(6, at::kFloat).reshape({2, 3});
  const at::Tensor b = at::arange(4, at::kLong);
  auto writer = SafetensorsWriter::Create(path, {{"a", at::kFloat, {2, 3}}, {"b", at::kLong, {4}}},
                                          {{"format", "pt"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("b", b).ok());
  ASSERT_TRUE((*writer)->Append("a", a).ok());
  EXPECT_FALSE(std::filesystem::exists(path));  // nothing at `path` before Finish
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_THAT(ListDir(dir), ElementsAre("stream.safetensors"));
  auto file = OpenOrDie(path);
  ASSERT_NE(file, nullptr);
  ExpectSameTensor(file->Get("a").value(), a, "a");
  ExpectSameTensor(file->Get("b").value(), b, "b");
}

TEST(SafetensorsWriterTest, RejectsMisuseNamingTheTensor) {
  const std::string dir = FreshTestDir();
  const std::string path = dir + "/misuse.safetensors";
  auto writer = SafetensorsWriter::Create(path, {{"a", at::kFloat, {2}}, {"b", at::kFloat, {1}}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  SafetensorsWriter& w = **writer;
  EXPECT_THAT(w.Append("c", at::ones({2})).message(), HasSubstr("'c': no entry of that name"));
  EXPECT_THAT(w.Append("a", at::ones({2}, at::kDouble)).message(),
              AllOf(HasSubstr("'a'"), HasSubstr("got dtype Double shape [2]"),
                    HasSubstr("declared dtype Float shape [2]")));
  EXPECT_THAT(w.Append("a", at::ones({3})).message(), HasSubstr("shape [3]"));
  ASSERT_TRUE(w.Append("a", at::ones({2})).ok());
  EXPECT_THAT(w.Append("a", at::ones({2})).message(), HasSubstr("'a': already appended"));
  EXPECT_THAT(w.Finish().message(), HasSubstr("'b' was declared but never appended"));
  writer->reset();
  EXPECT_TRUE(ListDir(dir).empty());  // the temporary file is gone, nothing at `path`

  for (const auto& [entry, expected] :
       std::vector<std::pair<SafetensorsWriter::Entry, std::string>>{
           {{"c", at::kComplexFloat, {1}}, "dtype ComplexFloat is not supported"},
           {{"n", at::kFloat, {2, -1}}, "shape [2, -1] has a negative size"},
           {{"__metadata__", at::kFloat, {1}}, "reserved"}}) {
    EXPECT_THAT(SafetensorsWriter::Create(path, {entry}).status().message(),
                AllOf(HasSubstr(absl::StrCat("'", entry.name, "'")), HasSubstr(expected)));
  }
  EXPECT_THAT(
      WriteSafetensors(dir + "/no/such/dir/x.safetensors", {{"a", at::ones({1})}}).message(),
      HasSubstr("cannot create"));
}

TEST(SafetensorsWriterTest, FailedWriteLeavesTheOldFileIntact) {
  const std::string dir = FreshTestDir();
  const std::string path = dir + "/model.safetensors";
  ASSERT_TRUE(WriteSafetensors(path, {{"old", at::ones({3})}}).ok());
  const std::string old_bytes = ReadBytes(path);

  absl::Status duplicate =
      WriteSafetensors(path, {{"w", at::zeros({2})}, {"x", at::zeros({1})}, {"w", at::zeros({2})}});
  EXPECT_THAT(duplicate.message(), AllOf(HasSubstr("'w'"), HasSubstr("appears twice")));
  EXPECT_EQ(ReadBytes(path), old_bytes);

  // Midway: one tensor written, the next one fails, the writer is dropped.
  {
    auto writer = SafetensorsWriter::Create(path, {{"a", at::kFloat, {2}}, {"b", at::kFloat, {2}}});
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append("a", at::zeros({2})).ok());
    ASSERT_FALSE((*writer)->Append("b", at::zeros({2}, at::kInt)).ok());
  }
  EXPECT_EQ(ReadBytes(path), old_bytes);
  EXPECT_THAT(ListDir(dir), ElementsAre("model.safetensors"));

  ASSERT_TRUE(WriteSafetensors(path, {{"new", at::zeros({1})}}).ok());
  EXPECT_THAT(OpenOrDie(path)->names(), ElementsAre("new"));
  EXPECT_THAT(ListDir(dir), ElementsAre("model.safetensors"));
}

// ---------------------------------------------------------------------------------------------
// Validation of hand-built corrupt files

TEST(SafetensorsValidationTest, FileShorterThanTheHeaderLength) {
  const std::string path = FreshTestDir() + "/short.safetensors";
  std::ofstream(path, std::ios::binary) << "abcd";
  EXPECT_THAT(OpenError(path),
              HasSubstr("the file is 4 bytes, shorter than the 8-byte header length"));
}

TEST(SafetensorsValidationTest, HeaderLengthOverTheLimit) {
  EXPECT_THAT(OpenError(WriteRaw(FreshTestDir() + "/long.safetensors", "{}", "", 100'000'001)),
              HasSubstr("header length is 100000001 bytes, over the limit of 100000000"));
}

TEST(SafetensorsValidationTest, HeaderRunsPastTheFile) {
  EXPECT_THAT(OpenError(WriteRaw(FreshTestDir() + "/trunc.safetensors", "{}", "", 1000)),
              HasSubstr("header length is 1000 bytes, but only 2 bytes follow it"));
}

TEST(SafetensorsValidationTest, HeaderNotAJsonObject) {
  EXPECT_THAT(HeaderError("[]", 0), HasSubstr("does not start with '{'"));
}

TEST(SafetensorsValidationTest, BadJson) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"a\":",
       "invalid JSON at byte 5: expected an object, array, string or integer, found the end"},
      {"{\"a\": true}", "true, false and null are not supported"},
      {"{\"a\": 1.5}",
       "byte 7: expected an integer (fractions and exponents are not supported), found '.'"},
      {"{\"a\": 1e3}", "fractions and exponents are not supported"},
      {"{\"a\": 01}", "without leading zeros"},
      {"{\"a\": 99999999999999999999}", "an integer that fits in 64 bits"},
      {"{\"a\": 1,}", "expected a string key, found '}'"},
      {"{\"a\": 1, \"a\": 2}", "duplicate key \"a\""},
      {"{\"a\" 1}", "expected ':' after an object key"},
      {"{\"a\": [1 2]}", "expected ',' or ']' in an array"},
      {"{\"a\": 1 \"b\": 2}", "expected ',' or '}' in an object"},
      {"{\"a\": \"x\\q\"}", "expected an escape"},
      {"{\"a\": \"\\u12G4\"}", "expected 4 hex digits after \\u"},
      {"{\"a\": \"\\udc00\"}", "without a high surrogate"},
      {"{\"a\": \"\\ud800x\"}", "expected a \\u low surrogate"},
      {"{\"a\": \"line\nbreak\"}", "control characters must be escaped"},
      {"{\"a\": \"\xFF\"}", "expected valid UTF-8, found byte 0xFF"},
      {"{\"a\": \"open}", "expected '\"' to close the string"},
      {"{} x", "expected the end of the JSON text, found 'x'"},
      {"{\"a\":" + std::string(70, '[') + std::string(70, ']') + "}", "nesting deeper than 64"},
  };
  for (const auto& [header, expected] : cases) {
    EXPECT_THAT(HeaderError(header, 0), HasSubstr(expected)) << header;
  }
}

TEST(SafetensorsValidationTest, DecodesUnicodeEscapes) {
  auto file = OpenOrDie(
      WriteRaw(FreshTestDir() + "/unicode.safetensors",
               R"({"\u00fc\ud83d\ude00\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", "x"));
  ASSERT_NE(file, nullptr);
  EXPECT_THAT(file->names(), ElementsAre("\xC3\xBC\xF0\x9F\x98\x80\n"));
}

// Files from other writers may leave a tensor unaligned (an unpadded header): Get copies it.
TEST(SafetensorsValidationTest, MisalignedTensorComesBackAsACopy) {
  const float values[2] = {1.5f, -2.0f};
  const std::string header = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} )";
  ASSERT_NE((8 + header.size()) % 4, 0u);  // the data starts unaligned
  auto file = OpenOrDie(WriteRaw(FreshTestDir() + "/misaligned.safetensors", header,
                                 std::string(reinterpret_cast<const char*>(values), 8)));
  ASSERT_NE(file, nullptr);
  const at::Tensor w = file->Get("w").value();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(w.data_ptr()) % 4, 0u);
  ExpectSameTensor(w, at::tensor({1.5f, -2.0f}), "w");
  ExpectSameTensor(file->GetSlice("w", 1, 2).value(), at::tensor({-2.0f}), "w row 1");
}

TEST(SafetensorsValidationTest, OffsetsOutsideTheData) {
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("field \"data_offsets\" is [0, 16]"),
                    HasSubstr("expected end <= 8")));
}

TEST(SafetensorsValidationTest, OverlappingTensors) {
  EXPECT_THAT(HeaderError(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                          12),
              AllOf(HasSubstr("tensor 'b' has data_offsets [4, 12]"),
                    HasSubstr("previous tensor 'a' ends at 8"), HasSubstr("overlap")));
}

TEST(SafetensorsValidationTest, GapBetweenTensors) {
  EXPECT_THAT(HeaderError(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                          12),
              AllOf(HasSubstr("tensor 'b' has data_offsets [8, 12]"),
                    HasSubstr("bytes [4, 8) belong to no tensor")));
  EXPECT_THAT(
      HeaderError(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
      AllOf(HasSubstr("the data starts at 0"), HasSubstr("bytes [0, 4) belong to no tensor")));
  EXPECT_THAT(
      HeaderError(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
      HasSubstr("the tensors end at data offset 4, but the data after the header is 8 bytes"));
}

TEST(SafetensorsValidationTest, LengthDoesNotMatchTheShape) {
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("[0, 8] (8 bytes)"),
                    HasSubstr("shape [3] of F32 (4 bytes each) needs 12 bytes")));
}

TEST(SafetensorsValidationTest, UnknownDtype) {
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", 1),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("field \"dtype\" is \"F8_E4M3\""),
                    HasSubstr("not supported; expected one of F64, F32, F16, BF16")));
}

TEST(SafetensorsValidationTest, MissingOrMistypedFields) {
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("tensor 'w'"), HasSubstr("missing field \"shape\"")));
  EXPECT_THAT(HeaderError(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", 4),
              HasSubstr("missing field \"dtype\""));
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","shape":[1]}})", 4),
              HasSubstr("missing field \"data_offsets\""));
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4),
              HasSubstr("field \"shape\" is \"1\", expected an array of non-negative integers"));
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
              HasSubstr("field \"shape\" is [-1]"));
  EXPECT_THAT(
      HeaderError(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4),
      HasSubstr("field \"data_offsets\" is [4, 0], expected [begin, end] with 0 <= begin <= end"));
  EXPECT_THAT(HeaderError(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", 4),
              HasSubstr("field \"data_offsets\" is [0, 4, 8]"));
  EXPECT_THAT(HeaderError(R"({"w":[1]})", 0),
              AllOf(HasSubstr("tensor 'w': the entry is [1], expected an object")));
}

TEST(SafetensorsValidationTest, MetadataMustMapStringsToStrings) {
  EXPECT_THAT(HeaderError(R"({"__metadata__":{"format":"pt","step":7}})", 0),
              HasSubstr("\"__metadata__\" key \"step\" is 7, expected a string"));
  EXPECT_THAT(HeaderError(R"({"__metadata__":["pt"]})", 0),
              HasSubstr("\"__metadata__\" is [\"pt\"], expected an object of strings"));
}

// ---------------------------------------------------------------------------------------------
// Model directories

TEST(SafetensorsModelDirTest, ReadsShardsThroughTheIndex) {
  const std::string dir = FreshTestDir();
  const at::Tensor a = at::arange(8, at::kFloat).reshape({4, 2});
  const at::Tensor b = at::arange(3, at::kBFloat16);
  const at::Tensor c = at::arange(6, at::kLong).reshape({3, 2});
  ASSERT_TRUE(
      WriteSafetensors(dir + "/model-00001-of-00002.safetensors", {{"a", a}, {"b", b}}).ok());
  ASSERT_TRUE(WriteSafetensors(dir + "/model-00002-of-00002.safetensors", {{"c", c}}).ok());
  ASSERT_TRUE(WriteSafetensorsIndex(dir,
                                    {{"c", "model-00002-of-00002.safetensors"},
                                     {"a", "model-00001-of-00002.safetensors"},
                                     {"b", "model-00001-of-00002.safetensors"}},
                                    86)
                  .ok());
  // json.dumps(index, indent=2, sort_keys=True) + "\n", as Hugging Face writes it.
  EXPECT_EQ(ReadBytes(dir + "/model.safetensors.index.json"),
            "{\n"
            "  \"metadata\": {\n"
            "    \"total_size\": 86\n"
            "  },\n"
            "  \"weight_map\": {\n"
            "    \"a\": \"model-00001-of-00002.safetensors\",\n"
            "    \"b\": \"model-00001-of-00002.safetensors\",\n"
            "    \"c\": \"model-00002-of-00002.safetensors\"\n"
            "  }\n"
            "}\n");

  absl::StatusOr<std::unique_ptr<SafetensorsModelDir>> model = SafetensorsModelDir::Open(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->names(), ElementsAre("a", "b", "c"));
  EXPECT_TRUE((*model)->Has("c"));
  EXPECT_FALSE((*model)->Has("d"));
  ExpectSameTensor((*model)->Get("a").value(), a, "a");
  ExpectSameTensor((*model)->GetCopy("b").value(), b, "b");
  ExpectSameTensor((*model)->GetSlice("c", 1, 3).value(), c.slice(0, 1, 3), "c rows 1..3");
  EXPECT_EQ((*model)->Info("c")->dtype, at::kLong);
  EXPECT_THAT((*model)->FileOf("c").value()->path(), HasSubstr("model-00002-of-00002"));
  EXPECT_THAT((*model)->Get("d").status().message(), HasSubstr("no tensor 'd'"));
}

TEST(SafetensorsModelDirTest, ReadsASingleFile) {
  const std::string dir = FreshTestDir();
  ASSERT_TRUE(WriteSafetensors(dir + "/model.safetensors", {{"w", at::ones({2})}}).ok());
  absl::StatusOr<std::unique_ptr<SafetensorsModelDir>> model = SafetensorsModelDir::Open(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_THAT((*model)->names(), ElementsAre("w"));
  ExpectSameTensor((*model)->Get("w").value(), at::ones({2}), "w");
}

TEST(SafetensorsModelDirTest, RejectsInconsistentDirectories) {
  const std::string dir = FreshTestDir();
  EXPECT_THAT(SafetensorsModelDir::Open(dir).status().message(),
              AllOf(HasSubstr("neither model.safetensors.index.json nor model.safetensors")));
  ASSERT_TRUE(
      WriteSafetensors(dir + "/s1.safetensors", {{"a", at::ones({1})}, {"b", at::ones({1})}}).ok());
  auto open_error = [&](const std::map<std::string, std::string>& weight_map) {
    EXPECT_TRUE(WriteSafetensorsIndex(dir, weight_map, 8).ok());
    return std::string(SafetensorsModelDir::Open(dir).status().message());
  };
  EXPECT_THAT(
      open_error({{"a", "s1.safetensors"}, {"b", "s1.safetensors"}, {"c", "s1.safetensors"}}),
      HasSubstr("maps tensor 'c' to 's1.safetensors', which does not hold it"));
  EXPECT_THAT(
      open_error({{"a", "s1.safetensors"}}),
      HasSubstr("shard 's1.safetensors' holds tensor 'b', which the weight_map does not map"));
  EXPECT_THAT(open_error({{"a", "../s1.safetensors"}}), HasSubstr("expected a file name"));
  EXPECT_THAT(open_error({{"a", "s2.safetensors"}}),
              HasSubstr("shard for tensor 'a': '" + dir + "/s2.safetensors' does not exist"));
  EXPECT_THAT(WriteSafetensorsIndex(dir, {}, -1).message(), HasSubstr("total_size is -1"));
}

}  // namespace
}  // namespace cpptrain

namespace cpptrain {
namespace {

// Mutation fuzzing of the reader: thousands of copies of the golden file with random bytes of
// the length prefix and header overwritten, or the file cut short, must each either open and
// read every tensor within the file's bytes, or fail with an error; never crash, hang or read
// outside the mapping (run under the sanitizers of a debug build to see the last one).
TEST(SafetensorsFuzzTest, MutatedFilesOpenOrFailCleanly) {
  const std::string golden = ReadBytes(TestdataPath("golden.safetensors"));
  uint64_t header_length = 0;
  std::memcpy(&header_length, golden.data(), 8);
  const size_t header_end = 8 + static_cast<size_t>(header_length);
  ASSERT_LT(header_end, golden.size());
  const std::string path = FreshTestDir() + "/mutated.safetensors";
  std::mt19937_64 rng(20261129);
  const std::string alphabet =
      "{}[]\":,0123456789-eE.ABFIUXabcdefghijklmnopqrstuvwxyz_ \\u\x01\xff";
  int opened = 0, rejected = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string bytes = golden;
    if (round % 10 == 9) {
      bytes.resize(rng() % golden.size());
    } else {
      const int edits = 1 + static_cast<int>(rng() % 4);
      for (int e = 0; e < edits; ++e) {
        const size_t at = rng() % header_end;
        bytes[at] = at < 8 ? static_cast<char>(rng() & 0xff) : alphabet[rng() % alphabet.size()];
      }
    }
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    }
    auto file = SafetensorsFile::Open(path);
    if (!file.ok()) {
      ++rejected;
      EXPECT_FALSE(file.status().message().empty());
      continue;
    }
    ++opened;
    uint64_t mutated_length = 0;
    std::memcpy(&mutated_length, bytes.data(), 8);
    for (const std::string& name : (*file)->names()) {
      auto info = (*file)->Info(name);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_LE(8 + mutated_length + static_cast<uint64_t>(info->end), bytes.size()) << name;
      auto tensor = (*file)->GetCopy(name);
      if (tensor.ok()) {
        EXPECT_EQ(tensor->numel() * tensor->element_size(), info->end - info->begin);
      }
    }
  }
  EXPECT_GT(rejected, 1000);
  EXPECT_GT(opened, 0);  // some edits land in padding or values that stay valid
  std::cout << "mutated files: " << opened << " opened, " << rejected << " rejected\n";
}

}  // namespace
}  // namespace cpptrain
