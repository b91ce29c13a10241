// Rules on the loop, optimizer and scheduler fields of TrainingArguments. Sources: HF
// TrainingArguments.__post_init__ (v5), Trainer.__init__ (v4.5x), optimization.py and
// torch.utils.data.DataLoader / torch.optim.lr_scheduler.ReduceLROnPlateau.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/internal/validation.h"
#include "config/training_args.h"

namespace cpptrain {
namespace config_internal {

std::string Num(double value) { return absl::StrCat(value); }

std::string Bool(bool value) { return value ? "true" : "false"; }

std::string NumOrUnset(bool has, double value) { return has ? Num(value) : "<unset>"; }

namespace {

using proto::TrainingArguments;

std::string StrategyName(TrainingArguments::Strategy strategy) {
  return TrainingArguments::Strategy_Name(strategy);
}

std::string SchedulerName(TrainingArguments::SchedulerType type) {
  return TrainingArguments::SchedulerType_Name(type);
}

// A *_steps interval: a ratio in (0, 1) of max_steps or an integer count >= 1.
void CheckInterval(const std::string& name, double value, Problems* problems) {
  if (value < 0) {
    problems->push_back(absl::StrCat(name, "=", Num(value),
                                     " is negative; use a step count >= 1 or a ratio in (0, 1) "
                                     "of max_steps"));
  } else if (value > 1 && value != std::floor(value)) {
    problems->push_back(absl::StrCat(name, "=", Num(value),
                                     " must be an integer when bigger than 1; use a whole step "
                                     "count or a ratio in (0, 1) of max_steps"));
  }
}

// HF: with load_best_model_at_end and step strategies, saving must happen on evaluation
// steps. Ratios are compared at a 1e-6 resolution, as HF does.
void CheckSaveOnEvalSteps(const TrainingArguments& args, Problems* problems) {
  const double eval =
      args.has_eval_steps() && args.eval_steps() != 0 ? args.eval_steps() : args.logging_steps();
  const double save = args.save_steps();
  if (eval <= 0 || save <= 0) return;  // Reported by the zero / negative rules.
  const std::string seen =
      absl::StrCat(" (saw eval_steps=", Num(eval),
                   args.has_eval_steps() && args.eval_steps() != 0 ? "" : " from logging_steps",
                   ", save_steps=", Num(save), ")");
  if ((eval < 1) != (save < 1)) {
    problems->push_back(absl::StrCat(
        "load_best_model_at_end=true mixes a ratio (< 1) and an absolute step count in "
        "eval_steps and save_steps",
        seen, "; give both as ratios of max_steps or both as step counts"));
    return;
  }
  const int64_t kScale = 1000000;
  const int64_t eval_scaled = std::llround(eval * kScale);
  const int64_t save_scaled = std::llround(save * kScale);
  if (eval_scaled != 0 && save_scaled % eval_scaled != 0) {
    problems->push_back(absl::StrCat(
        "load_best_model_at_end=true requires save_steps to be a round multiple of eval_steps",
        seen, "; make save_steps a multiple of eval_steps"));
  }
}

// Hugging Face's report_to names many integrations; the ones built here, and "none" alone.
void CheckReportTo(const TrainingArguments& args, Problems* problems) {
  for (const std::string& entry : args.report_to()) {
    if (entry != "tensorboard" && entry != "all" && entry != "none") {
      problems->push_back(absl::StrCat(
          "report_to=\"", entry, "\" is not built here: use \"tensorboard\" (or \"all\", the same), "
          "\"none\", or read metrics.jsonl in output_dir"));
    }
    if (entry == "none" && args.report_to_size() > 1) {
      problems->push_back("report_to lists \"none\" with other integrations; give one or the other");
    }
  }
}

void CheckBestModel(const TrainingArguments& args, Problems* problems) {
  const TrainingArguments::Strategy save = args.save_strategy();
  const TrainingArguments::Strategy eval = args.eval_strategy();
  if (save == TrainingArguments::BEST &&
      (!args.has_metric_for_best_model() || args.metric_for_best_model().empty())) {
    problems->push_back(
        "save_strategy=BEST needs metric_for_best_model, which is unset; set it (e.g. "
        "metric_for_best_model: \"loss\") or use save_strategy STEPS or EPOCH");
  }
  if (save == TrainingArguments::BEST && eval == TrainingArguments::NO) {
    problems->push_back(
        "save_strategy=BEST saves when the evaluation metric improves, but eval_strategy=NO "
        "never evaluates; set eval_strategy to STEPS or EPOCH");
  }
  if (!args.load_best_model_at_end() || save == TrainingArguments::BEST) return;
  if (eval != save) {
    problems->push_back(absl::StrCat(
        "load_best_model_at_end=true requires eval_strategy and save_strategy to match "
        "(unless save_strategy=BEST); saw eval_strategy=",
        StrategyName(eval), ", save_strategy=", StrategyName(save),
        "; set both to the same strategy"));
  } else if (save == TrainingArguments::STEPS) {
    CheckSaveOnEvalSteps(args, problems);
  }
}

void CheckMinLrKwargs(const TrainingArguments& args, Problems* problems) {
  const proto::SchedulerKwargs& kw = args.lr_scheduler_kwargs();
  const std::string type = SchedulerName(args.lr_scheduler_type());
  if (kw.has_min_lr() == kw.has_min_lr_rate()) {
    problems->push_back(absl::StrCat(
        "lr_scheduler_type=", type,
        " needs exactly one of lr_scheduler_kwargs.min_lr and lr_scheduler_kwargs.min_lr_rate "
        "(saw min_lr=",
        NumOrUnset(kw.has_min_lr(), kw.min_lr()), ", min_lr_rate=",
        NumOrUnset(kw.has_min_lr_rate(), kw.min_lr_rate()), "); set one of them"));
  }
  if (kw.has_min_lr_rate() && (kw.min_lr_rate() < 0 || kw.min_lr_rate() > 1)) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.min_lr_rate=", Num(kw.min_lr_rate()),
                                     " is outside [0, 1]; it is a fraction of learning_rate"));
  }
  if (kw.has_warmup_lr_rate() && (kw.warmup_lr_rate() < 0 || kw.warmup_lr_rate() > 1)) {
    problems->push_back(
        absl::StrCat("lr_scheduler_kwargs.warmup_lr_rate=", Num(kw.warmup_lr_rate()),
                     " is outside [0, 1]; it is a fraction of learning_rate"));
  }
}

