#include "trainer/data/arithmetic_corpus.h"

#include <regex>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_split.h"

namespace cpptrain {
namespace {

using ::testing::HasSubstr;

std::string DecodeAll(const InMemoryDataset& ds) {
  std::string text;
  for (int64_t i = 0; i < ds.size(); ++i) text += DecodeArithmetic(ds.Get(i).inputs);
  return text;
}

TEST(ArithmeticCorpusTest, VocabularyIsSmall) {
  EXPECT_EQ(ArithmeticVocabSize(), 14);
  EXPECT_LE(ArithmeticVocabSize(), 32);
  absl::StatusOr<std::vector<int64_t>> ids = EncodeArithmetic("09+=\n");
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(*ids, (std::vector<int64_t>{1, 10, 11, 12, 13}));
  EXPECT_EQ(DecodeArithmetic(std::vector<int64_t>{0, 2, 11, 3, 12, 4, 13, 0, 99}), "1+2=3\n?");
}

TEST(ArithmeticCorpusTest, FixedLengthSamplesOfValidTokens) {
  absl::StatusOr<std::shared_ptr<InMemoryDataset>> ds = MakeArithmeticDataset(50, 17, 3);
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 50);
  for (int64_t i = 0; i < 50; ++i) {
    const at::Tensor inputs = (*ds)->Get(i).inputs;
    ASSERT_EQ(inputs.dim(), 1);
    ASSERT_EQ(inputs.size(0), 17);
    EXPECT_EQ(inputs.scalar_type(), at::kLong);
    EXPECT_GE(inputs.min().item<int64_t>(), 1);
    EXPECT_LT(inputs.max().item<int64_t>(), ArithmeticVocabSize());
  }
}

TEST(ArithmeticCorpusTest, LinesAreCorrectSums) {
  absl::StatusOr<std::shared_ptr<InMemoryDataset>> ds = MakeArithmeticDataset(64, 32, 7);
  ASSERT_TRUE(ds.ok()) << ds.status();
  const std::string text = DecodeAll(**ds);
  ASSERT_EQ(text.size(), 64u * 32u);
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  lines.pop_back();  // The stream is cut mid-line at the end.
  ASSERT_GT(lines.size(), 100u);
  const std::regex line_re("([0-9]{1,2})\\+([0-9]{1,2})=([0-9]{1,3})");
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_match(line, m, line_re)) << "line \"" << line << "\"";
    EXPECT_EQ(std::stoi(m[1]) + std::stoi(m[2]), std::stoi(m[3])) << line;
  }
}

TEST(ArithmeticCorpusTest, DeterministicPerSeed) {
  auto a = MakeArithmeticDataset(20, 16, 42);
  auto b = MakeArithmeticDataset(20, 16, 42);
  auto c = MakeArithmeticDataset(20, 16, 43);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(DecodeAll(**a), DecodeAll(**b));
  EXPECT_NE(DecodeAll(**a), DecodeAll(**c));
  // Windows are consecutive: fewer samples give a prefix of the same stream.
  auto prefix = MakeArithmeticDataset(5, 16, 42);
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(DecodeAll(**prefix), DecodeAll(**a).substr(0, 80));
}

TEST(ArithmeticCorpusTest, RejectsBadSizesAndCharacters) {
  absl::StatusOr<std::shared_ptr<InMemoryDataset>> ds = MakeArithmeticDataset(0, 16, 1);
  ASSERT_FALSE(ds.ok());
  EXPECT_THAT(std::string(ds.status().message()), HasSubstr("num_samples 0"));
  EXPECT_FALSE(MakeArithmeticDataset(4, -1, 1).ok());
  EXPECT_FALSE(MakeArithmeticDataset(int64_t{1} << 40, 1024, 1).ok());
  absl::StatusOr<std::vector<int64_t>> ids = EncodeArithmetic("1+x");
  ASSERT_FALSE(ids.ok());
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("'x'"));
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("position 2"));
}

}  // namespace
}  // namespace cpptrain
