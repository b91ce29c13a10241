// The Trainer on the LocalEngine: exact gradient accumulation, overridable steps, evaluation
// and prediction, logging and callbacks.
#include "trainer/trainer.h"

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "models/configs.h"
#include "models/decoder.h"
#include "trainer/data/in_memory_dataset.h"
#include "trainer/internal/preflight.h"
#include "trainer/testing/trainer_testing.h"

namespace cpptrain {
namespace {

using testing::MaxRelativeDifference;
using testing::Parameters;
using testing::SgdTrainer;
using testing::TestTempDir;
using testing::TinyDecoder;
using testing::VariableLengthTokens;

proto::TrainingArguments BaseArgs(const std::string& name) {
  proto::TrainingArguments args;
  args.set_output_dir(TestTempDir(name));
  args.set_learning_rate(1e-2);
  args.set_lr_scheduler_type(proto::TrainingArguments::CONSTANT);
  args.set_save_strategy(proto::TrainingArguments::NO);
  args.set_logging_steps(1);
  args.set_disable_tqdm(true);
  args.set_weight_decay(0.1);
  args.mutable_local()->set_device("cpu");  // the tests compare with CPU computations
  return args;
}

TEST(TrainerTest, AccumulationMatchesOneLargerBatch) {
  auto data = VariableLengthTokens(48, 1);
  std::vector<std::vector<torch::Tensor>> results;
  std::vector<std::vector<double>> losses;
  for (int accumulation : {4, 1}) {
    auto model = TinyDecoder(7);
    proto::TrainingArguments args = BaseArgs("accumulation_" + std::to_string(accumulation));
    args.set_gradient_accumulation_steps(accumulation);
    args.set_per_device_train_batch_size(16 / accumulation);
    args.set_max_steps(3);
    args.set_max_grad_norm(1.0);
    SgdTrainer trainer(args, model, data);
    auto out = trainer.Train();
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->global_step, 3);
    results.push_back(Parameters(*model));
    std::vector<double> step_losses;
    for (const Metrics& record : trainer.state().log_history) {
      if (record.count("loss")) step_losses.push_back(record.at("loss"));
    }
    losses.push_back(step_losses);
  }
  EXPECT_LT(MaxRelativeDifference(results[0], results[1]), 1e-5);
  ASSERT_EQ(losses[0].size(), 3u);
  ASSERT_EQ(losses[1].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(losses[0][i], losses[1][i], 1e-5 * losses[1][i]);
  // The model did train.
  auto untrained = TinyDecoder(7);
  EXPECT_GT(MaxRelativeDifference(results[1], Parameters(*untrained)), 1e-3);
}

class ZeroLossTrainer : public Trainer {
 public:
  using Trainer::Trainer;
  int calls = 0;

 protected:
  torch::Tensor ComputeLoss(TrainableModel& model, const Batch& batch,
                            int64_t num_items_in_batch) override {
    ++calls;
    return Trainer::ComputeLoss(model, batch, num_items_in_batch) * 0.0;
  }
};

// Runs out of memory (as a CUDA allocation would report it) in the third step of any run whose
// per-device batch is above 4, after two optimizer steps have changed the weights.
class OutOfMemoryAbove4 : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  absl::StatusOr<torch::Tensor> TrainingStep(const Batch& batch, int64_t num_items) override {
    if (batch.size() > 4 && state().global_step == 2) {
      return absl::ResourceExhaustedError("CUDA out of memory. Tried to allocate 2.00 GiB");
    }
    return Trainer::TrainingStep(batch, num_items);
  }
};

// auto_find_batch_size starts again from the initial weights with a fresh AdamW, so the run
// that finally fits ends exactly where a run started at that batch size ends.
TEST(TrainerTest, AutoFindBatchSizeRetriesFromTheInitialWeights) {
  auto data = VariableLengthTokens(64, 3);
  proto::TrainingArguments args = BaseArgs("auto_find");
  args.set_per_device_train_batch_size(8);
  args.set_max_steps(4);
  args.set_auto_find_batch_size(true);
  auto model = TinyDecoder(7);
  OutOfMemoryAbove4 retried(args, model, data);
  auto out = retried.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(retried.state().train_batch_size, 4);  // 8 -> 7 -> 6 -> 5 -> 4

  proto::TrainingArguments direct_args = BaseArgs("auto_find_direct");
  direct_args.set_per_device_train_batch_size(4);
  direct_args.set_max_steps(4);
  auto direct_model = TinyDecoder(7);
  Trainer direct(direct_args, direct_model, data);
  ASSERT_TRUE(direct.Train().ok());
  EXPECT_EQ(MaxRelativeDifference(Parameters(*model), Parameters(*direct_model)), 0.0);
}

// Hugging Face's num_input_tokens_seen: the tokens the attention mask marks real (padding
// excluded), over every rank.
TEST(TrainerTest, InputTokensSeenCountsNonPaddingTokens) {
  auto data = VariableLengthTokens(48, 1);
  int64_t real_tokens = 0;
  for (int64_t i = 0; i < data->size(); ++i) real_tokens += data->Get(i).inputs.numel();
  proto::TrainingArguments args = BaseArgs("tokens_seen");
  args.set_per_device_train_batch_size(8);
  args.set_num_train_epochs(1);
  Trainer trainer(args, TinyDecoder(7), data);
  ASSERT_TRUE(trainer.Train().ok());
  EXPECT_EQ(trainer.state().num_input_tokens_seen, real_tokens);
}

// Sums the input elements (padding included) of every micro-batch it trains on.
class CountingInputs : public Trainer {
 public:
  using Trainer::Trainer;
  int64_t inputs = 0;

