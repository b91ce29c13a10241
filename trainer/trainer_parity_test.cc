// Hugging Face Trainer API parity (docs/HF_PARITY.md): each test fails without its feature.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "config/training_args.h"
#include "trainer/data/collator.h"
#include "trainer/label_smoothing.h"
#include "trainer/optimizer.h"
#include "trainer/optimizer_choice.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

namespace cpptrain {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::MaxRelativeDifference;
using testing::Parameters;
using testing::TestTempDir;
using testing::TinyDecoder;
using testing::VariableLengthTokens;

proto::TrainingArguments Args(const std::string& name) {
  proto::TrainingArguments args;
  const std::string dir = TestTempDir("parity_" + name);
  fs::remove_all(dir);
  args.set_output_dir(dir);
  args.set_learning_rate(1e-2);
  args.set_lr_scheduler_type(proto::TrainingArguments::CONSTANT);
  args.set_save_strategy(proto::TrainingArguments::NO);
  args.set_logging_steps(1);
  args.set_disable_tqdm(true);
  args.set_per_device_train_batch_size(4);
  args.set_per_device_eval_batch_size(4);
  args.mutable_local()->set_device("cpu");
  return args;
}

double EvalLoss(Trainer& trainer) {
  absl::StatusOr<Metrics> metrics = trainer.Evaluate();
  EXPECT_TRUE(metrics.ok()) << metrics.status();
  return metrics.ok() ? metrics->at("eval_loss") : -1;
}

// Twice the default loss, through Trainer::ComputeLoss.
class DoubleLossTrainer : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  torch::Tensor ComputeLoss(TrainableModel& m, const Batch& b, int64_t n) override {
    return 2 * Trainer::ComputeLoss(m, b, n);
  }
};

// Three times the model's loss, without calling Trainer::ComputeLoss.
class TripleLossTrainer : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  torch::Tensor ComputeLoss(TrainableModel& m, const Batch& b, int64_t n) override {
    return 3 * m.ForwardLossSum(b) / static_cast<double>(n);
  }
};

TEST(TrainerParityTest, AComputeLossOverrideGivesTheEvalLoss) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(10, 4);
  Trainer plain(Args("plain_eval"), model, nullptr, data);
  const double base = EvalLoss(plain);
  DoubleLossTrainer doubled(Args("double_eval"), model, nullptr, data);
  EXPECT_NEAR(EvalLoss(doubled), 2 * base, 1e-5 * base);
  // With compute_metrics the logits are kept: one forward through the override's base call,
  // or a second forward for an override that does not call it.
  for (bool via_base : {true, false}) {
    std::unique_ptr<Trainer> trainer;
    if (via_base) {
      trainer = std::make_unique<DoubleLossTrainer>(Args("double_metrics"), model, nullptr, data);
    } else {
      trainer = std::make_unique<TripleLossTrainer>(Args("triple_metrics"), model, nullptr, data);
    }
    int64_t rows = 0;
    trainer->set_compute_metrics([&](const EvalPrediction& p) {
      rows = p.predictions.size(0);
      return Metrics{};
    });
    EXPECT_NEAR(EvalLoss(*trainer), (via_base ? 2 : 3) * base, 1e-5 * base);
    EXPECT_EQ(rows, 10);
  }
}

TEST(TrainerParityTest, LabelSmoothingMatchesTorchCrossEntropy) {
  torch::manual_seed(3);
  torch::Tensor logits = torch::randn({2, 5, 11});
  torch::Tensor labels = torch::randint(0, 11, {2, 5});
  labels[1][3] = kIgnoreIndex;
  // Causal: position t predicts label t + 1.
  torch::Tensor want = at::cross_entropy_loss(logits.slice(1, 0, 4).reshape({-1, 11}),
                                              labels.slice(1, 1).reshape({-1}), {},
                                              at::Reduction::Sum, kIgnoreIndex, 0.1);
  EXPECT_NEAR(LabelSmoothedLossSum(logits, labels, 0.1).item<double>(), want.item<double>(), 1e-4);
  torch::Tensor classes = torch::randint(0, 11, {6});
  EXPECT_NEAR(
      LabelSmoothedLossSum(logits[0].slice(0, 0, 5).repeat({2, 1}).slice(0, 0, 6), classes, 0.2)
          .item<double>(),
      at::cross_entropy_loss(logits[0].slice(0, 0, 5).repeat({2, 1}).slice(0, 0, 6), classes, {},
                             at::Reduction::Sum, kIgnoreIndex, 0.2)
          .item<double>(),
      1e-4);
}

