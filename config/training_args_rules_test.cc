// One test per validation rule of ValidateTrainingArguments: each builds a config that breaks
// the rule (and, where useful, a neighbouring one that does not) and checks that the error
// names the field and the value seen.
#include <string>

#include "config/text_proto.h"
#include "config/training_args.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cpptrain {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

proto::TrainingArguments Args(const std::string& text) {
  proto::TrainingArguments args;
  absl::Status status = ParseTextProto(text, "test", &args);
  EXPECT_TRUE(status.ok()) << status;
  return args;
}

// The validation error of `text`; fails the test when it validates.
std::string Problems(const std::string& text) {
  absl::Status status = ValidateTrainingArguments(Args(text));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << text;
  return std::string(status.message());
}

// The validation error of `text`, which must break exactly one rule.
std::string OneProblem(const std::string& text) {
  const std::string message = Problems(text);
  EXPECT_THAT(message, HasSubstr("(1 problem)")) << text;
  return message;
}

void ExpectValid(const std::string& text) {
  absl::Status status = ValidateTrainingArguments(Args(text));
  EXPECT_TRUE(status.ok()) << text << "\n" << status;
}

// ---------------------------------------------------------------------------------------
// Strategies and intervals.

TEST(StepsRulesTest, EvalStepsUnsetWithZeroLoggingSteps) {
  EXPECT_THAT(OneProblem("eval_strategy: STEPS logging_strategy: NO logging_steps: 0"),
              AllOf(HasSubstr("eval_strategy=STEPS"), HasSubstr("eval_steps=<unset>"),
                    HasSubstr("logging_steps=0")));
  EXPECT_THAT(OneProblem("eval_strategy: STEPS eval_steps: 0 logging_strategy: NO "
                         "logging_steps: 0"),
              AllOf(HasSubstr("eval_steps=0"), HasSubstr("logging_steps=0")));
}

TEST(StepsRulesTest, EvalStepsFallBackToLoggingSteps) {
  ExpectValid("eval_strategy: STEPS logging_steps: 50");
}

TEST(StepsRulesTest, LoggingStrategyStepsWithZeroLoggingSteps) {
  EXPECT_THAT(OneProblem("logging_steps: 0"),
              AllOf(HasSubstr("logging_strategy=STEPS"), HasSubstr("logging_steps=0")));
  ExpectValid("logging_strategy: EPOCH logging_steps: 0");
}

TEST(StepsRulesTest, SaveStrategyStepsWithZeroSaveSteps) {
  EXPECT_THAT(OneProblem("save_steps: 0"),
              AllOf(HasSubstr("save_strategy=STEPS"), HasSubstr("save_steps=0")));
}

TEST(StepsRulesTest, StepsAboveOneMustBeIntegers) {
  const std::string message = Problems("logging_steps: 10.5 eval_steps: 2.5 save_steps: 100.5");
  EXPECT_THAT(message, AllOf(HasSubstr("(3 problems)"), HasSubstr("logging_steps=10.5"),
                             HasSubstr("eval_steps=2.5"), HasSubstr("save_steps=100.5"),
                             HasSubstr("integer")));
}

TEST(StepsRulesTest, NegativeSteps) {
  const std::string message = Problems("logging_steps: -1 eval_steps: -0.5 save_steps: -10");
  EXPECT_THAT(message, AllOf(HasSubstr("(3 problems)"), HasSubstr("logging_steps=-1"),
                             HasSubstr("eval_steps=-0.5"), HasSubstr("save_steps=-10"),
                             HasSubstr("negative")));
}

TEST(StepsRulesTest, NegativeEvalDelay) {
  EXPECT_THAT(OneProblem("eval_delay: -3"), HasSubstr("eval_delay=-3"));
}

TEST(StepsRulesTest, NegativeWarmupSteps) {
  EXPECT_THAT(OneProblem("warmup_steps: -0.1"), HasSubstr("warmup_steps=-0.1"));
}