 protected:
  absl::StatusOr<torch::Tensor> TrainingStep(const Batch& batch, int64_t num_items) override {
    inputs += batch.inputs.numel();
    return Trainer::TrainingStep(batch, num_items);
  }
};

// Hugging Face's total_flos: 6 x non-embedding parameters x input elements (padding included),
// in the state, in the final metrics and in trainer_state.json.
TEST(TrainerTest, TotalFlosIsSixTimesNonEmbeddingParametersTimesInputs) {
  auto data = VariableLengthTokens(48, 1);
  proto::TrainingArguments args = BaseArgs("total_flos");
  args.set_per_device_train_batch_size(8);
  args.set_gradient_accumulation_steps(2);
  args.set_max_steps(3);
  auto model = TinyDecoder(7);
  const proto::DecoderConfig& config = model->config();
  const int64_t non_embedding =
      DecoderParameterCount(config) - config.vocab_size() * config.hidden_size();
  EXPECT_EQ(model->NonEmbeddingParameters(), non_embedding);
  CountingInputs trainer(args, model, data);
  auto out = trainer.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_GT(trainer.inputs, 0);
  const double expected = 6.0 * static_cast<double>(non_embedding) * trainer.inputs;
  EXPECT_EQ(trainer.state().total_flos, expected);
  EXPECT_EQ(out->metrics.at("total_flos"), expected);
  // Protobuf's JSON mapping quotes 64-bit integers.
  EXPECT_THAT(model->ConfigJson(), ::testing::HasSubstr("\"hidden_size\": \"" +
                                                        std::to_string(config.hidden_size())));
}

// Checked before the first step: a directory nothing can be written into (even as root).
TEST(TrainerTest, AnUnwritableOutputDirFailsBeforeTheFirstStep) {
  proto::TrainingArguments args = BaseArgs("unused");
  args.set_output_dir("/proc");
  args.set_max_steps(2);
  Trainer trainer(args, TinyDecoder(7), VariableLengthTokens(8, 1));
  auto out = trainer.Train();
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(std::string(out.status().message()),
              ::testing::AllOf(::testing::HasSubstr("output_dir \"/proc\" is not writable"),
                               ::testing::HasSubstr("choose a writable output_dir")));
  EXPECT_EQ(trainer.state().global_step, 0);
}

TEST(TrainerTest, ACheckpointLargerThanTheFreeSpaceIsRefusedUpFront) {
  auto model = TinyDecoder(7);
  int64_t params = 0;
  for (const auto& p : model->parameters()) params += p.numel();
  // fp32 weights, and with AdamW two fp32 moments more.
  EXPECT_EQ(trainer_internal::CheckpointBytes(*model, /*with_optimizer=*/false), 4 * params);
  EXPECT_EQ(trainer_internal::CheckpointBytes(*model, /*with_optimizer=*/true), 12 * params);
  std::filesystem::create_directories(TestTempDir("space"));
  const absl::Status refused =
      trainer_internal::CheckFreeSpace(TestTempDir("space"), int64_t{1} << 60);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(refused.message()),
              ::testing::AllOf(::testing::HasSubstr("free but one checkpoint takes about"),
                               ::testing::HasSubstr("save_strategy NO")));
  EXPECT_TRUE(trainer_internal::CheckFreeSpace(TestTempDir("space"), 1).ok());
}