TEST(TrainerParityTest, LabelSmoothingFactorSmoothsTrainingAndEvalLoss) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(8, 5);
  // The expected smoothed mean, from one padded batch of all samples.
  Collator collator;
  std::vector<Example> examples;
  for (int64_t i = 0; i < data->size(); ++i) examples.push_back(data->Get(i));
  Batch all = collator.Collate(examples).value();
  double want = 0;
  {
    torch::NoGradGuard no_grad;
    want = LabelSmoothedLossSum(model->Forward(all), all.labels, 0.1).item<double>() /
           model->CountLossTargets(all);
  }
  proto::TrainingArguments args = Args("smoothing");
  args.set_label_smoothing_factor(0.1);
  Trainer smoothed(args, model, data, data);
  const double got = EvalLoss(smoothed);
  EXPECT_NEAR(got, want, 1e-5 * want);
  Trainer plain(Args("no_smoothing"), model, nullptr, data);
  // Near-uniform logits make the two close, but not within the tolerance above.
  EXPECT_GT(std::fabs(got - EvalLoss(plain)), 1e-4);
}

TEST(TrainerParityTest, ComputeLossFuncIsUsedForTrainingAndEvaluation) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(8, 6);
  Trainer plain(Args("loss_func_plain"), model, nullptr, data);
  const double base = EvalLoss(plain);
  proto::TrainingArguments args = Args("loss_func");
  args.set_max_steps(2);
  Trainer trainer(args, model, data, data);
  int calls = 0;
  trainer.set_compute_loss_func([&](const torch::Tensor& logits, const Batch& batch, int64_t n) {
    ++calls;
    return 4 * model->LossSum(logits, batch) / static_cast<double>(n);
  });
  EXPECT_NEAR(EvalLoss(trainer), 4 * base, 1e-5 * base);
  const int eval_calls = calls;
  EXPECT_EQ(eval_calls, 2);  // 8 samples in batches of 4
  ASSERT_TRUE(trainer.Train().ok());
  EXPECT_EQ(calls, eval_calls + 2);  // 2 steps of one micro-batch
}

TEST(TrainerParityTest, PreprocessLogitsForMetricsRunsBeforeTheyAreKept) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(10, 4);
  Trainer trainer(Args("preprocess"), model, nullptr, data);
  int64_t dims = 0;
  trainer.set_compute_metrics([&](const EvalPrediction& p) {
    dims = p.predictions.dim();
    return Metrics{};
  });
  trainer.set_preprocess_logits_for_metrics(
      [](const torch::Tensor& logits, const torch::Tensor& labels) {
        EXPECT_EQ(logits.size(0), labels.size(0));
        return logits.argmax(-1);
      });
  ASSERT_TRUE(trainer.Evaluate().ok());
  EXPECT_EQ(dims, 2);  // [N, T] ids instead of [N, T, V] logits
  auto predicted = trainer.Predict(data);
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  EXPECT_EQ(predicted->predictions.dim(), 2);
}

TEST(TrainerParityTest, AUserDataCollatorBuildsEveryBatch) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(8, 7);
  Trainer trainer(Args("collator"), model, nullptr, data);
  std::atomic<int> calls{0};
  // Ignores every label: nothing counts, so the loss is 0.
  trainer.set_data_collator([&](const std::vector<Example>& examples) -> absl::StatusOr<Batch> {
    ++calls;
    absl::StatusOr<Batch> batch = Collator().Collate(examples);
    if (batch.ok()) batch->labels.fill_(kIgnoreIndex);
    return batch;
  });
  EXPECT_EQ(EvalLoss(trainer), 0.0);
  EXPECT_EQ(calls.load(), 2);
  Trainer plain(Args("collator_plain"), model, nullptr, data);
  EXPECT_GT(EvalLoss(plain), 1.0);
}

class RecordingCallback : public TrainerCallback {
 public:
  void OnStepEnd(const CallbackContext& c) override {
    models.insert(c.model);
    optimizers.insert(c.optimizer);
  }
  std::set<TrainableModel*> models;
  std::set<torch::optim::Optimizer*> optimizers;
};

