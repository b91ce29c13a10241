#include "trainer/data/in_memory_dataset.h"

#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cpptrain {
namespace {

using ::testing::HasSubstr;

TEST(InMemoryDatasetTest, HoldsVariableLengthSequences) {
  absl::StatusOr<std::shared_ptr<InMemoryDataset>> ds =
      InMemoryDataset::FromTokenSequences({{1, 2, 3}, {4}, {5, 6}});
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 3);
  Example e = (*ds)->Get(1);
  ASSERT_TRUE(e.inputs.defined());
  EXPECT_EQ(e.inputs.scalar_type(), at::kLong);
  EXPECT_EQ(e.inputs.numel(), 1);
  EXPECT_EQ(e.inputs[0].item<int64_t>(), 4);
  EXPECT_TRUE(at::equal((*ds)->Get(2).inputs, at::tensor({5, 6}, at::kLong)));
  EXPECT_FALSE((*ds)->Get(3).inputs.defined());
  EXPECT_FALSE((*ds)->Get(-1).inputs.defined());
}

TEST(InMemoryDatasetTest, AcceptsFeatureExamples) {
  Example e{at::ones({4}), at::scalar_tensor(2, at::kLong)};
  absl::StatusOr<std::shared_ptr<InMemoryDataset>> ds = InMemoryDataset::Create({e, e});
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ((*ds)->size(), 2);
}

TEST(InMemoryDatasetTest, RejectsMalformedExamples) {
  auto error_of = [](std::vector<Example> examples) {
    absl::StatusOr<std::shared_ptr<InMemoryDataset>> ds =
        InMemoryDataset::Create(std::move(examples));
    return ds.ok() ? std::string("ok") : std::string(ds.status().message());
  };
  EXPECT_THAT(error_of({Example{}}), HasSubstr("undefined inputs"));
  EXPECT_THAT(error_of({Example{at::ones({2, 2}, at::kLong), {}}}), HasSubstr("2-D inputs"));
  EXPECT_THAT(error_of({Example{at::ones({3}, at::kLong), at::ones({2}, at::kLong)}}),
              HasSubstr("3 inputs but labels of shape [2]"));
  EXPECT_THAT(error_of({Example{at::ones({3}), {}}}), HasSubstr("has no label"));
  EXPECT_THAT(error_of({Example{at::ones({3}), at::ones({1}, at::kLong)}}),
              HasSubstr("0-dim class index"));
  EXPECT_THAT(error_of({Example{at::ones({3}), at::scalar_tensor(1.0)}}),
              HasSubstr("labels must be integer"));
  EXPECT_FALSE(InMemoryDataset::FromTokenSequences({{1}, {}}).ok());
}

}  // namespace
}  // namespace cpptrain