TEST(StepsRulesTest, FractionalWarmupCountMustBeInteger) {
  EXPECT_THAT(OneProblem("warmup_steps: 100.5"),
              AllOf(HasSubstr("warmup_steps=100.5"), HasSubstr("integer")));
  ExpectValid("warmup_steps: 100");
  ExpectValid("warmup_steps: 0.5");
}

TEST(StepsRulesTest, BestIsOnlyForSaveStrategy) {
  EXPECT_THAT(OneProblem("eval_strategy: BEST"), HasSubstr("eval_strategy=BEST"));
  EXPECT_THAT(OneProblem("logging_strategy: BEST"), HasSubstr("logging_strategy=BEST"));
}

TEST(StepsRulesTest, ReduceLrOnPlateauNeedsEvaluation) {
  EXPECT_THAT(OneProblem("lr_scheduler_type: REDUCE_LR_ON_PLATEAU"),
              AllOf(HasSubstr("REDUCE_LR_ON_PLATEAU"), HasSubstr("eval_strategy=NO")));
  ExpectValid("lr_scheduler_type: REDUCE_LR_ON_PLATEAU eval_strategy: EPOCH");
}

TEST(BestModelRulesTest, LoadBestNeedsMatchingStrategies) {
  EXPECT_THAT(OneProblem("load_best_model_at_end: true eval_strategy: EPOCH"),
              AllOf(HasSubstr("load_best_model_at_end=true"), HasSubstr("eval_strategy=EPOCH"),
                    HasSubstr("save_strategy=STEPS")));
}

TEST(BestModelRulesTest, LoadBestWithSaveBestNeedsNoMatch) {
  ExpectValid(R"pb(
    load_best_model_at_end: true
    eval_strategy: EPOCH
    save_strategy: BEST
    metric_for_best_model: "accuracy"
  )pb");
}

TEST(BestModelRulesTest, LoadBestAloneDefaultsMetricToLoss) {
  ExpectValid("load_best_model_at_end: true eval_strategy: STEPS eval_steps: 100");
}

TEST(BestModelRulesTest, SaveStepsMustBeMultipleOfEvalSteps) {
  EXPECT_THAT(
      OneProblem("load_best_model_at_end: true eval_strategy: STEPS eval_steps: 300 "
                 "save_steps: 500"),
      AllOf(HasSubstr("eval_steps=300"), HasSubstr("save_steps=500"), HasSubstr("round multiple")));
  ExpectValid("load_best_model_at_end: true eval_strategy: STEPS eval_steps: 250");
}

TEST(BestModelRulesTest, SaveStepsMultipleUsesLoggingStepsFallback) {
  EXPECT_THAT(OneProblem("load_best_model_at_end: true eval_strategy: STEPS logging_steps: 300"),
              AllOf(HasSubstr("eval_steps=300 from logging_steps"), HasSubstr("save_steps=500")));
}

TEST(BestModelRulesTest, RatioStepsMustBeMultiples) {
  ExpectValid(
      "load_best_model_at_end: true eval_strategy: STEPS eval_steps: 0.1 "
      "save_steps: 0.3");
  EXPECT_THAT(OneProblem("load_best_model_at_end: true eval_strategy: STEPS eval_steps: 0.1 "
                         "save_steps: 0.25"),
              AllOf(HasSubstr("eval_steps=0.1"), HasSubstr("save_steps=0.25")));
}

TEST(BestModelRulesTest, MixingRatioAndCountIsAnError) {
  EXPECT_THAT(
      OneProblem("load_best_model_at_end: true eval_strategy: STEPS eval_steps: 0.1 "
                 "save_steps: 500"),
      AllOf(HasSubstr("mixes a ratio"), HasSubstr("eval_steps=0.1"), HasSubstr("save_steps=500")));
}