bool IsWsdShape(const std::string& name) {
  return name == "linear" || name == "cosine" || name == "1-sqrt";
}

void CheckWsdKwargs(const proto::SchedulerKwargs& kw, Problems* problems) {
  if (!IsWsdShape(kw.warmup_type())) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.warmup_type=\"", kw.warmup_type(),
                                     "\" is unknown; use linear, cosine or 1-sqrt"));
  }
  if (!IsWsdShape(kw.decay_type())) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.decay_type=\"", kw.decay_type(),
                                     "\" is unknown; use linear, cosine or 1-sqrt"));
  }
  if (kw.num_stable_steps() < 0) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.num_stable_steps=", kw.num_stable_steps(),
                                     " is negative; use a count >= 0"));
  }
  if (kw.num_decay_steps() < 0) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.num_decay_steps=", kw.num_decay_steps(),
                                     " is negative; use a count >= 0"));
  }
  if (kw.min_lr_ratio() < 0 || kw.min_lr_ratio() > 1) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.min_lr_ratio=", Num(kw.min_lr_ratio()),
                                     " is outside [0, 1]; it is a fraction of learning_rate"));
  }
}

void CheckPlateauKwargs(const proto::SchedulerKwargs& kw, Problems* problems) {
  if (kw.mode() != "min" && kw.mode() != "max") {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.mode=\"", kw.mode(),
                                     "\" is unknown; use \"min\" or \"max\""));
  }
  if (kw.threshold_mode() != "rel" && kw.threshold_mode() != "abs") {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.threshold_mode=\"", kw.threshold_mode(),
                                     "\" is unknown; use \"rel\" or \"abs\""));
  }
  if (!(kw.factor() > 0 && kw.factor() < 1)) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.factor=", Num(kw.factor()),
                                     " must lie in (0, 1); the learning rate is multiplied by "
                                     "it on a plateau"));
  }
  if (kw.patience() < 0) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.patience=", kw.patience(),
                                     " is negative; use a count of evaluations >= 0"));
  }
  if (kw.cooldown() < 0) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.cooldown=", kw.cooldown(),
                                     " is negative; use a count of evaluations >= 0"));
  }
  if (kw.has_min_lr() && kw.min_lr() < 0) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.min_lr=", Num(kw.min_lr()),
                                     " is negative; use a learning rate >= 0"));
  }
}

