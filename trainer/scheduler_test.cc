// Compares every schedule with the learning rates Hugging Face transformers (and torch's
// ReduceLROnPlateau) produce, from tests/golden/scheduler_golden.txt, which
// tests/golden/gen_scheduler_golden.py generates.
#include "trainer/scheduler.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "config/text_proto.h"

namespace cpptrain {
namespace {

struct GoldenCase {
  std::string name;
  std::string args_text;
  int64_t total = 0;
  std::vector<std::pair<int64_t, double>> steps;
  std::vector<std::pair<double, double>> metrics;
};

std::vector<GoldenCase> ReadGolden() {
  const std::string path = std::string(std::getenv("TEST_SRCDIR")) + "/" +
                           std::getenv("TEST_WORKSPACE") + "/tests/golden/scheduler_golden.txt";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<GoldenCase> cases;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string head;
    words >> head;
    if (head == "case") {
      cases.emplace_back();
      words >> cases.back().name;
    } else if (head == "args") {
      cases.back().args_text = line.substr(5);
    } else if (head == "total") {
      words >> cases.back().total;
    } else if (head == "metric") {
      double metric, lr;
      words >> metric >> lr;
      cases.back().metrics.emplace_back(metric, lr);
    } else if (head != "end") {
      double lr;
      words >> lr;
      cases.back().steps.emplace_back(std::stoll(head), lr);
    }
  }
  return cases;
}

TEST(SchedulerTest, MatchesHuggingFaceGoldenValues) {
  std::vector<GoldenCase> cases = ReadGolden();
  ASSERT_GE(cases.size(), 15u);
  int checked = 0;
  for (const GoldenCase& c : cases) {
    SCOPED_TRACE(c.name);
    proto::TrainingArguments args;
    ASSERT_TRUE(ParseTextProto(c.args_text, c.name, &args).ok()) << c.args_text;
    absl::StatusOr<std::unique_ptr<LrSchedule>> schedule = LrSchedule::Create(args, c.total);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    for (const auto& [step, lr] : c.steps) {
      EXPECT_NEAR((*schedule)->LearningRate(step), lr, 1e-12 + 1e-9 * std::fabs(lr))
          << "step " << step;
      ++checked;
    }
    if (!c.metrics.empty()) {
      ReduceLrOnPlateau plateau(args.lr_scheduler_kwargs(), args.learning_rate());
      for (const auto& [metric, lr] : c.metrics) {
        EXPECT_NEAR(plateau.Step(metric), lr, 1e-15) << "metric " << metric;
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 900);
}

TEST(SchedulerTest, WarmupRatioIsCeilingOfTotal) {
  proto::TrainingArguments args;
  args.set_warmup_steps(0.25);
  args.set_lr_scheduler_type(proto::TrainingArguments::CONSTANT_WITH_WARMUP);
  auto schedule = LrSchedule::Create(args, 10);
  ASSERT_TRUE(schedule.ok());
  EXPECT_EQ((*schedule)->warmup_steps(), 3);  // ceil(10 * 0.25)
  EXPECT_DOUBLE_EQ((*schedule)->Multiplier(1), 1.0 / 3.0);
  EXPECT_DOUBLE_EQ((*schedule)->Multiplier(3), 1.0);
}

TEST(SchedulerTest, MinLrNeedsExactlyOneKwarg) {
  proto::TrainingArguments args;
  args.set_lr_scheduler_type(proto::TrainingArguments::COSINE_WITH_MIN_LR);
  auto neither = LrSchedule::Create(args, 10);
  ASSERT_FALSE(neither.ok());
  EXPECT_NE(neither.status().message().find("min_lr"), std::string::npos);
  args.mutable_lr_scheduler_kwargs()->set_min_lr(1e-5);
  args.mutable_lr_scheduler_kwargs()->set_min_lr_rate(0.1);
  EXPECT_FALSE(LrSchedule::Create(args, 10).ok());
}

TEST(SchedulerTest, WsdNeedsDecaySteps) {
  proto::TrainingArguments args;
  args.set_lr_scheduler_type(proto::TrainingArguments::WARMUP_STABLE_DECAY);
  auto missing = LrSchedule::Create(args, 10);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_decay_steps"), std::string::npos);
}

TEST(SchedulerTest, PolynomialNeedsLrAboveLrEnd) {
  proto::TrainingArguments args;
  args.set_lr_scheduler_type(proto::TrainingArguments::POLYNOMIAL);
  args.set_learning_rate(1e-8);
  auto bad = LrSchedule::Create(args, 10);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("lr_end"), std::string::npos);
}

}  // namespace
}  // namespace cpptrain