TEST(BestModelRulesTest, SaveBestNeedsMetric) {
  EXPECT_THAT(OneProblem("save_strategy: BEST eval_strategy: STEPS"),
              AllOf(HasSubstr("save_strategy=BEST"), HasSubstr("metric_for_best_model")));
}

TEST(BestModelRulesTest, SaveBestNeedsEvaluation) {
  EXPECT_THAT(OneProblem("save_strategy: BEST metric_for_best_model: \"loss\""),
              AllOf(HasSubstr("save_strategy=BEST"), HasSubstr("eval_strategy=NO")));
}

// ---------------------------------------------------------------------------------------
// Loop, precision, data loader, checkpoints.

TEST(LoopRulesTest, BatchSizesMustBePositive) {
  EXPECT_THAT(OneProblem("per_device_train_batch_size: 0"),
              HasSubstr("per_device_train_batch_size=0"));
  EXPECT_THAT(OneProblem("per_device_eval_batch_size: -2"),
              HasSubstr("per_device_eval_batch_size=-2"));
}

TEST(LoopRulesTest, GradientAccumulationStepsMustBePositive) {
  EXPECT_THAT(OneProblem("gradient_accumulation_steps: 0"),
              HasSubstr("gradient_accumulation_steps=0"));
}

TEST(LoopRulesTest, GradientAccumulationKwargsNumStepsConflictsWithSteps) {
  EXPECT_THAT(OneProblem("gradient_accumulation_steps: 4 "
                         "accelerator_config { gradient_accumulation_kwargs { num_steps: 2 } }"),
              AllOf(HasSubstr("gradient_accumulation_kwargs.num_steps=2"),
                    HasSubstr("gradient_accumulation_steps=4")));
  ExpectValid("accelerator_config { gradient_accumulation_kwargs { num_steps: 2 } }");
}

TEST(LoopRulesTest, GradientAccumulationKwargsNumStepsMustBePositive) {
  EXPECT_THAT(OneProblem("accelerator_config { gradient_accumulation_kwargs { num_steps: 0 } }"),
              HasSubstr("gradient_accumulation_kwargs.num_steps=0"));
}

TEST(LoopRulesTest, MaxStepsZeroOrBelowMinusOne) {
  EXPECT_THAT(OneProblem("max_steps: 0"), HasSubstr("max_steps=0"));
  EXPECT_THAT(OneProblem("max_steps: -5"), HasSubstr("max_steps=-5"));
}

TEST(LoopRulesTest, NoEpochsAndNoMaxSteps) {
  EXPECT_THAT(OneProblem("num_train_epochs: 0"),
              AllOf(HasSubstr("num_train_epochs=0"), HasSubstr("max_steps=-1")));
  ExpectValid("num_train_epochs: 0 max_steps: 10");
}

TEST(LoopRulesTest, Fp16AndBf16AreExclusive) {
  EXPECT_THAT(OneProblem("fp16: true bf16: true"),
              AllOf(HasSubstr("fp16=true"), HasSubstr("bf16=true")));
}

TEST(LoopRulesTest, NegativeDataLoaderWorkers) {
  EXPECT_THAT(OneProblem("dataloader_num_workers: -1"), HasSubstr("dataloader_num_workers=-1"));
}

TEST(LoopRulesTest, PrefetchFactorNeedsWorkers) {
  EXPECT_THAT(
      OneProblem("dataloader_prefetch_factor: 2"),
      AllOf(HasSubstr("dataloader_prefetch_factor=2"), HasSubstr("dataloader_num_workers=0")));
  ExpectValid("dataloader_prefetch_factor: 2 dataloader_num_workers: 1");
}

TEST(LoopRulesTest, PrefetchFactorMustBePositive) {
  EXPECT_THAT(OneProblem("dataloader_prefetch_factor: 0 dataloader_num_workers: 2"),
              HasSubstr("dataloader_prefetch_factor=0"));
}