void CheckSchedulerKwargs(const TrainingArguments& args, Problems* problems) {
  const proto::SchedulerKwargs& kw = args.lr_scheduler_kwargs();
  switch (args.lr_scheduler_type()) {
    case TrainingArguments::COSINE_WITH_MIN_LR:
    case TrainingArguments::COSINE_WARMUP_WITH_MIN_LR:
      CheckMinLrKwargs(args, problems);
      break;
    case TrainingArguments::POLYNOMIAL:
      if (!(args.learning_rate() > kw.lr_end())) {
        problems->push_back(absl::StrCat(
            "lr_scheduler_type=POLYNOMIAL needs learning_rate > lr_scheduler_kwargs.lr_end "
            "(saw learning_rate=",
            Num(args.learning_rate()), ", lr_end=", Num(kw.lr_end()),
            "); lower lr_end or raise learning_rate"));
      }
      break;
    case TrainingArguments::INVERSE_SQRT:
      if (kw.has_timescale() && kw.timescale() <= 0) {
        problems->push_back(absl::StrCat("lr_scheduler_kwargs.timescale=", kw.timescale(),
                                         " must be positive; leave it unset for the default"));
      }
      break;
    case TrainingArguments::WARMUP_STABLE_DECAY:
      CheckWsdKwargs(kw, problems);
      break;
    case TrainingArguments::REDUCE_LR_ON_PLATEAU:
      CheckPlateauKwargs(kw, problems);
      break;
    default:
      break;
  }
  if (kw.has_num_cycles() && kw.num_cycles() < 0) {
    problems->push_back(absl::StrCat("lr_scheduler_kwargs.num_cycles=", Num(kw.num_cycles()),
                                     " is negative; use a number of cosine cycles >= 0"));
  }
}

}  // namespace

void CheckSteps(const TrainingArguments& args, Problems* problems) {
  const bool eval_steps_zero = !args.has_eval_steps() || args.eval_steps() == 0;
  if (args.eval_strategy() == TrainingArguments::STEPS && eval_steps_zero &&
      args.logging_steps() == 0) {
    problems->push_back(absl::StrCat(
        "eval_strategy=STEPS needs a non-zero eval_steps or logging_steps (saw eval_steps=",
        NumOrUnset(args.has_eval_steps(), args.eval_steps()),
        ", logging_steps=0); set eval_steps to a step count or a ratio in (0, 1)"));
  }
  if (args.logging_strategy() == TrainingArguments::STEPS && args.logging_steps() == 0) {
    problems->push_back(
        "logging_strategy=STEPS needs a non-zero logging_steps (saw logging_steps=0); set "
        "logging_steps or use logging_strategy NO or EPOCH");
  }
  if (args.save_strategy() == TrainingArguments::STEPS && args.save_steps() == 0) {
    problems->push_back(
        "save_strategy=STEPS needs a non-zero save_steps (saw save_steps=0); set save_steps "
        "or use save_strategy NO or EPOCH");
  }
  CheckInterval("logging_steps", args.logging_steps(), problems);
  if (args.has_eval_steps()) CheckInterval("eval_steps", args.eval_steps(), problems);
  CheckInterval("save_steps", args.save_steps(), problems);
  if (args.eval_delay() < 0) {
    problems->push_back(absl::StrCat("eval_delay=", Num(args.eval_delay()),
                                     " is negative; use a number of steps or epochs >= 0"));
  }
  if (args.warmup_steps() < 0) {
    problems->push_back(absl::StrCat("warmup_steps=", Num(args.warmup_steps()),
                                     " is negative; use a step count >= 1, a ratio in [0, 1) "
                                     "of the total steps, or 0 for no warm-up"));
  } else if (args.warmup_steps() >= 1 && args.warmup_steps() != std::floor(args.warmup_steps())) {
    problems->push_back(absl::StrCat("warmup_steps=", Num(args.warmup_steps()),
                                     " must be an integer when >= 1; use a whole step count or "
                                     "a ratio in [0, 1) of the total steps"));
  }
  if (args.eval_strategy() == TrainingArguments::BEST) {
    problems->push_back(
        "eval_strategy=BEST is only valid for save_strategy; use eval_strategy STEPS or EPOCH");
  }
  if (args.logging_strategy() == TrainingArguments::BEST) {
    problems->push_back(
        "logging_strategy=BEST is only valid for save_strategy; use logging_strategy STEPS or "
        "EPOCH");
  }
  if (args.lr_scheduler_type() == TrainingArguments::REDUCE_LR_ON_PLATEAU &&
      args.eval_strategy() == TrainingArguments::NO) {
    problems->push_back(
        "lr_scheduler_type=REDUCE_LR_ON_PLATEAU steps on evaluation metrics, but "
        "eval_strategy=NO never evaluates; set eval_strategy to STEPS or EPOCH");
  }
  CheckBestModel(args, problems);
  CheckReportTo(args, problems);
}