TEST(TrainerParityTest, CallbacksReachTheModelAndTheOptimizer) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = Args("callback_reach");
  args.set_max_steps(2);
  Trainer trainer(args, model, VariableLengthTokens(8, 8));
  auto recorder = std::make_shared<RecordingCallback>();
  trainer.AddCallback(recorder);
  ASSERT_TRUE(trainer.Train().ok());
  EXPECT_EQ(recorder->models, std::set<TrainableModel*>{model.get()});
  ASSERT_NE(trainer.engine()->optimizer(), nullptr);
  EXPECT_EQ(recorder->optimizers,
            std::set<torch::optim::Optimizer*>{trainer.engine()->optimizer()});
}

TEST(TrainerParityTest, PredictMetricsHaveHuggingFacesNames) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(9, 4);
  Trainer trainer(Args("predict_names"), model, nullptr);
  auto out = trainer.Predict(data);
  ASSERT_TRUE(out.ok()) << out.status();
  for (const char* key :
       {"test_loss", "test_runtime", "test_samples_per_second", "test_steps_per_second"}) {
    EXPECT_EQ(out->metrics.count(key), 1u) << key;
  }
  EXPECT_NEAR(out->metrics.at("test_steps_per_second") * out->metrics.at("test_runtime"), 3.0,
              1e-6);  // 9 samples in batches of 4
}

std::vector<Metrics> ReadJsonlSteps(const std::string& path) {
  // {"epoch":..,"learning_rate":..,"loss":..,"step":N}: the loss records' steps.
  std::vector<Metrics> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"loss\":") == std::string::npos) continue;
    const size_t at = line.find("\"step\":");
    out.push_back({{"step", std::stod(line.substr(at + 7))}});
  }
  return out;
}

TEST(TrainerParityTest, AResumeLogsEachStepOnceAndAveragesTrainLossOverAllSteps) {
  auto data = VariableLengthTokens(40, 9);
  proto::TrainingArguments args = Args("resume_whole");
  args.set_max_steps(6);
  Trainer whole(args, TinyDecoder(7), data);
  auto want = whole.Train();
  ASSERT_TRUE(want.ok()) << want.status();

  proto::TrainingArguments first = Args("resume_parts");
  first.set_max_steps(4);  // interrupted after step 4; checkpoint-3 is the newest
  first.set_save_strategy(proto::TrainingArguments::STEPS);
  first.set_save_steps(3);
  ASSERT_TRUE(Trainer(first, TinyDecoder(7), data).Train().ok());
  proto::TrainingArguments second = first;
  second.set_max_steps(6);
  Trainer resumed(second, TinyDecoder(11), data);
  auto got = resumed.Train(first.output_dir() + "/checkpoint-3");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->global_step, 6);
  EXPECT_NEAR(got->training_loss, want->training_loss, 1e-6 * want->training_loss);
  EXPECT_NEAR(got->metrics.at("train_loss"), want->training_loss, 1e-6 * want->training_loss);
  std::vector<double> steps;
  for (const Metrics& m : ReadJsonlSteps(first.output_dir() + "/metrics.jsonl")) {
    steps.push_back(m.at("step"));
  }
  EXPECT_EQ(steps, (std::vector<double>{1, 2, 3, 4, 5, 6}));
}

TEST(TrainerParityTest, SaveModelWritesALoadableModelDirectory) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = Args("save_model");
  Trainer trainer(args, model, nullptr);
  const std::string dir = args.output_dir() + "/final";
  ASSERT_TRUE(trainer.SaveModel(dir).ok());
  for (const char* file : {"model.safetensors", "config.json", "generation_config.json"}) {
    EXPECT_TRUE(fs::exists(fs::path(dir) / file)) << file;
  }
  EXPECT_FALSE(fs::exists(fs::path(dir) / "trainer_state.textproto"));
  auto other = TinyDecoder(8);
  ASSERT_GT(MaxRelativeDifference(Parameters(*other), Parameters(*model)), 1e-3);
  ASSERT_TRUE(LoadModelState(dir, *other, nullptr).ok());
  EXPECT_EQ(MaxRelativeDifference(Parameters(*other), Parameters(*model)), 0.0);
}