TEST(LoopRulesTest, PersistentWorkersNeedWorkers) {
  EXPECT_THAT(OneProblem("dataloader_persistent_workers: true"),
              AllOf(HasSubstr("dataloader_persistent_workers=true"),
                    HasSubstr("dataloader_num_workers=0")));
}

TEST(LoopRulesTest, ReportToNamesOnlyWhatIsBuilt) {
  EXPECT_THAT(OneProblem("report_to: \"wandb\""),
              AllOf(HasSubstr("report_to=\"wandb\" is not built"), HasSubstr("tensorboard")));
  EXPECT_THAT(OneProblem("report_to: [\"none\", \"tensorboard\"]"),
              HasSubstr("\"none\" with other integrations"));
  ExpectValid("report_to: \"tensorboard\"");
  ExpectValid("report_to: [\"all\"]");
  ExpectValid("report_to: \"none\"");
}

TEST(OptimizerRulesTest, OptimNamesOnlyWhatIsBuilt) {
  EXPECT_THAT(OneProblem("optim: \"adafactor\""),
              AllOf(HasSubstr("optim=\"adafactor\" is not built"),
                    HasSubstr("adamw_torch_fused, adamw_torch, sgd")));
  ExpectValid("optim: \"adamw_torch\"");
  ExpectValid("optim: \"sgd\"");
  ExpectValid("");  // the default, adamw_torch_fused
}

TEST(OptimizerRulesTest, LabelSmoothingFactorIsAProbability) {
  EXPECT_THAT(OneProblem("label_smoothing_factor: 1"),
              HasSubstr("label_smoothing_factor=1 is outside [0, 1)"));
  EXPECT_THAT(OneProblem("label_smoothing_factor: -0.1"), HasSubstr("label_smoothing_factor=-0.1"));
  ExpectValid("label_smoothing_factor: 0.1");
}

TEST(LoopRulesTest, EvalAccumulationStepsIsPositive) {
  EXPECT_THAT(OneProblem("eval_accumulation_steps: 0"),
              HasSubstr("eval_accumulation_steps=0 must be >= 1"));
  ExpectValid(
      "eval_accumulation_steps: 4 group_by_length: true run_name: \"a\" "
      "overwrite_output_dir: true");
}

TEST(LoopRulesTest, UseCpuConflictsWithACudaLocalDevice) {
  EXPECT_THAT(OneProblem("use_cpu: true local { device: \"cuda:0\" }"),
              AllOf(HasSubstr("use_cpu=true"), HasSubstr("local.device=\"cuda:0\"")));
  ExpectValid("use_cpu: true local {}");
}

TEST(LoopRulesTest, AcceleratorOptionsThatAreNotBuiltAreRefused) {
  EXPECT_THAT(OneProblem("accelerator_config { dispatch_batches: true }"),
              AllOf(HasSubstr("dispatch_batches=true"), HasSubstr("set it to false")));
  EXPECT_THAT(OneProblem("accelerator_config { use_seedable_sampler: false }"),
              AllOf(HasSubstr("use_seedable_sampler=false"), HasSubstr("unset it")));
  ExpectValid("accelerator_config { dispatch_batches: false use_seedable_sampler: true }");
}

TEST(LoopRulesTest, SaveTotalLimitMustBePositiveWhenSet) {
  EXPECT_THAT(OneProblem("save_total_limit: 0"), HasSubstr("save_total_limit=0"));
}

TEST(LoopRulesTest, DdpTimeoutMustBePositive) {
  EXPECT_THAT(OneProblem("ddp_timeout: 0"), HasSubstr("ddp_timeout=0"));
}

// ---------------------------------------------------------------------------------------
// Optimizer and scheduler.

TEST(OptimizerRulesTest, NegativeLearningRate) {
  EXPECT_THAT(OneProblem("learning_rate: -0.001"), HasSubstr("learning_rate=-0.001"));
}