void CheckLoop(const TrainingArguments& args, Problems* problems) {
  if (args.per_device_train_batch_size() < 1) {
    problems->push_back(absl::StrCat(
        "per_device_train_batch_size=", args.per_device_train_batch_size(), " must be >= 1"));
  }
  if (args.per_device_eval_batch_size() < 1) {
    problems->push_back(absl::StrCat(
        "per_device_eval_batch_size=", args.per_device_eval_batch_size(), " must be >= 1"));
  }
  if (args.gradient_accumulation_steps() < 1) {
    problems->push_back(
        absl::StrCat("gradient_accumulation_steps=", args.gradient_accumulation_steps(),
                     " must be >= 1 (1: no accumulation)"));
  }
  const proto::GradientAccumulationKwargs& ga =
      args.accelerator_config().gradient_accumulation_kwargs();
  if (ga.has_num_steps() && ga.num_steps() < 1) {
    problems->push_back(absl::StrCat("accelerator_config.gradient_accumulation_kwargs.num_steps=",
                                     ga.num_steps(), " must be >= 1"));
  }
  const proto::AcceleratorConfig& accel = args.accelerator_config();
  if (accel.dispatch_batches()) {
    problems->push_back(
        "accelerator_config.dispatch_batches=true (rank 0 reads every batch and sends each rank "
        "its part) is not supported: every rank reads its own batches of the same dataset, "
        "which is what dispatch_batches=false does; unset it or set it to false");
  }
  if (!accel.use_seedable_sampler()) {
    problems->push_back(
        "accelerator_config.use_seedable_sampler=false is not supported: the sampler is always "
        "seeded with data_seed (or seed) + epoch, the same on every rank, as "
        "use_seedable_sampler=true; unset it");
  }
  if (ga.has_num_steps() && args.gradient_accumulation_steps() > 1) {
    problems->push_back(
        absl::StrCat("accelerator_config.gradient_accumulation_kwargs.num_steps=", ga.num_steps(),
                     " and gradient_accumulation_steps=", args.gradient_accumulation_steps(),
                     " are both set, so the intended setting is unknown; set only one of them"));
  }
  if (args.max_steps() == 0 || args.max_steps() < -1) {
    problems->push_back(absl::StrCat("max_steps=", args.max_steps(),
                                     " must be -1 (train num_train_epochs) or a positive count"));
  }
  if (args.max_steps() <= 0 && args.num_train_epochs() <= 0) {
    problems->push_back(absl::StrCat("num_train_epochs=", Num(args.num_train_epochs()),
                                     " with max_steps=", args.max_steps(),
                                     " trains nothing; set num_train_epochs > 0 or max_steps > 0"));
  }
  if (args.fp16() && args.bf16()) {
    problems->push_back("fp16=true and bf16=true: at most one of fp16 and bf16 can be true");
  }
  if (args.dataloader_num_workers() < 0) {
    problems->push_back(absl::StrCat("dataloader_num_workers=", args.dataloader_num_workers(),
                                     " is negative; use 0 (load in the main process) or more"));
  }
  if (args.has_dataloader_prefetch_factor() && args.dataloader_num_workers() == 0) {
    problems->push_back(absl::StrCat(
        "dataloader_prefetch_factor=", args.dataloader_prefetch_factor(),
        " can only be set when data is loaded in worker processes (saw "
        "dataloader_num_workers=0); set dataloader_num_workers > 0 or unset the factor"));
  }
  if (args.has_dataloader_prefetch_factor() && args.dataloader_prefetch_factor() < 1) {
    problems->push_back(
        absl::StrCat("dataloader_prefetch_factor=", args.dataloader_prefetch_factor(),
                     " must be >= 1 (batches prepared ahead per worker)"));
  }
  if (args.dataloader_persistent_workers() && args.dataloader_num_workers() == 0) {
    problems->push_back(
        "dataloader_persistent_workers=true keeps worker threads between epochs but there are "
        "none (saw "
        "dataloader_num_workers=0); set dataloader_num_workers > 0 or turn it off");
  }
  if (args.has_save_total_limit() && args.save_total_limit() < 1) {
    problems->push_back(absl::StrCat("save_total_limit=", args.save_total_limit(),
                                     " must be >= 1; leave it unset to keep every checkpoint"));
  }
  if (args.ddp_timeout() <= 0) {
    problems->push_back(absl::StrCat("ddp_timeout=", args.ddp_timeout(),
                                     " must be a positive number of seconds (default 1800)"));
  }
}

