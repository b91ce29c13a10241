#include "trainer/data/collator.h"

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace cpptrain {
namespace {

using ::testing::HasSubstr;

at::Tensor Longs(std::vector<int64_t> values) {
  return at::tensor(at::ArrayRef<int64_t>(values), at::kLong);
}

at::Tensor Rows(std::vector<std::vector<int64_t>> rows) {
  std::vector<at::Tensor> tensors;
  for (auto& row : rows) tensors.push_back(Longs(row));
  return at::stack(tensors);
}

TEST(CollatorTest, RightPadsTokensAndIgnoresPaddingInLabels) {
  Collator collator(/*pad_token_id=*/7);
  absl::StatusOr<Batch> batch = collator.Collate(
      {Example{Longs({1, 2, 3}), {}}, Example{Longs({4, 5}), {}}, Example{Longs({6}), {}}});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_TRUE(at::equal(batch->inputs, Rows({{1, 2, 3}, {4, 5, 7}, {6, 7, 7}})));
  EXPECT_TRUE(at::equal(batch->labels, Rows({{1, 2, 3}, {4, 5, -100}, {6, -100, -100}})));
  EXPECT_TRUE(at::equal(batch->attention_mask, Rows({{1, 1, 1}, {1, 1, 0}, {1, 0, 0}})));
  EXPECT_EQ(batch->size(), 3);
}

TEST(CollatorTest, UsesGivenLabelsAndKeepsRealPadTokens) {
  Collator collator(/*pad_token_id=*/0);
  absl::StatusOr<Batch> batch =
      collator.Collate({Example{Longs({0, 9}), Longs({kIgnoreIndex, 9})}, Example{Longs({0}), {}},
                        Example{at::tensor({3, 4, 5}, at::kInt), {}}});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->inputs.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(batch->inputs, Rows({{0, 9, 0}, {0, 0, 0}, {3, 4, 5}})));
  // Row 1's real token 0 keeps its label; only the padding after it is ignored.
  EXPECT_TRUE(at::equal(batch->labels, Rows({{-100, 9, -100}, {0, -100, -100}, {3, 4, 5}})));
  EXPECT_TRUE(at::equal(batch->attention_mask, Rows({{1, 1, 0}, {1, 0, 0}, {1, 1, 1}})));
}

TEST(CollatorTest, StacksFeatureExamples) {
  Collator collator;
  absl::StatusOr<Batch> batch =
      collator.Collate({Example{at::full({3}, 1.5), at::scalar_tensor(2, at::kLong)},
                        Example{at::full({3}, -1.0), at::scalar_tensor(0, at::kInt)}});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->inputs.sizes(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(batch->inputs.scalar_type(), at::kFloat);
  EXPECT_FLOAT_EQ(batch->inputs[0][2].item<float>(), 1.5f);
  EXPECT_FLOAT_EQ(batch->inputs[1][0].item<float>(), -1.0f);
  EXPECT_TRUE(at::equal(batch->labels, Longs({2, 0})));
  EXPECT_FALSE(batch->attention_mask.defined());
}

TEST(CollatorTest, RejectsMalformedBatches) {
  Collator collator;
  auto error_of = [&](std::vector<Example> examples) {
    absl::StatusOr<Batch> batch = collator.Collate(examples);
    return batch.ok() ? std::string("ok") : std::string(batch.status().message());
  };
  EXPECT_THAT(error_of({}), HasSubstr("empty list"));
  EXPECT_THAT(error_of({Example{Longs({1}), {}}, Example{}}), HasSubstr("undefined inputs"));
  EXPECT_THAT(
      error_of({Example{Longs({1}), {}}, Example{at::ones({1}), at::scalar_tensor(0, at::kLong)}}),
      HasSubstr("all token examples or all feature examples"));
  EXPECT_THAT(error_of({Example{Longs({1, 2}), Longs({1})}}), HasSubstr("2 inputs but"));
  EXPECT_THAT(error_of({Example{at::ones({2}), at::scalar_tensor(0, at::kLong)},
                        Example{at::ones({3}), at::scalar_tensor(0, at::kLong)}}),
              HasSubstr("same size and dtype"));
  EXPECT_THAT(error_of({Example{at::ones({2}), {}}}), HasSubstr("no label"));
  EXPECT_THAT(error_of({Example{at::ones({2, 2}, at::kLong), {}}}), HasSubstr("[2, 2]"));
}

}  // namespace
}  // namespace cpptrain