// Hugging Face logs grad_norm only when it clipped: with max_grad_norm 0 no norm is computed.
TEST(TrainerTest, NoGradNormIsLoggedWithoutClipping) {
  for (double max_norm : {0.0, 1.0}) {
    proto::TrainingArguments args = BaseArgs("grad_norm");
    args.set_max_grad_norm(max_norm);
    args.set_max_steps(2);
    args.set_per_device_train_batch_size(4);
    Trainer trainer(args, TinyDecoder(7), VariableLengthTokens(16, 1));
    ASSERT_TRUE(trainer.Train().ok());
    int with_norm = 0;
    for (const Metrics& m : trainer.state().log_history) with_norm += m.count("grad_norm");
    EXPECT_EQ(with_norm, max_norm > 0 ? 2 : 0) << "max_grad_norm " << max_norm;
  }
}

// What a scheduler's preemption delivers, at the end of one step.
class SignalAtStep : public TrainerCallback {
 public:
  SignalAtStep(int64_t step, int signal) : step_(step), signal_(signal) {}
  void OnStepEnd(const CallbackContext& c) override {
    if (c.state.global_step == step_) std::raise(signal_);
  }

 private:
  int64_t step_;
  int signal_;
};

// SIGTERM (and SIGINT) during step 3: the run finishes step 4, saves checkpoint-4 although
// save_strategy is NO, and returns Cancelled; resuming from latest ends bitwise where an
// uninterrupted run ends.
TEST(TrainerTest, AStopSignalSavesACheckpointAndTheResumeIsExact) {
  auto data = VariableLengthTokens(48, 3);
  proto::TrainingArguments args = BaseArgs("signal_whole");
  args.set_per_device_train_batch_size(4);
  args.set_max_steps(8);
  auto whole = TinyDecoder(7);
  ASSERT_TRUE(Trainer(args, whole, data).Train().ok());
  for (int signal : {SIGTERM, SIGINT}) {
    proto::TrainingArguments stopped_args = args;
    stopped_args.set_output_dir(TestTempDir(absl::StrCat("signal_", signal)));
    auto model = TinyDecoder(7);
    Trainer stopped(stopped_args, model, data);
    stopped.AddCallback(std::make_shared<SignalAtStep>(3, signal));
    auto out = stopped.Train();
    ASSERT_EQ(out.status().code(), absl::StatusCode::kCancelled) << out.status();
    EXPECT_EQ(stopped.stopped_by_signal(), signal);
    EXPECT_EQ(stopped.state().global_step, 4);
    EXPECT_THAT(std::string(out.status().message()), ::testing::HasSubstr("checkpoint-4"));
    ASSERT_TRUE(std::filesystem::exists(stopped_args.output_dir() +
                                        "/checkpoint-4/trainer_state.textproto"));
    stopped_args.set_resume_from_checkpoint("latest");
    auto resumed_model = TinyDecoder(8);
    Trainer resumed(stopped_args, resumed_model, data);
    ASSERT_TRUE(resumed.Train().ok());
    EXPECT_EQ(MaxRelativeDifference(Parameters(*resumed_model), Parameters(*whole)), 0.0)
        << "signal " << signal;
  }
}

TEST(TrainerTest, SubclassComputeLossOverrideIsUsed) {
  auto model = TinyDecoder(7);
  auto before = Parameters(*model);
  proto::TrainingArguments args = BaseArgs("override");
  args.set_weight_decay(0.0);
  args.set_per_device_train_batch_size(4);
  args.set_gradient_accumulation_steps(2);
  args.set_max_steps(3);
  ZeroLossTrainer trainer(args, model, VariableLengthTokens(40, 2));
  auto out = trainer.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(trainer.calls, 6);  // 3 steps x 2 micro-batches
  // A zero loss gives zero gradients, and AdamW without decay then leaves every parameter.
  EXPECT_EQ(MaxRelativeDifference(before, Parameters(*model)), 0.0);
}

