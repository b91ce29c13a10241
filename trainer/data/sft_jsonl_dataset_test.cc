#include "trainer/data/sft_jsonl_dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "module/batch.h"
#include "trainer/data/collator.h"

namespace cpptrain {
namespace {

using ::testing::HasSubstr;
constexpr int64_t kI = kIgnoreIndex;

std::string WriteFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::vector<int64_t> Values(const torch::Tensor& t) {
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

const char kPromptCompletion[] =
    "{\"input_ids\": [1, 2, 3, 4], \"completion_mask\": [0, 0, 1, 1]}\n"
    "\n"
    "{\"input_ids\": [5, 6], \"completion_mask\": [0, 1]}\n"
    "{\"input_ids\": [7, 8, 9], \"completion_mask\": [0, 1, 1], \"seq_lengths\": [3]}\n";

TEST(SftJsonlDatasetTest, CompletionOnlyLossByDefaultWhenRecordsCarryTheMask) {
  const std::string path = WriteFile("pc.jsonl", kPromptCompletion);
  auto ds = SftJsonlDataset::Open(path, {});
  ASSERT_TRUE(ds.ok()) << ds.status();
  ASSERT_EQ((*ds)->size(), 3);
  EXPECT_EQ((*ds)->num_records(), 3);
  Example e = (*ds)->Get(0);
  EXPECT_EQ(Values(e.inputs), std::vector<int64_t>({1, 2, 3, 4}));
  EXPECT_EQ(Values(e.labels), std::vector<int64_t>({kI, kI, 3, 4}));
  EXPECT_FALSE(e.position_ids.defined());
  SftDataOptions all_tokens;
  all_tokens.completion_only_loss = false;
  auto full = SftJsonlDataset::Open(path, all_tokens);
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(Values((*full)->Get(0).labels), std::vector<int64_t>({1, 2, 3, 4}));
}

TEST(SftJsonlDatasetTest, TruncatesAndDropsExamplesLeftWithoutLabels) {
  SftDataOptions options;
  options.max_length = 2;
  auto ds = SftJsonlDataset::Open(WriteFile("trunc.jsonl", kPromptCompletion), options);
  ASSERT_TRUE(ds.ok()) << ds.status();
  // [1, 2] has no completion token left: dropped (as TRL drops it).
  ASSERT_EQ((*ds)->size(), 2);
  EXPECT_EQ(Values((*ds)->Get(0).labels), std::vector<int64_t>({kI, 6}));
  EXPECT_EQ(Values((*ds)->Get(1).inputs), std::vector<int64_t>({7, 8}));
}

TEST(SftJsonlDatasetTest, PacksBestFitDecreasingWithPositionsPerExample) {
  SftDataOptions options;
  options.max_length = 5;
  options.packing = true;
  auto ds = SftJsonlDataset::Open(WriteFile("pack.jsonl", kPromptCompletion), options);
  ASSERT_TRUE(ds.ok()) << ds.status();
  // Lengths 4, 2, 3: 4 opens row 0 (1 free), 3 opens row 1 (2 free), 2 fits row 1 exactly.
  ASSERT_EQ((*ds)->size(), 2);
  Example row1 = (*ds)->Get(1);
  EXPECT_EQ(Values(row1.inputs), std::vector<int64_t>({7, 8, 9, 5, 6}));
  EXPECT_EQ(Values(row1.labels), std::vector<int64_t>({kI, 8, 9, kI, 6}));
  EXPECT_EQ(Values(row1.position_ids), std::vector<int64_t>({0, 1, 2, 0, 1}));

  // Padding-free: the micro-batch in one row, the first label of each example ignored.
  Collator collator(/*pad_token_id=*/0);
  auto batch = collator.CollatePaddingFree({(*ds)->Get(0), row1});
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->inputs.sizes(), torch::IntArrayRef({1, 9}));
  EXPECT_EQ(Values(batch->position_ids), std::vector<int64_t>({0, 1, 2, 3, 0, 1, 2, 0, 1}));
  EXPECT_EQ(Values(batch->labels), std::vector<int64_t>({kI, kI, 3, 4, kI, 8, 9, kI, 6}));
  // Padded rows keep position_ids (0 on padding).
  auto padded = collator.Collate({(*ds)->Get(0), row1});
  ASSERT_TRUE(padded.ok()) << padded.status();
  EXPECT_EQ(Values(padded->position_ids), std::vector<int64_t>({0, 1, 2, 3, 0, 0, 1, 2, 0, 1}));
}

TEST(SftJsonlDatasetTest, AssistantOnlyLossAppliesAssistantMasks) {
  const std::string path = WriteFile(
      "chat.jsonl", "{\"input_ids\": [1, 2, 3, 4], \"assistant_masks\": [0, 1, 1, 0]}\n");
  SftDataOptions options;
  options.assistant_only_loss = true;
  auto ds = SftJsonlDataset::Open(path, options);
  ASSERT_TRUE(ds.ok()) << ds.status();
  EXPECT_EQ(Values((*ds)->Get(0).labels), std::vector<int64_t>({kI, 2, 3, kI}));
  EXPECT_THAT((*ds)->CheckTokensBelow(4).ToString(),
              HasSubstr("token id 4 is >= the model's vocab_size 4"));
  EXPECT_TRUE((*ds)->CheckTokensBelow(5).ok());
}

TEST(SftJsonlDatasetTest, ErrorsNameTheLineTheFieldAndTheFix) {
  struct Case {
    std::string text;
    SftDataOptions options;
    std::string expected;
  };
  SftDataOptions assistant;
  assistant.assistant_only_loss = true;
  SftDataOptions completion;
  completion.completion_only_loss = true;
  SftDataOptions model_dir;
  model_dir.model_dir = "/models/qwen";
  const std::vector<Case> cases = {
      {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}\n", model_dir,
       "python3 tools/sft_tokenize.py --model /models/qwen --input "},
      {"{\"prompt\": \"a\", \"completion\": \"b\"}\n", {}, "a text record (\"prompt\")"},
      {"{\"text\": \"a\"}\n", {}, "--model MODEL_DIR"},
      {"{\"ids\": [1]}\n", {}, "has no \"input_ids\" (its keys: ids)"},
      {"[1, 2]\n", {}, ":1: not a JSON object"},
      {"{\"input_ids\": [1, -2]}\n", {}, "\"input_ids\"[1] is -2"},
      {"{\"input_ids\": []}\n", {}, "\"input_ids\" is empty"},
      {"{\"input_ids\": [1, 2], \"completion_mask\": [1]}\n", {},
       "\"completion_mask\" has 1 flags but \"input_ids\" has 2 tokens"},
      {"{\"input_ids\": [1, 2], \"completion_mask\": [0, 2]}\n", {}, "must be 0 or 1"},
      {"\n{\"input_ids\": [1, 2]}\n", assistant, ":2: data.assistant_only_loss is on"},
      {"{\"input_ids\": [1, 2], \"assistant_masks\": [0, 0]}\n", assistant, "no assistant token"},
      {"{\"input_ids\": [1, 2]}\n", completion, "no \"completion_mask\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto ds = SftJsonlDataset::Open(WriteFile("bad.jsonl", cases[i].text), cases[i].options);
    ASSERT_FALSE(ds.ok()) << i;
    EXPECT_THAT(ds.status().ToString(), HasSubstr(cases[i].expected)) << i;
    EXPECT_THAT(ds.status().ToString(), HasSubstr("bad.jsonl")) << i;
  }
}

}  // namespace
}  // namespace cpptrain
