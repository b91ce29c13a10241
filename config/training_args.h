// Loading and validating TrainingArguments and TrainJob configs, following the rules of
// Hugging Face TrainingArguments, Trainer and Accelerate, plus the resolution of fields whose
// default depends on other fields (eval_steps, metric_for_best_model, warm-up ratios, ...).
// Validation collects every violated rule, one line each naming the fields, the values seen
// and the fix, so a config is fixed in one round.
//
//   CT_ASSIGN_OR_RETURN(proto::TrainJob job,
//                       LoadTrainJob("run.textproto", {"args.learning_rate=3e-4"}));
//   CT_RETURN_IF_ERROR(ValidateForWorld(job.args(), world_size));
//   for (const std::string& w : TrainingArgumentsWarnings(job.args())) LOG(WARNING) << w;
//   int64_t eval_every = ResolveStepInterval(ResolvedEvalSteps(job.args()), max_steps);
#ifndef CPPTRAIN_CONFIG_TRAINING_ARGS_H_
#define CPPTRAIN_CONFIG_TRAINING_ARGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/job.pb.h"
#include "proto/training_args.pb.h"

namespace cpptrain {

// Reads a text-format TrainingArguments file (an empty path starts from the defaults),
// applies the "path.to.field=value" overrides (see ApplyOverride) and validates the result
// with ValidateTrainingArguments. World-size checks are left to ValidateForWorld.
absl::StatusOr<proto::TrainingArguments> LoadTrainingArguments(
    const std::string& path, const std::vector<std::string>& overrides);

// The same for a TrainJob file; override paths start at the job ("args.fsdp.version=1",
// "data.seq_len=256"). Validates with ValidateTrainJob.
// Both also take `fsdp` in Hugging Face's string form, by --set ("--set=args.fsdp=full_shard
// auto_wrap", "shard_grad_op offload", "hybrid_shard") and in the file (fsdp: "full_shard"): FSDP1 with that sharding_strategy, offload_params
// for "offload", TRANSFORMER_BASED_WRAP with "auto_wrap" and NO_WRAP without it.
absl::StatusOr<proto::TrainJob> LoadTrainJob(const std::string& path,
                                             const std::vector<std::string>& overrides);

// Checks every rule that needs no knowledge of the world size. Returns OK or one
// InvalidArgument error listing all violations, one per line.
absl::Status ValidateTrainingArguments(const proto::TrainingArguments& args);

// ValidateTrainingArguments on job.args(), plus the job-level rules: a model is named or
// given, training data is given (train_file or builtin), seq_len >= 1, and an evaluation
// strategy other than NO has evaluation data.
absl::Status ValidateTrainJob(const proto::TrainJob& job);

// Conditions Hugging Face only warns about (the run works, but likely not as intended).
std::vector<std::string> TrainingArgumentsWarnings(const proto::TrainingArguments& args);

// Checks that depend on the number of processes: split_batches needs batch sizes divisible
// by world_size; the FSDP mesh (dp_replicate_size x dp_shard_size) must cover world_size.
absl::Status ValidateForWorld(const proto::TrainingArguments& args, int world_size);

// The DDP engine's config: `ddp { ... }` with Hugging Face's flat ddp_find_unused_parameters,
// ddp_bucket_cap_mb and ddp_broadcast_buffers laid over it (validation refuses the two when
// they disagree). Also for the DDP that no engine means under several processes.
proto::DdpConfig ResolvedDdpConfig(const proto::TrainingArguments& args);

// eval_steps, or logging_steps when eval_steps is unset or 0 (still a ratio when < 1).
double ResolvedEvalSteps(const proto::TrainingArguments& args);

// The key under which the best-model metric is logged: metric_for_best_model ("loss" when
// unset) with an "eval_" prefix added when missing. "accuracy" -> "eval_accuracy".
std::string ResolvedMetricForBestModel(const proto::TrainingArguments& args);

// Whether report_to asks for `integration` ("tensorboard"), directly or through "all".
bool ReportsTo(const proto::TrainingArguments& args, const std::string& integration);

// logging_dir, or when unset output_dir/runs/<Mon DD_HH-MM-SS>_<host> (Hugging Face's
// default, the time being now).
std::string ResolvedLoggingDir(const proto::TrainingArguments& args);

// greater_is_better, or when unset: false for a metric whose name ends in "loss", else true.
bool ResolvedGreaterIsBetter(const proto::TrainingArguments& args);

// A *_steps value as a step count: values in (0, 1) are a ratio of max_steps, rounded up
// (HF TrainerState.compute_steps); other values are already counts.
int64_t ResolveStepInterval(double steps, int64_t max_steps);

// warmup_steps as a count: >= 1 is a count, [0, 1) is ceil(total_steps * ratio).
int64_t ResolveWarmupSteps(const proto::TrainingArguments& args, int64_t total_steps);

// data_seed, or seed when unset.
int64_t ResolvedDataSeed(const proto::TrainingArguments& args);

// run_name, or output_dir when unset or empty.
std::string ResolvedRunName(const proto::TrainingArguments& args);

// The optim names the Trainer builds (trainer/optimizer_choice.h), the default first.
const std::vector<std::string>& SupportedOptimizers();

// accelerator_config.gradient_accumulation_kwargs.num_steps when set, otherwise
// gradient_accumulation_steps.
int32_t ResolvedGradientAccumulationSteps(const proto::TrainingArguments& args);

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_TRAINING_ARGS_H_