TEST(OptimizerRulesTest, AdamBetasInUnitInterval) {
  const std::string message = Problems("adam_beta1: 1 adam_beta2: -0.1");
  EXPECT_THAT(message, AllOf(HasSubstr("(2 problems)"), HasSubstr("adam_beta1=1"),
                             HasSubstr("adam_beta2=-0.1")));
  ExpectValid("adam_beta1: 0 adam_beta2: 0.99");
}

TEST(OptimizerRulesTest, AdamEpsilonMustBePositive) {
  EXPECT_THAT(OneProblem("adam_epsilon: 0"), HasSubstr("adam_epsilon=0"));
}

TEST(OptimizerRulesTest, NegativeMaxGradNorm) {
  EXPECT_THAT(OneProblem("max_grad_norm: -1"), HasSubstr("max_grad_norm=-1"));
}

TEST(OptimizerRulesTest, NegativeWeightDecay) {
  EXPECT_THAT(OneProblem("weight_decay: -0.1"), HasSubstr("weight_decay=-0.1"));
}

TEST(SchedulerRulesTest, CosineWithMinLrNeedsOneOfMinLrAndRate) {
  EXPECT_THAT(OneProblem("lr_scheduler_type: COSINE_WITH_MIN_LR"),
              AllOf(HasSubstr("COSINE_WITH_MIN_LR"), HasSubstr("min_lr=<unset>"),
                    HasSubstr("min_lr_rate=<unset>")));
  EXPECT_THAT(OneProblem("lr_scheduler_type: COSINE_WARMUP_WITH_MIN_LR "
                         "lr_scheduler_kwargs { min_lr: 1e-5 min_lr_rate: 0.1 }"),
              AllOf(HasSubstr("COSINE_WARMUP_WITH_MIN_LR"), HasSubstr("min_lr=1e-05"),
                    HasSubstr("min_lr_rate=0.1")));
  ExpectValid("lr_scheduler_type: COSINE_WITH_MIN_LR lr_scheduler_kwargs { min_lr: 1e-6 }");
}

TEST(SchedulerRulesTest, MinLrRateInUnitInterval) {
  EXPECT_THAT(OneProblem("lr_scheduler_type: COSINE_WITH_MIN_LR "
                         "lr_scheduler_kwargs { min_lr_rate: 1.5 }"),
              HasSubstr("min_lr_rate=1.5"));
}

TEST(SchedulerRulesTest, PolynomialNeedsLearningRateAboveLrEnd) {
  EXPECT_THAT(OneProblem("lr_scheduler_type: POLYNOMIAL learning_rate: 1e-7"),
              AllOf(HasSubstr("learning_rate=1e-07"), HasSubstr("lr_end=1e-07")));
  ExpectValid("lr_scheduler_type: POLYNOMIAL");
}

TEST(SchedulerRulesTest, WarmupStableDecayShapes) {
  const std::string message = Problems(
      "lr_scheduler_type: WARMUP_STABLE_DECAY "
      "lr_scheduler_kwargs { warmup_type: \"exp\" decay_type: \"step\" }");
  EXPECT_THAT(message, AllOf(HasSubstr("(2 problems)"), HasSubstr("warmup_type=\"exp\""),
                             HasSubstr("decay_type=\"step\""), HasSubstr("1-sqrt")));
}

TEST(SchedulerRulesTest, WarmupStableDecayNegativeSteps) {
  const std::string message = Problems(
      "lr_scheduler_type: WARMUP_STABLE_DECAY "
      "lr_scheduler_kwargs { num_stable_steps: -1 num_decay_steps: -2 }");
  EXPECT_THAT(message, AllOf(HasSubstr("(2 problems)"), HasSubstr("num_stable_steps=-1"),
                             HasSubstr("num_decay_steps=-2")));
}