TEST(TrainerTest, ADeferredModelUnderTheLocalEngineIsAClearError) {
  auto model = BuildDecoder(NamedDecoderConfig("tiny").value(),
                            {DecoderInit::Mode::kDeferred, 3})
                   .value();
  proto::TrainingArguments args = BaseArgs("deferred");
  args.set_max_steps(1);
  Trainer trainer(args, model, VariableLengthTokens(8, 2));
  auto out = trainer.Train();
  ASSERT_FALSE(out.ok());
  const std::string message(out.status().message());
  EXPECT_NE(message.find("parameter model.embed_tokens.weight is deferred"), std::string::npos)
      << message;
  EXPECT_NE(message.find("fsdp { version: 2 }"), std::string::npos) << message;
}

double DirectLoss(DecoderLM& model, const Dataset& data) {
  torch::NoGradGuard no_grad;
  double loss = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < data.size(); ++i) {
    Example e = data.Get(i);
    Batch batch{e.inputs.unsqueeze(0), e.inputs.unsqueeze(0),
                torch::ones_like(e.inputs).unsqueeze(0)};
    loss += model.LossSum(model.Forward(batch), batch).item<double>();
    count += model.CountLossTargets(batch);
  }
  return loss / count;
}

TEST(TrainerTest, EvaluateIsTheTokenMeanLossWhateverTheBatchSize) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(23, 3);
  const double expected = DirectLoss(*model, *data);
  for (int batch : {1, 5, 23}) {
    proto::TrainingArguments args = BaseArgs("evaluate");
    args.set_per_device_eval_batch_size(batch);
    Trainer trainer(args, model, nullptr, data);
    auto metrics = trainer.Evaluate();
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_NEAR(metrics->at("eval_loss"), expected, 1e-5) << "batch " << batch;
    EXPECT_EQ(metrics->count("eval_runtime"), 1u);
    // Evaluation before any training needs no optimizer.
    EXPECT_EQ(trainer.engine()->optimizer(), nullptr);
  }
}

TEST(TrainerTest, PredictReturnsPaddedLogitsLabelsAndMetrics) {
  auto model = TinyDecoder(7);
  auto data = VariableLengthTokens(10, 4);
  proto::TrainingArguments args = BaseArgs("predict");
  args.set_per_device_eval_batch_size(4);
  Trainer trainer(args, model, nullptr);
  trainer.set_compute_metrics([](const EvalPrediction& p) {
    torch::Tensor predicted = p.predictions.argmax(-1).slice(1, 0, -1);
    torch::Tensor target = p.label_ids.slice(1, 1);
    torch::Tensor counted = target.ne(-100);
    return Metrics{{"accuracy", (predicted.eq(target) & counted).sum().item<double>() /
                                    counted.sum().item<double>()},
                   {"count", counted.sum().item<double>()}};
  });
  auto out = trainer.Predict(data);
  ASSERT_TRUE(out.ok()) << out.status();
  int64_t longest = 0, targets = 0;
  for (int64_t i = 0; i < data->size(); ++i) {
    longest = std::max(longest, data->Get(i).inputs.size(0));
    targets += data->Get(i).inputs.size(0) - 1;
  }
  ASSERT_EQ(out->predictions.dim(), 3);
  EXPECT_EQ(out->predictions.size(0), 10);
  EXPECT_EQ(out->predictions.size(1), longest);
  EXPECT_EQ(out->label_ids.sizes(), (std::vector<int64_t>{10, longest}));
  for (int64_t i = 0; i < data->size(); ++i) {
    torch::Tensor tokens = data->Get(i).inputs;
    EXPECT_TRUE(out->label_ids[i].slice(0, 0, tokens.size(0)).equal(tokens));
  }
  EXPECT_EQ(out->metrics.at("test_count"), targets);
  EXPECT_GE(out->metrics.at("test_accuracy"), 0.0);
  EXPECT_NEAR(out->metrics.at("test_loss"), DirectLoss(*model, *data), 1e-5);
}

