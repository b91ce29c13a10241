// The generation room against transformers (tests/golden/gen_hf_generate_golden.py wrote the
// golden file): greedy Generate gives generate(do_sample=False)'s 20 tokens on every tiny
// Hugging Face directory of checkpoint/testdata, and FilterLogits keeps the tokens, with the
// probabilities, that transformers' temperature, top-k and top-p warpers keep.
#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "generation/generate.h"
#include "generation/sampling.h"
#include "jobs/job_model.h"

namespace cpptrain {
namespace {

std::string RunfilePath(const std::string& path) {
  return absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"), "/", path);
}

class HfGenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto file = SafetensorsFile::Open(RunfilePath("tests/golden/hf_generate_golden.safetensors"));
    ASSERT_TRUE(file.ok()) << file.status();
    file_ = std::move(*file);
  }
  at::Tensor Get(const std::string& name) const {
    auto tensor = file_->GetCopy(name);
    EXPECT_TRUE(tensor.ok()) << tensor.status();
    return tensor.ok() ? *tensor : at::Tensor();
  }
  static std::vector<int64_t> Ids(const at::Tensor& t) {
    const at::Tensor ids = t.to(at::kLong).contiguous();
    return {ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel()};
  }

  std::unique_ptr<SafetensorsFile> file_;
};

TEST_F(HfGenerateTest, GreedyMatchesTransformersTokenForToken) {
  const std::vector<std::vector<int64_t>> prompts = {Ids(Get("prompt.0")), Ids(Get("prompt.1"))};
  int directories = 0;
  for (const std::string& name : file_->names()) {
    if (!absl::StartsWith(name, "greedy.")) continue;
    const std::string dir = name.substr(std::string("greedy.").size());
    auto model = LoadHfDecoder(RunfilePath("checkpoint/testdata/" + dir));
    ASSERT_TRUE(model.ok()) << dir << ": " << model.status();
    const at::Tensor expected = Get(name);  // [2, 20]
    GenerationConfig config;
    config.max_new_tokens = expected.size(1);
    // One prompt at a time, and both as one call (two lengths: two batches).
    auto batch = GenerateBatch(**model, prompts, config);
    ASSERT_TRUE(batch.ok()) << dir << ": " << batch.status();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<int64_t> want = Ids(expected[i]);
      auto alone = Generate(**model, prompts[i], config);
      ASSERT_TRUE(alone.ok()) << alone.status();
      int matching = 0;
      while (matching < static_cast<int>(want.size()) &&
             matching < static_cast<int>(alone->size()) && (*alone)[matching] == want[matching]) {
        ++matching;
      }
      std::cout << dir << " prompt " << i << ": " << matching << "/" << want.size()
                << " tokens as transformers" << std::endl;
      EXPECT_EQ(*alone, want) << dir << " prompt " << i;
      EXPECT_EQ((*batch)[i], want) << dir << " prompt " << i << " in a batch";
    }
    ++directories;
  }
  EXPECT_EQ(directories, 17);
}

TEST_F(HfGenerateTest, FiltersKeepWhatTransformersKeeps) {
  const at::Tensor logits = Get("filter.logits");
  int cases = 0;
  for (int i = 0; file_->Get(absl::StrCat("filter.", i, ".options")).ok(); ++i) {
    const at::Tensor options = Get(absl::StrCat("filter.", i, ".options")).to(at::kDouble);
    SamplingOptions sampling;
    sampling.temperature = options[0].item<double>();
    sampling.top_k = static_cast<int64_t>(options[1].item<double>());
    sampling.top_p = options[2].item<double>();
    const at::Tensor scores = FilterLogits(logits, sampling);
    const at::Tensor kept = Get(absl::StrCat("filter.", i, ".kept")).to(at::kBool);
    EXPECT_TRUE(at::equal(at::isfinite(scores), kept)) << "case " << i;
    const at::Tensor probs = Get(absl::StrCat("filter.", i, ".probs"));
    EXPECT_LT((at::softmax(scores, -1) - probs).abs().max().item<double>(), 1e-6) << "case " << i;
    ++cases;
  }
  EXPECT_EQ(cases, 7);
}

}  // namespace
}  // namespace cpptrain