TEST(SchedulerRulesTest, ReduceLrOnPlateauKwargs) {
  const std::string message = Problems(
      "lr_scheduler_type: REDUCE_LR_ON_PLATEAU eval_strategy: EPOCH "
      "lr_scheduler_kwargs { mode: \"up\" threshold_mode: \"relative\" factor: 1.5 }");
  EXPECT_THAT(message, AllOf(HasSubstr("(3 problems)"), HasSubstr("mode=\"up\""),
                             HasSubstr("threshold_mode=\"relative\""), HasSubstr("factor=1.5")));
  EXPECT_THAT(OneProblem("lr_scheduler_type: REDUCE_LR_ON_PLATEAU eval_strategy: EPOCH "
                         "lr_scheduler_kwargs { factor: 0 }"),
              HasSubstr("factor=0"));
}

TEST(SchedulerRulesTest, InverseSqrtTimescaleMustBePositive) {
  EXPECT_THAT(OneProblem("lr_scheduler_type: INVERSE_SQRT lr_scheduler_kwargs { timescale: 0 }"),
              HasSubstr("timescale=0"));
}

TEST(SchedulerRulesTest, KwargsOfOtherSchedulersAreIgnored) {
  ExpectValid("lr_scheduler_type: LINEAR lr_scheduler_kwargs { mode: \"up\" }");
}

// ---------------------------------------------------------------------------------------
// Engines.

TEST(FsdpRulesTest, OffloadNeedsSharding) {
  EXPECT_THAT(OneProblem("fsdp { version: 1 sharding_strategy: NO_SHARD offload_params: true }"),
              AllOf(HasSubstr("offload_params=true"), HasSubstr("NO_SHARD")));
  ExpectValid("fsdp { version: 1 sharding_strategy: SHARD_GRAD_OP offload_params: true }");
}

TEST(FsdpRulesTest, MinNumParamsExcludesLayerClasses) {
  EXPECT_THAT(OneProblem("fsdp { auto_wrap_policy: SIZE_BASED_WRAP min_num_params: 1000 "
                         "transformer_layer_cls_to_wrap: \"DecoderLayer\" }"),
              AllOf(HasSubstr("min_num_params=1000"), HasSubstr("DecoderLayer"),
                    HasSubstr("mutually exclusive")));
}

TEST(FsdpRulesTest, MinNumParamsNeedsSizeBasedWrap) {
  EXPECT_THAT(OneProblem("fsdp { min_num_params: 1000 }"),
              AllOf(HasSubstr("min_num_params=1000"), HasSubstr("TRANSFORMER_BASED_WRAP"),
                    HasSubstr("SIZE_BASED_WRAP")));
  ExpectValid("fsdp { auto_wrap_policy: SIZE_BASED_WRAP min_num_params: 1000 }");
}

TEST(FsdpRulesTest, NegativeMinNumParams) {
  EXPECT_THAT(OneProblem("fsdp { min_num_params: -1 }"), HasSubstr("min_num_params=-1"));
}

TEST(FsdpRulesTest, CpuRamEfficientLoadingNeedsSyncModuleStates) {
  EXPECT_THAT(OneProblem("fsdp { version: 2 sync_module_states: false "
                         "cpu_ram_efficient_loading: true }"),
              AllOf(HasSubstr("cpu_ram_efficient_loading=true"), HasSubstr("sync_module_states")));
}

// FSDP2 reads each rank's own rows whatever the flag says; FSDP1 with the flag and ZeRO-3 with
// zero3_init_flag read each rank's own flat pieces (jobs/job_model.h); DeepSpeed ignores
// zero3_init_flag below stage 3.
TEST(FsdpRulesTest, EfficientLoadingIsAcceptedByEveryShardedEngine) {
  ExpectValid("fsdp { version: 2 cpu_ram_efficient_loading: true }");
  ExpectValid("fsdp { version: 1 cpu_ram_efficient_loading: true }");
  ExpectValid("zero { stage: 3 zero3_init_flag: true }");
  ExpectValid("zero { stage: 2 zero3_init_flag: true }");
  EXPECT_THAT(OneProblem("fsdp { version: 1 sync_module_states: false "
                         "cpu_ram_efficient_loading: true }"),
              AllOf(HasSubstr("cpu_ram_efficient_loading=true"), HasSubstr("sync_module_states")));
}