TEST(TrainerTest, LogsAtLoggingStepsAndWritesMetricsJsonl) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = BaseArgs("jsonl");
  args.set_per_device_train_batch_size(4);
  args.set_max_steps(6);
  args.set_logging_steps(2);
  args.set_eval_strategy(proto::TrainingArguments::STEPS);
  args.set_eval_steps(3);
  Trainer trainer(args, model, VariableLengthTokens(40, 5), VariableLengthTokens(8, 6));
  ASSERT_TRUE(trainer.Train().ok());
  std::vector<int64_t> loss_steps, eval_steps;
  for (const Metrics& record : trainer.state().log_history) {
    if (record.count("loss")) loss_steps.push_back(static_cast<int64_t>(record.at("step")));
    if (record.count("eval_loss")) eval_steps.push_back(static_cast<int64_t>(record.at("step")));
  }
  EXPECT_EQ(loss_steps, (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(eval_steps, (std::vector<int64_t>{3, 6}));
  std::ifstream in(args.output_dir() + "/metrics.jsonl");
  std::string line;
  int lines = 0, with_loss = 0;
  while (std::getline(in, line)) {
    ++lines;
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '}');
    if (line.find("\"loss\":") != std::string::npos) ++with_loss;
  }
  EXPECT_EQ(with_loss, 3);
  EXPECT_EQ(lines, 3 + 2 + 1);  // logs, evaluations, the train summary
}

TEST(TrainerTest, EarlyStoppingEndsTrainingWhenTheMetricStalls) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = BaseArgs("early_stop");
  args.set_learning_rate(0.0);  // eval_loss never improves after the first evaluation
  args.set_per_device_train_batch_size(4);
  args.set_max_steps(50);
  args.set_eval_strategy(proto::TrainingArguments::STEPS);
  args.set_eval_steps(2);
  args.set_metric_for_best_model("eval_loss");
  Trainer trainer(args, model, VariableLengthTokens(40, 7), VariableLengthTokens(8, 8));
  trainer.AddCallback(std::make_shared<EarlyStoppingCallback>(/*patience=*/2));
  auto out = trainer.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  // Evaluations at steps 2 (best), 4 and 6 (no improvement): stop after step 6.
  EXPECT_EQ(out->global_step, 6);
  EXPECT_EQ(trainer.state().best_global_step, 2);
}

class EventRecorder : public TrainerCallback {
 public:
  std::vector<std::string> events;
  void OnTrainBegin(const CallbackContext&) override { events.push_back("train_begin"); }
  void OnEpochBegin(const CallbackContext&) override { events.push_back("epoch_begin"); }
  void OnStepBegin(const CallbackContext&) override { events.push_back("step_begin"); }
  void OnSubstepEnd(const CallbackContext&) override { events.push_back("substep_end"); }
  void OnPreOptimizerStep(const CallbackContext&) override { events.push_back("pre_optimizer"); }
  void OnOptimizerStep(const CallbackContext&) override { events.push_back("optimizer"); }
  void OnStepEnd(const CallbackContext& c) override {
    events.push_back("step_end");
    if (c.state.global_step == 2) c.control.should_training_stop = true;
  }
  void OnEpochEnd(const CallbackContext&) override { events.push_back("epoch_end"); }
  void OnTrainEnd(const CallbackContext&) override { events.push_back("train_end"); }
};

TEST(TrainerTest, CallbacksSeeEventsInOrderAndCanStopTraining) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = BaseArgs("events");
  args.set_per_device_train_batch_size(4);
  args.set_gradient_accumulation_steps(2);
  args.set_max_steps(10);
  args.set_logging_steps(100);
  Trainer trainer(args, model, VariableLengthTokens(40, 9));
  auto recorder = std::make_shared<EventRecorder>();
  trainer.AddCallback(recorder);
  auto out = trainer.Train();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->global_step, 2);
  const std::vector<std::string> step = {"step_begin", "substep_end", "pre_optimizer",
                                         "optimizer", "step_end"};
  std::vector<std::string> expected = {"train_begin", "epoch_begin"};
  expected.insert(expected.end(), step.begin(), step.end());
  expected.insert(expected.end(), step.begin(), step.end());
  expected.insert(expected.end(), {"epoch_end", "train_end"});
  EXPECT_EQ(recorder->events, expected);
}