// optim, label smoothing and evaluation accumulation.
void CheckTrainerChoices(const TrainingArguments& args, Problems* problems) {
  const std::vector<std::string>& optimizers = SupportedOptimizers();
  if (std::find(optimizers.begin(), optimizers.end(), args.optim()) == optimizers.end()) {
    problems->push_back(absl::StrCat("optim=\"", args.optim(), "\" is not built here; use one of ",
                                     absl::StrJoin(optimizers, ", "),
                                     " (docs/HF_PARITY.md says what to use for the others)"));
  }
  if (!(args.label_smoothing_factor() >= 0 && args.label_smoothing_factor() < 1)) {
    problems->push_back(absl::StrCat("label_smoothing_factor=", Num(args.label_smoothing_factor()),
                                     " is outside [0, 1); use 0 (off) or e.g. 0.1"));
  }
  if (args.has_eval_accumulation_steps() && args.eval_accumulation_steps() < 1) {
    problems->push_back(absl::StrCat("eval_accumulation_steps=", args.eval_accumulation_steps(),
                                     " must be >= 1, or unset"));
  }
}

void CheckOptimizerAndScheduler(const TrainingArguments& args, Problems* problems) {
  if (args.learning_rate() < 0) {
    problems->push_back(absl::StrCat("learning_rate=", Num(args.learning_rate()),
                                     " is negative; use a learning rate >= 0"));
  }
  if (!(args.adam_beta1() >= 0 && args.adam_beta1() < 1)) {
    problems->push_back(
        absl::StrCat("adam_beta1=", Num(args.adam_beta1()), " is outside [0, 1) (default 0.9)"));
  }
  if (!(args.adam_beta2() >= 0 && args.adam_beta2() < 1)) {
    problems->push_back(
        absl::StrCat("adam_beta2=", Num(args.adam_beta2()), " is outside [0, 1) (default 0.999)"));
  }
  if (!(args.adam_epsilon() > 0)) {
    problems->push_back(absl::StrCat("adam_epsilon=", Num(args.adam_epsilon()),
                                     " must be positive (default 1e-8)"));
  }
  if (args.weight_decay() < 0) {
    problems->push_back(absl::StrCat("weight_decay=", Num(args.weight_decay()),
                                     " is negative; use 0 (off) or more"));
  }
  if (args.max_grad_norm() < 0) {
    problems->push_back(absl::StrCat("max_grad_norm=", Num(args.max_grad_norm()),
                                     " is negative; use 0 to turn clipping off"));
  }
  CheckSchedulerKwargs(args, problems);
  CheckTrainerChoices(args, problems);
}

}  // namespace config_internal
}  // namespace cpptrain