TEST(FsdpRulesTest, VersionMustBeOneOrTwo) {
  EXPECT_THAT(OneProblem("fsdp { version: 3 }"), HasSubstr("fsdp.version=3"));
}

TEST(FsdpRulesTest, Version2RejectsShardingStrategy) {
  EXPECT_THAT(OneProblem("fsdp { version: 2 sharding_strategy: SHARD_GRAD_OP }"),
              AllOf(HasSubstr("sharding_strategy=SHARD_GRAD_OP"), HasSubstr("version=2"),
                    HasSubstr("reshard_after_forward"), HasSubstr("dp_replicate_size")));
}

TEST(FsdpRulesTest, Version1RejectsReshardAfterForward) {
  EXPECT_THAT(OneProblem("fsdp { version: 1 reshard_after_forward: false }"),
              AllOf(HasSubstr("reshard_after_forward=false"), HasSubstr("version=1"),
                    HasSubstr("sharding_strategy")));
}

TEST(FsdpRulesTest, Version2RejectsForwardPrefetch) {
  EXPECT_THAT(OneProblem("fsdp { forward_prefetch: true }"),
              AllOf(HasSubstr("forward_prefetch=true"), HasSubstr("version=2")));
  ExpectValid("fsdp { version: 1 forward_prefetch: true }");
}

TEST(FsdpRulesTest, Version2RejectsLocalStateDict) {
  EXPECT_THAT(OneProblem("fsdp { state_dict_type: LOCAL_STATE_DICT }"),
              AllOf(HasSubstr("LOCAL_STATE_DICT"), HasSubstr("version=2")));
}

TEST(FsdpRulesTest, Version1StrategiesAndMesh) {
  ExpectValid("fsdp { version: 1 sharding_strategy: HYBRID_SHARD dp_replicate_size: 2 }");
  ExpectValid("fsdp { version: 1 sharding_strategy: HYBRID_SHARD_ZERO2 dp_replicate_size: 2 }");
  ExpectValid("fsdp { version: 1 sharding_strategy: NO_SHARD backward_prefetch: BACKWARD_POST }");
  EXPECT_THAT(
      OneProblem("fsdp { version: 1 sharding_strategy: FULL_SHARD dp_replicate_size: 2 }"),
      AllOf(HasSubstr("dp_replicate_size=2"), HasSubstr("FULL_SHARD"), HasSubstr("HYBRID_SHARD")));
  EXPECT_THAT(OneProblem("fsdp { version: 1 sharding_strategy: NO_SHARD dp_shard_size: 2 }"),
              AllOf(HasSubstr("dp_shard_size=2"), HasSubstr("NO_SHARD")));
}

TEST(FsdpRulesTest, Version1Keys) {
  EXPECT_THAT(OneProblem("fsdp { version: 1 use_orig_params: false }"),
              AllOf(HasSubstr("use_orig_params=false"), HasSubstr("use_orig_params=true")));
  EXPECT_THAT(OneProblem("fsdp { version: 1 output_dtype: BF16 }"),
              AllOf(HasSubstr("output_dtype=BF16"), HasSubstr("FSDP2-only")));
  EXPECT_THAT(OneProblem("fsdp { version: 1 state_dict_type: LOCAL_STATE_DICT }"),
              AllOf(HasSubstr("LOCAL_STATE_DICT"), HasSubstr("version=1")));
  EXPECT_THAT(OneProblem("fsdp { version: 2 buffer_dtype: BF16 }"),
              AllOf(HasSubstr("buffer_dtype=BF16"), HasSubstr("FSDP1-only")));
  ExpectValid("fsdp { version: 1 buffer_dtype: BF16 param_dtype: BF16 reduce_dtype: FP32 }");
}