TEST(TrainerParityTest, OptimChoosesTheOptimizer) {
  NamedParameters params = {{"w", torch::zeros({2, 2}, torch::requires_grad())},
                            {"layer.bias", torch::zeros({2}, torch::requires_grad())}};
  proto::TrainingArguments args;
  for (const std::string& name : SupportedOptimizers()) {
    args.set_optim(name);
    auto factory = MakeOptimizerFactory(args);
    ASSERT_TRUE(factory.ok()) << name << ": " << factory.status();
    auto optimizer = (*factory)(params);
    ASSERT_TRUE(optimizer.ok()) << name;
    torch::optim::Optimizer* o = optimizer->get();
    EXPECT_EQ((*optimizer)->param_groups().size(), 2u) << name;  // decay, no decay
    if (name == "sgd") {
      EXPECT_NE(dynamic_cast<torch::optim::SGD*>(o), nullptr);
    }
    if (name == "adamw_torch_fused") {
      EXPECT_NE(dynamic_cast<FusedAdamW*>(o), nullptr);
    }
    if (name == "adamw_torch") {
      EXPECT_NE(dynamic_cast<torch::optim::AdamW*>(o), nullptr);
      EXPECT_EQ(dynamic_cast<FusedAdamW*>(o), nullptr);
    }
  }
  EXPECT_EQ(proto::TrainingArguments().optim(), SupportedOptimizers()[0]);
  args.set_optim("adafactor");
  auto unknown = MakeOptimizerFactory(args);
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("optim=\"adafactor\" is not built here: use one of adamw_torch_fused, "
                        "adamw_torch, sgd"));
}

TEST(TrainerParityTest, SgdOptimTrainsWithPlainSgdSteps) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = Args("sgd");
  args.set_optim("sgd");
  args.set_max_steps(1);
  args.set_max_grad_norm(0);
  Trainer trainer(args, model, VariableLengthTokens(4, 3));
  ASSERT_TRUE(trainer.Train().ok());
  EXPECT_NE(dynamic_cast<torch::optim::SGD*>(trainer.engine()->optimizer()), nullptr);
}

TEST(TrainerParityTest, OverwriteOutputDirRemovesAnEarlierRunsCheckpoints) {
  for (bool overwrite : {false, true}) {
    proto::TrainingArguments args = Args(overwrite ? "overwrite" : "keep");
    const fs::path out(args.output_dir());
    fs::create_directories(out / "checkpoint-99");
    std::ofstream(out / "checkpoint-99" / "trainer_state.textproto") << "global_step: 99\n";
    std::ofstream(out / "metrics.jsonl") << "{\"loss\":9,\"step\":99}\n";
    args.set_overwrite_output_dir(overwrite);
    args.set_max_steps(1);
    Trainer trainer(args, TinyDecoder(7), VariableLengthTokens(4, 3));
    ASSERT_TRUE(trainer.Train().ok());
    EXPECT_EQ(fs::exists(out / "checkpoint-99"), !overwrite);
    std::vector<double> steps;
    for (const Metrics& m : ReadJsonlSteps((out / "metrics.jsonl").string())) {
      steps.push_back(m.at("step"));
    }
    const std::vector<double> want =
        overwrite ? std::vector<double>{1} : std::vector<double>{99, 1};
    EXPECT_EQ(steps, want);
  }
}

// Padding positions in the training batches of one epoch.
int64_t TrainingPadding(bool group_by_length) {
  proto::TrainingArguments args = Args(group_by_length ? "grouped" : "ungrouped");
  args.set_group_by_length(group_by_length);
  args.set_num_train_epochs(1);
  Trainer trainer(args, TinyDecoder(7), VariableLengthTokens(64, 12));
  std::atomic<int64_t> padding{0};
  trainer.set_data_collator([&](const std::vector<Example>& examples) {
    absl::StatusOr<Batch> batch = Collator().Collate(examples);
    if (batch.ok())
      padding += batch->attention_mask.numel() - batch->attention_mask.sum().item<int64_t>();
    return batch;
  });
  EXPECT_TRUE(trainer.Train().ok());
  return padding.load();
}

TEST(TrainerParityTest, GroupByLengthBatchesSimilarLengths) {
  const int64_t grouped = TrainingPadding(true);
  const int64_t ungrouped = TrainingPadding(false);
  EXPECT_LT(grouped * 2, ungrouped) << grouped << " vs " << ungrouped;
}

TEST(TrainerParityTest, RunNameDefaultsToTheOutputDir) {
  proto::TrainingArguments args;
  args.set_output_dir("/tmp/run-a");
  EXPECT_EQ(ResolvedRunName(args), "/tmp/run-a");
  args.set_run_name("baseline");
  EXPECT_EQ(ResolvedRunName(args), "baseline");
}

}  // namespace
}  // namespace cpptrain
