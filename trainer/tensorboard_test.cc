// TensorBoard tags as Hugging Face names them, and the TFRecord framing of an event file (the
// values themselves are read back by TensorBoard's own loader in //tools:tensorboard_test).
#include "trainer/tensorboard.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include <gtest/gtest.h>

#include "checkpoint/crc32c.h"

namespace cpptrain {
namespace {

TEST(TensorBoardTest, TagsFollowHuggingFace) {
  EXPECT_EQ(TensorBoardTag("loss"), "train/loss");
  EXPECT_EQ(TensorBoardTag("learning_rate"), "train/learning_rate");
  EXPECT_EQ(TensorBoardTag("eval_loss"), "eval/loss");
  EXPECT_EQ(TensorBoardTag("eval_accuracy"), "eval/accuracy");
  EXPECT_EQ(TensorBoardTag("test_loss"), "test/loss");
  EXPECT_EQ(TensorBoardTag("train_runtime"), "train/train_runtime");
}

uint32_t Unmask(uint32_t masked) {
  const uint32_t rotated = masked - 0xa282ead8u;
  return (rotated >> 17) | (rotated << 15);
}

TEST(TensorBoardTest, RecordsCarryTheirLengthAndMaskedChecksums) {
  const std::string record = TfRecord("hello");
  ASSERT_EQ(record.size(), 8u + 4u + 5u + 4u);
  uint64_t length;
  uint32_t length_crc, data_crc;
  std::memcpy(&length, record.data(), 8);
  std::memcpy(&length_crc, record.data() + 8, 4);
  std::memcpy(&data_crc, record.data() + 17, 4);
  EXPECT_EQ(length, 5u);
  EXPECT_EQ(Unmask(length_crc), Crc32c(record.data(), 8));
  EXPECT_EQ(record.substr(12, 5), "hello");
  EXPECT_EQ(Unmask(data_crc), Crc32c("hello"));
}

TEST(TensorBoardTest, AFileStartsWithTheVersionRecord) {
  auto writer = TensorBoardWriter::Open(::testing::TempDir() + "/tb");
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->AddScalar("train/loss", 0.0f, 3).ok());
  ASSERT_TRUE((*writer)->Flush().ok());
  std::ifstream in((*writer)->path(), std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  EXPECT_NE(bytes.find("brain.Event:2"), std::string::npos);
  EXPECT_NE(bytes.find("train/loss"), std::string::npos);
}

}  // namespace
}  // namespace cpptrain