TEST(FsdpRulesTest, ActivationCheckpointingExcludesGradientCheckpointing) {
  EXPECT_THAT(OneProblem("gradient_checkpointing: true fsdp { activation_checkpointing: true }"),
              AllOf(HasSubstr("fsdp.activation_checkpointing=true"),
                    HasSubstr("gradient_checkpointing=true")));
}

TEST(FsdpRulesTest, SaveOnlyModelWithLoadBest) {
  EXPECT_THAT(OneProblem("save_only_model: true load_best_model_at_end: true "
                         "eval_strategy: STEPS fsdp {}"),
              AllOf(HasSubstr("FSDP"), HasSubstr("save_only_model=true"),
                    HasSubstr("load_best_model_at_end=true")));
  ExpectValid("save_only_model: true load_best_model_at_end: true eval_strategy: STEPS");
}

TEST(FsdpRulesTest, SaveOnlyModelWithExplicitShardedStateDict) {
  EXPECT_THAT(OneProblem("save_only_model: true fsdp { state_dict_type: SHARDED_STATE_DICT }"),
              AllOf(HasSubstr("save_only_model=true"), HasSubstr("SHARDED_STATE_DICT")));
  ExpectValid("save_only_model: true fsdp {}");
  ExpectValid("save_only_model: true fsdp { state_dict_type: FULL_STATE_DICT }");
}

TEST(FsdpRulesTest, MeshSizes) {
  const std::string message = Problems("fsdp { dp_replicate_size: 0 dp_shard_size: -1 }");
  EXPECT_THAT(message, AllOf(HasSubstr("(2 problems)"), HasSubstr("dp_replicate_size=0"),
                             HasSubstr("dp_shard_size=-1")));
}

TEST(ZeroRulesTest, StageMustBeOneTwoOrThree) {
  EXPECT_THAT(OneProblem("zero { stage: 0 }"), HasSubstr("zero.stage=0"));
  EXPECT_THAT(OneProblem("zero { stage: 4 }"), HasSubstr("zero.stage=4"));
  ExpectValid("zero { stage: 3 }");
}

TEST(ZeroRulesTest, Stage3ExcludesAutoFindBatchSize) {
  EXPECT_THAT(OneProblem("auto_find_batch_size: true zero { stage: 3 }"),
              AllOf(HasSubstr("auto_find_batch_size=true"), HasSubstr("zero.stage=3")));
}

TEST(ZeroRulesTest, ParamOffloadNeedsStage3) {
  EXPECT_THAT(OneProblem("zero { stage: 2 offload_param_device: CPU }"),
              AllOf(HasSubstr("offload_param_device=CPU"), HasSubstr("stage 2")));
  ExpectValid("zero { stage: 3 offload_param_device: CPU }");
}

TEST(ZeroRulesTest, BucketSizesMustBePositive) {
  const std::string message = Problems("zero { reduce_bucket_size: 0 allgather_bucket_size: -1 }");
  EXPECT_THAT(message,
              AllOf(HasSubstr("reduce_bucket_size=0"), HasSubstr("allgather_bucket_size=-1")));
}

TEST(ZeroRulesTest, SaveOnlyModelWithLoadBest) {
  EXPECT_THAT(OneProblem("save_only_model: true load_best_model_at_end: true "
                         "eval_strategy: STEPS zero {}"),
              AllOf(HasSubstr("ZeRO"), HasSubstr("save_only_model=true")));
}

TEST(DdpRulesTest, BucketCapMustBePositive) {
  EXPECT_THAT(OneProblem("ddp { bucket_cap_mb: 0 }"), HasSubstr("ddp.bucket_cap_mb=0"));
}

TEST(LocalRulesTest, DeviceMustBeKnown) {
  EXPECT_THAT(OneProblem("local { device: \"gpu0\" }"), HasSubstr("local.device=\"gpu0\""));
  ExpectValid("local { device: \"cuda:1\" }");
  ExpectValid("local { device: \"cpu\" }");
}

}  // namespace
}  // namespace cpptrain