// cuda_graphs on a device where nothing can be captured (the CPU): every step runs eagerly
// through the graph's path, which trains exactly as the plain path does, with the callbacks in
// the same order, and the run reports no capture. (tools/test runs the GPU side in
// trainer/cuda_graph_test.cc on GPU hosts.)
TEST(TrainerTest, CudaGraphsWhereNothingCanBeCapturedTrainAsWithout) {
  std::vector<std::vector<torch::Tensor>> params;
  std::vector<std::vector<std::string>> events;
  std::vector<TrainOutput> outs;
  for (bool graphs : {false, true}) {
    auto model = TinyDecoder(7);
    proto::TrainingArguments args = BaseArgs(graphs ? "graphs_cpu_on" : "graphs_cpu_off");
    args.set_per_device_train_batch_size(4);
    args.set_gradient_accumulation_steps(2);
    args.set_max_steps(5);
    args.set_max_grad_norm(0.3);
    args.set_cuda_graphs(graphs);
    Trainer trainer(args, model, VariableLengthTokens(40, 9));
    auto recorder = std::make_shared<EventRecorder>();
    trainer.AddCallback(recorder);
    auto out = trainer.Train();
    ASSERT_TRUE(out.ok()) << out.status();
    params.push_back(Parameters(*model));
    events.push_back(recorder->events);
    outs.push_back(*out);
  }
  EXPECT_EQ(outs[1].global_step, 2) << "the recorder stops after step 2";
  EXPECT_EQ(outs[1].training_loss, outs[0].training_loss);
  EXPECT_EQ(MaxRelativeDifference(params[1], params[0]), 0);
  EXPECT_EQ(events[1], events[0]);
  EXPECT_EQ(outs[1].metrics.at("cuda_graph_captures"), 0);
  EXPECT_EQ(outs[1].metrics.at("cuda_graph_replays"), 0);
  EXPECT_EQ(outs[0].metrics.count("cuda_graph_captures"), 0u);
}

TEST(TrainerTest, EvalStrategyWithoutEvalDatasetIsAClearError) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = BaseArgs("no_eval");
  args.set_eval_strategy(proto::TrainingArguments::STEPS);
  args.set_eval_steps(1);
  Trainer trainer(args, model, VariableLengthTokens(8, 10));
  auto out = trainer.Train();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("eval_strategy"), std::string::npos);
  EXPECT_NE(out.status().message().find("eval dataset"), std::string::npos);
}

TEST(TrainerTest, DatasetShorterThanOneBatchWithDropLastIsAClearError) {
  auto model = TinyDecoder(7);
  proto::TrainingArguments args = BaseArgs("short");
  args.set_per_device_train_batch_size(16);
  args.set_dataloader_drop_last(true);
  Trainer trainer(args, model, VariableLengthTokens(5, 11));
  auto out = trainer.Train();
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("5"), std::string::npos) << out.status();
  EXPECT_NE(out.status().message().find("16"), std::string::npos) << out.status();
}

// Every engine of the oneof exists now; ZeRO from the arguments in one process trains as the
// local engine does (the multi-process equivalence is tests/distributed/zero_test.sh).
TEST(TrainerTest, ZeroEngineFromTheArgumentsTrainsLikeLocal) {
  std::vector<std::vector<double>> losses;
  for (const std::string engine : {"local", "zero"}) {
    auto model = TinyDecoder(7);
    proto::TrainingArguments args = BaseArgs("zero_" + engine);
    args.set_max_steps(3);
    args.set_per_device_train_batch_size(4);
    if (engine == "zero") args.mutable_zero()->set_stage(2);
    Trainer trainer(args, model, VariableLengthTokens(16, 12));
    ASSERT_TRUE(trainer.Train().ok());
    EXPECT_EQ(trainer.engine()->name(), engine == "zero" ? "zero2" : "local");
    losses.push_back(testing::StepLosses(trainer));
  }
  ASSERT_EQ(losses[0].size(), 3u);
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_NEAR(losses[1][i], losses[0][i], 1e-5);
}

}  // namespace
}  // namespace cpptrain
