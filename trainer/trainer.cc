#include "trainer/trainer.h"

#include <csignal>
#include <cstdlib>
#include <cstring>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <utility>
#include <vector>

#include <torch/nn/modules/embedding.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/clock.h"
#include "base/cuda_graph.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "config/training_args.h"
#include "engines/engine_factory.h"
#include "engines/grad_utils.h"
#include "engines/step_capture.h"
#include "trainer/data/data_loader.h"
#include "trainer/internal/step_graph.h"
#include "trainer/label_smoothing.h"
#include "trainer/metrics_log.h"
#include "trainer/optimizer.h"
#include "trainer/optimizer_choice.h"
#include "trainer/output_dir_lock.h"
#include "trainer/stop_signals.h"
#include "trainer/tensorboard.h"

namespace cpptrain {
namespace {

// model.NonEmbeddingParameters(), or the registered parameters outside embedding tables.
int64_t NonEmbeddingParameters(TrainableModel& model) {
  const int64_t declared = model.NonEmbeddingParameters();
  if (declared >= 0) return declared;
  int64_t count = 0;
  for (const auto& item : model.named_parameters()) count += item.value().numel();
  for (const auto& module : model.modules()) {
    if (dynamic_cast<const torch::nn::EmbeddingImpl*>(module.get()) == nullptr) continue;
    for (const auto& param : module->parameters(/*recurse=*/false)) count -= param.numel();
  }
  return count;
}

bool IsOutOfMemory(const absl::Status& status) {
  return absl::StrContains(status.message(), "out of memory");
}

// Fault injection for tests: CPPTRAIN_TEST_OOM_AT_STEP=<rank>:<step> fails that rank's optimizer
// step <step> (the global step before it, from 0) once, as a CUDA allocation that runs out of
// memory would.
absl::Status InjectedOutOfMemory(int rank, int64_t step) {
  static bool fired = false;
  const char* spec = std::getenv("CPPTRAIN_TEST_OOM_AT_STEP");
  if (spec == nullptr || fired) return absl::OkStatus();
  int at_rank = -1;
  int64_t at_step = -1;
  const std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &at_rank) ||
      !absl::SimpleAtoi(parts[1], &at_step) || at_rank != rank || at_step != step) {
    return absl::OkStatus();
  }
  fired = true;
  return absl::ResourceExhaustedError(
      absl::StrCat("CUDA out of memory (injected by CPPTRAIN_TEST_OOM_AT_STEP=", spec, ")"));
}

// With cuda_graphs, eager steps of one shape before the step is captured: the first builds the
// optimizer's state and the libraries' plans and workspaces, the second runs as later steps do.
constexpr int64_t kCudaGraphWarmupSteps = 2;

}  // namespace

Trainer::Trainer(proto::TrainingArguments args, std::shared_ptr<TrainableModel> model,
                 std::shared_ptr<const Dataset> train_dataset,
                 std::shared_ptr<const Dataset> eval_dataset, std::unique_ptr<Engine> engine)
    : args_(std::move(args)),
      model_(std::move(model)),
      train_dataset_(std::move(train_dataset)),
      eval_dataset_(std::move(eval_dataset)),
      engine_(std::move(engine)) {
  if (model_ != nullptr) model_->SetFusedKernels(args_.fused_kernels());
  callbacks_.Add(std::make_shared<DefaultFlowCallback>());
  callbacks_.Add(std::make_shared<ProgressCallback>());
  callbacks_.Add(std::make_shared<MetricsLogCallback>(
      (std::filesystem::path(args_.output_dir()) / "metrics.jsonl").string()));
  if (ReportsTo(args_, "tensorboard")) {
    callbacks_.Add(std::make_shared<TensorBoardCallback>(ResolvedLoggingDir(args_)));
  }
}

Trainer::~Trainer() = default;

void Trainer::AddCallback(std::shared_ptr<TrainerCallback> callback) {
  callbacks_.Add(std::move(callback));
}

CallbackContext Trainer::Context() {
  return CallbackContext{args_, state_, control_, model_.get(),
                         engine_ != nullptr ? engine_->optimizer() : nullptr};
}

absl::Status Trainer::EnsureEngine() {
  if (model_ == nullptr) {
    return absl::InvalidArgumentError("the Trainer was given no model: pass a TrainableModel");
  }
  CT_RETURN_IF_ERROR(ValidateTrainingArguments(args_));
  if (engine_ == nullptr) {
    CT_ASSIGN_OR_RETURN(engine_, CreateEngine(args_, model_.get()));
  }
  CT_RETURN_IF_ERROR(ValidateForWorld(args_, engine_->world_size()));
  state_.is_world_process_zero = engine_->rank() == 0;
  if (output_dir_made_) return absl::OkStatus();
  absl::Status made = absl::OkStatus();
  if (state_.is_world_process_zero) {
    std::error_code error;
    std::filesystem::create_directories(args_.output_dir(), error);
    if (error) {
      made = absl::InvalidArgumentError(absl::StrCat("output_dir \"", args_.output_dir(),
                                                     "\" cannot be created: ", error.message(),
                                                     "; choose a writable directory"));
    }
  }
  // Rank 0 returning alone would leave the others in the preflight's gather.
  CT_RETURN_IF_ERROR(AllRanksOk(made));
  output_dir_made_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<DataLoader>> Trainer::MakeLoader(
    std::shared_ptr<const Dataset> dataset, bool train, int64_t batch_size) const {
  const proto::AcceleratorConfig& accel = args_.accelerator_config();
  DataLoaderOptions options;
  options.batch_size = batch_size;
  options.shuffle = train;
  options.seed = static_cast<uint64_t>(ResolvedDataSeed(args_));
  options.drop_last = train && args_.dataloader_drop_last();
  options.num_workers = args_.dataloader_num_workers();
  options.persistent_workers = args_.dataloader_persistent_workers();
  if (args_.has_dataloader_prefetch_factor()) {
    options.prefetch_factor = args_.dataloader_prefetch_factor();
  }
  options.pin_memory = args_.dataloader_pin_memory() && engine_->device().is_cuda();
  options.rank = engine_->rank();
  options.world_size = engine_->world_size();
  options.even_batches = accel.even_batches();
  options.split_batches = accel.split_batches();
  options.pad_token_id = pad_token_id_;
  options.data_collator = data_collator_;
  if (train && args_.group_by_length()) {
    // Hugging Face's LengthGroupedSampler: megabatches of per-device batch x accumulation.
    options.group_batch_size = batch_size * ResolvedGradientAccumulationSteps(args_);
    CT_RETURN_IF_ERROR(CatchTorch([&] {
      for (int64_t i = 0; i < dataset->size(); ++i) {
        options.group_lengths.push_back(dataset->Get(i).inputs.size(0));
      }
    }));
  }
  return DataLoader::Create(std::move(dataset), options);
}

torch::Tensor Trainer::ComputeLoss(TrainableModel& model, const Batch& batch,
                                   int64_t num_items_in_batch) {
  const double n = static_cast<double>(num_items_in_batch);
  const double smoothing = args_.label_smoothing_factor();
  if (!compute_loss_func_ && smoothing == 0 && !capture_logits_) {
    return model.ForwardLossSum(batch) / n;
  }
  torch::Tensor logits = model.Forward(batch);
  if (capture_logits_) captured_logits_ = logits;
  if (compute_loss_func_) return compute_loss_func_(logits, batch, num_items_in_batch);
  if (smoothing > 0) return LabelSmoothedLossSum(logits, batch.labels, smoothing) / n;
  return model.LossSum(logits, batch) / n;
}

absl::StatusOr<torch::Tensor> Trainer::TrainingStep(const Batch& batch,
                                                    int64_t num_items_in_batch) {
  torch::Tensor loss;
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    std::unique_ptr<ForwardScope> scope = engine_->EnterForward();
    loss = ComputeLoss(*model_, batch, num_items_in_batch);
  }));
  CT_RETURN_IF_ERROR(engine_->Backward(loss));
  return loss.detach().to(torch::kFloat64);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> Trainer::CreateOptimizer(
    const NamedParameters& params) {
  CT_ASSIGN_OR_RETURN(OptimizerFactory factory, MakeOptimizerFactory(args_));
  return factory(params);
}

absl::StatusOr<std::unique_ptr<LrSchedule>> Trainer::CreateScheduler(int64_t total_steps) {
  return LrSchedule::Create(args_, total_steps);
}

void Trainer::Log(Metrics logs) {
  logs["epoch"] = state_.epoch;
  logs["step"] = static_cast<double>(state_.global_step);
  state_.log_history.push_back(logs);
  callbacks_.Log(Context(), logs);
}

absl::StatusOr<TrainOutput> Trainer::Train(const std::string& resume_from_checkpoint) {
  args_.set_resume_from_checkpoint(resume_from_checkpoint);
  return Train();
}

absl::StatusOr<TrainOutput> Trainer::Train() {
  CT_RETURN_IF_ERROR(EnsureEngine());
  if (train_dataset_ == nullptr) {
    return absl::InvalidArgumentError("Train() needs a train dataset: pass one to the Trainer");
  }
  if (args_.eval_strategy() != proto::TrainingArguments::NO && eval_dataset_ == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "eval_strategy is ", proto::TrainingArguments::Strategy_Name(args_.eval_strategy()),
        " but the Trainer has no eval dataset: pass one, or set eval_strategy: NO"));
  }
  CT_ASSIGN_OR_RETURN(const absl::Duration stop_grace, StopGraceFromEnvironment());
  // The preflight only probes output_dir (writable, free space) and leaves nothing there.
  CT_RETURN_IF_ERROR(Preflight());
  // Before anything is written to output_dir (checkpoints removed, metrics, saves): one job at
  // a time (rank 0 holds the lock until Train returns, on every path; the kernel drops it if
  // the process dies).
  std::unique_ptr<OutputDirLock> output_lock;
  {
    absl::Status locked = absl::OkStatus();
    if (engine_->rank() == 0) {
      absl::StatusOr<std::unique_ptr<OutputDirLock>> taken =
          OutputDirLock::Acquire(args_.output_dir());
      if (taken.ok()) output_lock = *std::move(taken);
      locked = taken.status();
    }
    CT_RETURN_IF_ERROR(AllRanksOk(locked));
  }
  CT_RETURN_IF_ERROR(PrepareOutputDir());
  // SIGTERM/SIGINT from here on end training at a step boundary with a checkpoint, or end the
  // process stop_grace later if the step or the save is stuck.
  StopSignals stop_signals(stop_grace);
  stop_signal_ = 0;
  stopped_by_signal_ = 0;
  int64_t batch_size = args_.per_device_train_batch_size();
  while (true) {
    absl::StatusOr<TrainOutput> out = InnerTrainingLoop(batch_size);
    if (out.ok() || !args_.auto_find_batch_size() || !IsOutOfMemory(out.status()) ||
        batch_size == 1) {
      return out;
    }
    const int64_t smaller = std::max<int64_t>(1, static_cast<int64_t>(batch_size * 0.9));
    if (engine_->world_size() > 1) {
      // The ranks that did not run out are inside this step's collectives, waiting for this
      // one: none can join a retry, so this rank ends the job (the launcher stops the others).
      return absl::ResourceExhaustedError(absl::StrCat(
          "rank ", engine_->rank(), " of ", engine_->world_size(),
          " ran out of memory at per_device_train_batch_size ", batch_size, " (",
          out.status().message(),
          "); auto_find_batch_size retries a single process only, since the other ranks are "
          "waiting in this step's collectives: start again with per_device_train_batch_size ",
          smaller, " or less"));
    }
    LOG(WARNING) << "out of memory at per-device batch size " << batch_size
                 << "; auto_find_batch_size starts again from the initial weights with " << smaller;
    batch_size = smaller;
    CT_RETURN_IF_ERROR(ResetForRetry());
  }
}

// auto_find_batch_size: the retry must train exactly as a run started at the smaller batch
// size would, so it starts from this rank's initial weights with a fresh optimizer.
absl::Status Trainer::SnapshotInitialParameters() {
  if (!args_.auto_find_batch_size() || !initial_parameters_.empty()) return absl::OkStatus();
  // The masters, not an engine's lower-precision working copies (ZeRO 1/2 under bf16).
  return WithMasterWeights([&] {
    return CatchTorch([&] {
      for (const auto& [name, param] : UniqueTrainableParameters(*model_)) {
        initial_parameters_.push_back(param.detach().to(torch::kCPU, /*non_blocking=*/false,
                                                        /*copy=*/true));
      }
    });
  });
}

absl::Status Trainer::ResetForRetry() {
  engine_->ZeroGrad();  // also drops what the failed step left (reductions, gathers)
  engine_->ResetOptimizer();
  return WithMasterWeights([&] {
    return CatchTorch([&] {
      torch::NoGradGuard no_grad;
      size_t i = 0;
      for (auto& [name, param] : UniqueTrainableParameters(*model_)) {
        param.copy_(initial_parameters_.at(i++));
      }
    });
  });
}

absl::StatusOr<TrainOutput> Trainer::InnerTrainingLoop(int64_t batch_size) {
  torch::manual_seed(static_cast<uint64_t>(args_.seed()));
  if (args_.gradient_checkpointing()) model_->SetGradientCheckpointing(true);
  // Counted before the engine may shard the parameters.
  flops_parameters_ = NonEmbeddingParameters(*model_);
  CT_RETURN_IF_ERROR(engine_->PrepareForTraining(
      model_, [this](const NamedParameters& params) { return CreateOptimizer(params); }));
  CT_RETURN_IF_ERROR(SnapshotInitialParameters());
  CT_ASSIGN_OR_RETURN(std::unique_ptr<DataLoader> loader,
                      MakeLoader(train_dataset_, /*train=*/true, batch_size));
  // The graph (and the memory it keeps) lives while this loop trains.
  if (args_.cuda_graphs()) {
    const std::string never = CudaGraphBlocker();
    if (never.empty()) {
      step_graph_ =
          std::make_unique<trainer_internal::StepGraph>(engine_->device(), kCudaGraphWarmupSteps);
    } else {
      CT_LOG_RANK0(WARNING) << "cuda_graphs: every step runs eagerly: " << never;
    }
  }
  absl::Cleanup drop_graph = [this] { step_graph_.reset(); };
  training_ = true;
  absl::Cleanup not_training = [this] { training_ = false; };

  const int64_t ga = ResolvedGradientAccumulationSteps(args_);
  // Every rank counts the busiest rank's batches (without even_batches some have fewer and
  // fill in with join batches), so all agree on the steps without communicating.
  const int64_t batches = loader->max_num_batches();
  const int64_t steps_per_epoch = std::max<int64_t>(1, batches / ga + (batches % ga > 0));
  const int64_t max_steps =
      args_.max_steps() > 0
          ? args_.max_steps()
          : static_cast<int64_t>(std::ceil(args_.num_train_epochs() * steps_per_epoch));
  state_ = TrainerState{};
  state_.is_world_process_zero = engine_->rank() == 0;
  state_.max_steps = max_steps;
  state_.num_update_steps_per_epoch = steps_per_epoch;
  state_.num_train_epochs = (max_steps + steps_per_epoch - 1) / steps_per_epoch;
  state_.logging_steps = ResolveStepInterval(args_.logging_steps(), max_steps);
  state_.eval_steps = ResolveStepInterval(ResolvedEvalSteps(args_), max_steps);
  state_.save_steps = ResolveStepInterval(args_.save_steps(), max_steps);
  state_.train_batch_size = batch_size;
  control_ = TrainerControl{};
  logged_steps_ = 0;
  loss_total_ = loss_since_log_ = torch::Tensor();
  resumed_loss_total_ = 0;
  train_loss_from_step_ = 0;
  divergence_.Reset();

  CT_ASSIGN_OR_RETURN(schedule_, CreateScheduler(max_steps));
  plateau_.reset();
  if (schedule_->is_plateau()) plateau_.emplace(args_.lr_scheduler_kwargs(), args_.learning_rate());
  // Resuming: where the checkpoint left off, skipping the batches it consumed (by index,
  // without reading them).
  best_model_checkpoint_.clear();
  if (!args_.resume_from_checkpoint().empty()) {
    CT_RETURN_IF_ERROR(ResumeFromCheckpoint(args_.resume_from_checkpoint()));
  }
  const int64_t resumed_step = resumed_step_ = state_.global_step;
  const int64_t start_epoch = resumed_step / steps_per_epoch;
  const int64_t start_update = resumed_step % steps_per_epoch;
  CT_LOG_RANK0(INFO) << "training: " << max_steps << " steps, " << steps_per_epoch << " per epoch, "
                     << batches << " micro-batches of " << batch_size
                     << " per epoch and rank, accumulation " << ga << ", engine " << engine_->name()
                     << " on " << engine_->device().str() << ", world " << engine_->world_size()
                     << ", run " << ResolvedRunName(args_);

  const double start = MonotonicSeconds();
  callbacks_.TrainBegin(Context());
  if (args_.eval_on_start()) CT_RETURN_IF_ERROR(Evaluate().status());
  for (int64_t epoch = start_epoch;
       epoch < state_.num_train_epochs && !control_.should_training_stop &&
       state_.global_step < max_steps;
       ++epoch) {
    const int64_t first_update = epoch == start_epoch ? start_update : 0;
    loader->SetEpoch(epoch);
    loader->Start(/*skip_batches=*/std::min(first_update * ga, loader->num_batches()));
    callbacks_.EpochBegin(Context());
    for (int64_t update = first_update; update < steps_per_epoch; ++update) {
      CT_ASSIGN_OR_RETURN(MicroBatches micro_batches,
                          NextMicroBatches(*loader, std::min(ga, batches - update * ga)));
      if (micro_batches.batches.empty()) break;
      callbacks_.StepBegin(Context());
      CT_RETURN_IF_ERROR(RunOptimizerStep(micro_batches));
      state_.epoch = epoch + static_cast<double>(update + 1) / steps_per_epoch;
      callbacks_.StepEnd(Context());
      CT_RETURN_IF_ERROR(MaybeLogEvaluateSave());
      if (stop_signal_ != 0) return SaveAndStopForSignal();
      if (control_.should_training_stop || control_.should_epoch_stop) break;
    }
    CT_RETURN_IF_ERROR(loader->status());
    callbacks_.EpochEnd(Context());
    CT_RETURN_IF_ERROR(MaybeLogEvaluateSave());
  }
  CT_RETURN_IF_ERROR(CheckNotDiverged());
  callbacks_.TrainEnd(Context());

  const double runtime = MonotonicSeconds() - start;
  const torch::Tensor local_total =
      loss_total_.defined() ? loss_total_.cpu().reshape({1}) : torch::zeros({1}, torch::kFloat64);
  CT_ASSIGN_OR_RETURN(torch::Tensor total, engine_->AllReduceSum(local_total));
  TrainOutput out;
  out.global_step = state_.global_step;
  const int64_t steps_run = state_.global_step - resumed_step;
  // Unlike Hugging Face (which divides the resumed steps' sum by every step), the checkpoint
  // carries the earlier steps' sum, so this is the mean over every step.
  const double loss_sum = total.item<double>() + resumed_loss_total_;
  const int64_t averaged = state_.global_step - train_loss_from_step_;
  out.training_loss = averaged > 0 ? loss_sum / averaged : 0.0;
  const double samples = static_cast<double>(steps_run) * ga * batch_size * engine_->world_size();
  out.metrics = {{"train_runtime", runtime},
                 {"train_samples_per_second", samples / std::max(runtime, 1e-9)},
                 {"train_steps_per_second", steps_run / std::max(runtime, 1e-9)},
                 {"train_loss", out.training_loss},
                 {"total_flos", state_.total_flos}};
  if (args_.cuda_graphs()) {
    out.metrics["cuda_graph_captures"] =
        step_graph_ != nullptr ? static_cast<double>(step_graph_->captures()) : 0.0;
    out.metrics["cuda_graph_replays"] =
        step_graph_ != nullptr ? static_cast<double>(step_graph_->replays()) : 0.0;
  }
  if (args_.load_best_model_at_end()) CT_RETURN_IF_ERROR(LoadBestModel());
  Log(out.metrics);
  CT_RETURN_IF_ERROR(LogWritesOk());
  return out;
}

absl::StatusOr<Trainer::MicroBatches> Trainer::NextMicroBatches(DataLoader& loader, int64_t count) {
  MicroBatches out;
  while (static_cast<int64_t>(out.batches.size()) < count) {
    std::optional<Batch> batch = loader.Next();
    if (!batch.has_value()) {
      CT_RETURN_IF_ERROR(loader.status());
      CT_ASSIGN_OR_RETURN(batch, loader.JoinBatch());
      ++out.joined;
    } else if (out.joined > 0) {
      return absl::InternalError("a real batch after a join batch: the loader's count is off");
    }
    out.batches.push_back(std::move(*batch));
  }
  return out;
}

namespace {

// Hugging Face's num_input_tokens_seen ("non_padding"): tokens the attention mask marks as
// real, or every input element without a mask.
int64_t NonPaddingTokens(const Batch& batch) {
  if (batch.attention_mask.defined()) return batch.attention_mask.sum().item<int64_t>();
  return batch.inputs.numel();
}

}  // namespace

absl::StatusOr<Trainer::CountedStep> Trainer::CountStep(const MicroBatches& step,
                                                        const trainer_internal::StepVote* vote) {
  const size_t real = step.batches.size() - static_cast<size_t>(step.joined);
  // Exact normalization: every micro-batch's summed loss is divided by the number of counted
  // targets in the whole accumulated batch, summed over ranks; one all-reduce per step sums
  // them with the tokens seen. The batches are on the host: counting waits for no device.
  int64_t local_targets = 0;
  int64_t local_tokens = 0;
  int64_t local_inputs = 0;  // padding included, for total_flos as Hugging Face estimates it
  for (size_t i = 0; i < real; ++i) {
    local_targets += model_->CountLossTargets(step.batches[i]);
    local_tokens += NonPaddingTokens(step.batches[i]);
    local_inputs += step.batches[i].inputs.numel();
  }
  // A stop signal any rank received rides along, so every rank stops after the same step; so
  // does the CUDA-graph vote, so every rank captures, replays or runs eagerly alike.
  const int local_signal = StopSignals::Requested();
  const trainer_internal::StepVote mine = vote != nullptr ? *vote : trainer_internal::StepVote{};
  std::vector<double> sums = {static_cast<double>(local_targets),
                              static_cast<double>(local_tokens), static_cast<double>(local_signal),
                              static_cast<double>(local_inputs)};
  const size_t vote_at = sums.size();
  const auto vote_values = mine.Values();
  sums.insert(sums.end(), vote_values.begin(), vote_values.end());
  CT_ASSIGN_OR_RETURN(torch::Tensor global,
                      engine_->AllReduceSum(torch::tensor(sums, torch::kFloat64)));
  const torch::Tensor host = global.cpu().contiguous();  // one wait for the device, not one each
  const double* summed = host.data_ptr<double>();
  if (summed[2] > 0) stop_signal_ = local_signal != 0 ? local_signal : SIGTERM;
  CountedStep out;
  out.normalizer = std::max<int64_t>(1, args_.average_tokens_across_devices()
                                            ? static_cast<int64_t>(summed[0])
                                            : local_targets * engine_->world_size());
  state_.num_input_tokens_seen += static_cast<int64_t>(summed[1]);
  state_.total_flos += 6.0 * static_cast<double>(flops_parameters_) * summed[3];
  out.graph_agreed =
      vote != nullptr && trainer_internal::StepGraph::Agreed(
                             trainer_internal::StepVote::FromValues(summed + vote_at),
                             engine_->world_size());
  return out;
}

absl::StatusOr<Trainer::StepResult> Trainer::StepDeviceWork(const std::vector<Batch>& on_device,
                                                            int64_t normalizer, bool callbacks) {
  const bool sync_each =
      args_.accelerator_config().gradient_accumulation_kwargs().sync_each_batch();
  CT_RETURN_IF_ERROR(InjectedOutOfMemory(engine_->rank(), state_.global_step));
  StepResult out;
  out.loss =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(engine_->device()));
  for (size_t i = 0; i < on_device.size(); ++i) {
    const bool last = i + 1 == on_device.size();
    engine_->SetGradientSync(last || sync_each);
    CT_ASSIGN_OR_RETURN(torch::Tensor loss, TrainingStep(on_device[i], normalizer));
    out.loss += loss;
    if (!last && callbacks) callbacks_.SubstepEnd(Context());
  }
  // Hugging Face computes (and logs) the norm only when it clips.
  if (args_.max_grad_norm() > 0) {
    CT_ASSIGN_OR_RETURN(out.grad_norm, engine_->ClipGradNorm(args_.max_grad_norm()));
  }
  if (callbacks) callbacks_.PreOptimizerStep(Context());
  // A skipped step still counts as a step, as in Hugging Face.
  CT_ASSIGN_OR_RETURN(out.stepped, engine_->OptimizerStep());
  return out;
}

std::string Trainer::CudaGraphBlocker() {
  if (!SideStreamGraph::Supported()) return "this LibTorch build has no CUDA graphs";
  auto* capturable = dynamic_cast<CapturableStep*>(engine_.get());
  if (capturable == nullptr) return engine_->name() + " engine's step cannot be captured";
  return capturable->EngineCaptureBlocker();
}

// Under cuda_graphs the step's device work may be a replay, which runs no host code: the
// callbacks that would fall between its parts run after it, for every step alike.
trainer_internal::StepVote Trainer::GraphVote(const MicroBatches& step) {
  auto& capturable = dynamic_cast<CapturableStep&>(*engine_);  // CudaGraphBlocker said so
  trainer_internal::StepGraph::Functions f;
  f.blocker = [&] { return capturable.StepCaptureBlocker(); };
  f.prepare_replay = [&] { return capturable.PrepareStepReplay(); };
  // The parts of RunGraphStep's key every rank knows before the all-reduce: which micro-batches
  // synchronize and, where each rank divides by its own count of targets, that count (a global
  // normalizer is the same on every rank once summed).
  std::string key = absl::StrCat(
      "sync_each ", args_.accelerator_config().gradient_accumulation_kwargs().sync_each_batch());
  if (!args_.average_tokens_across_devices()) {
    const size_t real = step.batches.size() - static_cast<size_t>(step.joined);
    int64_t local_targets = 0;
    for (size_t i = 0; i < real; ++i) local_targets += model_->CountLossTargets(step.batches[i]);
    absl::StrAppend(&key, " targets ", local_targets);
  }
  return step_graph_->Propose(step.batches, key, f);
}

absl::StatusOr<Trainer::StepResult> Trainer::RunGraphStep(const MicroBatches& step,
                                                          int64_t normalizer, bool agreed) {
  auto& capturable = dynamic_cast<CapturableStep&>(*engine_);  // CudaGraphBlocker said so
  trainer_internal::StepGraph::Functions f;
  f.blocker = [&] { return capturable.StepCaptureBlocker(); };
  f.prepare_capture = [&] { return capturable.PrepareForCapture(); };
  f.prepare_replay = [&] { return capturable.PrepareStepReplay(); };
  f.replayed = [&] { return capturable.StepReplayed(); };
  f.work = [&](const std::vector<Batch>& on_device)
      -> absl::StatusOr<trainer_internal::StepGraph::Outputs> {
    CT_ASSIGN_OR_RETURN(StepResult r, StepDeviceWork(on_device, normalizer, /*callbacks=*/false));
    return trainer_internal::StepGraph::Outputs{r.loss, r.grad_norm};
  };
  f.discard = [&] { engine_->ZeroGrad(); };
  f.all_ranks = [&](bool ok) -> absl::StatusOr<bool> {
    CT_ASSIGN_OR_RETURN(torch::Tensor failed,
                        engine_->AllReduceSum(torch::full({1}, ok ? 0.0 : 1.0, torch::kFloat64)));
    return failed.item<double>() == 0;
  };
  // What the captured work bakes in besides the shapes: the divisor of the loss and which
  // micro-batches synchronize.
  const std::string key = absl::StrCat(
      "normalizer ", normalizer, " sync_each ",
      args_.accelerator_config().gradient_accumulation_kwargs().sync_each_batch());
  CT_ASSIGN_OR_RETURN(trainer_internal::StepGraph::Outputs out,
                      step_graph_->Run(step.batches, key, f,
                                       args_.accelerator_config().non_blocking(), agreed));
  for (size_t i = 0; i + 1 < step.batches.size(); ++i) callbacks_.SubstepEnd(Context());
  callbacks_.PreOptimizerStep(Context());
  return StepResult{out.loss, out.grad_norm};
}

absl::Status Trainer::RunOptimizerStep(MicroBatches& step) {
  // The learning rate first: a replay's preparation (in the vote) copies it to the device.
  last_lr_ = plateau_ ? plateau_->learning_rate() : schedule_->LearningRate(state_.global_step);
  SetLearningRate(*engine_->optimizer(), last_lr_);
  std::optional<trainer_internal::StepVote> vote;
  if (step_graph_ != nullptr) vote = GraphVote(step);
  CT_ASSIGN_OR_RETURN(const CountedStep counted, CountStep(step, vote ? &*vote : nullptr));
  const int64_t normalizer = counted.normalizer;

  StepResult result;
  if (step_graph_ != nullptr) {
    CT_ASSIGN_OR_RETURN(result, RunGraphStep(step, normalizer, counted.graph_agreed));
  } else {
    const bool non_blocking = args_.accelerator_config().non_blocking();
    std::vector<Batch> on_device;
    for (const Batch& b : step.batches) on_device.push_back(b.To(engine_->device(), non_blocking));
    CT_ASSIGN_OR_RETURN(result, StepDeviceWork(on_device, normalizer, /*callbacks=*/true));
  }
  last_grad_norm_ = result.grad_norm;
  callbacks_.OptimizerStep(Context());
  engine_->ZeroGrad();
  ++state_.global_step;
  StepFinished(step.batches, result.loss);
  // A step the engine skipped left the weights as they were (the loss scaler's business).
  if (result.stepped) divergence_.Record(state_.global_step, result.loss, result.grad_norm);
  torch::Tensor step_loss = result.loss;
  if (!loss_total_.defined()) {
    loss_total_ = torch::zeros_like(step_loss);
    loss_since_log_ = torch::zeros_like(step_loss);
  }
  if (args_.logging_nan_inf_filter() && state_.global_step - resumed_step_ > 1) {
    // A NaN or infinite step loss counts as this run's running mean instead (logging only).
    step_loss =
        torch::where(torch::isfinite(step_loss), step_loss,
                     loss_total_ / static_cast<double>(state_.global_step - resumed_step_ - 1));
  }
  loss_total_ += step_loss;
  loss_since_log_ += step_loss;
  ++logged_steps_;
  return absl::OkStatus();
}

absl::Status Trainer::CheckNotDiverged() {
  // For tests of what loading a diverged run's checkpoints does (tools/reliability_check.sh):
  // CPPTRAIN_TEST_SAVE_DIVERGED=1 keeps training and saving as before this check existed.
  if (const char* keep = std::getenv("CPPTRAIN_TEST_SAVE_DIVERGED");
      keep != nullptr && std::string(keep) == "1") {
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, torch::Tensor>> params;
  for (const auto& item : model_->named_parameters()) params.emplace_back(item.key(), item.value());
  divergence_.RecordParameters(state_.global_step, params);
  return divergence_.Check(*engine_);
}

absl::Status Trainer::LogWritesOk() {
  const absl::Status agreed = AllRanksOk(callbacks_.FirstError());
  if (agreed.ok()) return agreed;
  const std::string name = absl::StrCat("checkpoint-", state_.global_step);
  std::string saved = absl::StrCat("; ", name, " was saved at this step");
  if (state_.global_step == 0) {
    saved = "; nothing was trained yet, so no checkpoint";
  } else if (last_saved_step_ != state_.global_step) {
    const absl::Status s = SaveCheckpoint();
    if (s.ok()) last_saved_step_ = state_.global_step;
    saved = s.ok() ? absl::StrCat("; saved ", name, " first")
                   : absl::StrCat("; ", name, " could not be saved either: ", s.message());
  }
  return absl::Status(agreed.code(),
                      absl::StrCat("training stops after step ", state_.global_step,
                                   " because a log could not be written: ", agreed.message(),
                                   saved, ". Resume with resume_from_checkpoint: latest"));
}

absl::Status Trainer::MaybeLogEvaluateSave() {
  // Where the host reads the step's results anyway; SaveCheckpoint checks on its own.
  const bool logs = control_.should_log || control_.should_evaluate;
  if (logs) CT_RETURN_IF_ERROR(CheckNotDiverged());
  if (control_.should_log && logged_steps_ > 0) {
    CT_ASSIGN_OR_RETURN(torch::Tensor loss_sum,
                        engine_->AllReduceSum(loss_since_log_.cpu().reshape({1})));
    Metrics logs = {{"loss", loss_sum.item<double>() / logged_steps_}, {"learning_rate", last_lr_}};
    if (last_grad_norm_.defined()) logs["grad_norm"] = last_grad_norm_.item<double>();
    loss_since_log_.zero_();
    logged_steps_ = 0;
    Log(std::move(logs));
  }
  if (control_.should_evaluate) {
    CT_ASSIGN_OR_RETURN(Metrics metrics, Evaluate());
    const bool new_best = UpdateBestMetric(metrics);
    // save_strategy BEST (Hugging Face's SaveStrategy.BEST): a checkpoint whenever the
    // evaluation improved the best metric, and only then.
    if (args_.save_strategy() == proto::TrainingArguments::BEST) control_.should_save = new_best;
    if (plateau_) {
      const std::string name = ResolvedMetricForBestModel(args_);
      if (auto it = metrics.find(name); it != metrics.end()) plateau_->Step(it->second);
    }
  }
  // Every rank learns whether rank 0's metrics file or event file took the records.
  if (logs) CT_RETURN_IF_ERROR(LogWritesOk());
  if (control_.should_save) {
    control_.should_save = false;
    CT_RETURN_IF_ERROR(SaveCheckpoint());
    last_saved_step_ = state_.global_step;
  }
  return absl::OkStatus();
}

absl::Status Trainer::SaveAndStopForSignal() {
  const std::string name = strsignal(stop_signal_);
  CT_LOG_RANK0(WARNING) << name << ": stopping after step " << state_.global_step
                        << "; saving a checkpoint first (a second signal ends the process now)";
  if (last_saved_step_ != state_.global_step) {
    CT_RETURN_IF_ERROR(SaveCheckpoint());
    last_saved_step_ = state_.global_step;
  }
  // Rank 0 finishes the checkpoint (manifest, state, rename) after the others' files: nobody
  // exits before it is complete, or the launcher would stop rank 0 in the middle of it.
  CT_RETURN_IF_ERROR(engine_->Barrier());
  stopped_by_signal_ = stop_signal_;
  const std::string saved =
      (std::filesystem::path(args_.output_dir()) / absl::StrCat("checkpoint-", state_.global_step))
          .string();
  CT_LOG_RANK0(WARNING) << name << ": saved " << saved << "; exiting";
  return absl::CancelledError(absl::StrCat("stopped by signal ", stop_signal_, " (", name,
                                           ") after step ", state_.global_step, ": saved ", saved,
                                           "; resume with resume_from_checkpoint: \"latest\""));
}

bool Trainer::UpdateBestMetric(const Metrics& metrics) {
  auto it = metrics.find(ResolvedMetricForBestModel(args_));
  if (it == metrics.end()) return false;
  const bool greater = ResolvedGreaterIsBetter(args_);
  if (state_.best_metric.has_value() &&
      !(greater ? it->second > *state_.best_metric : it->second < *state_.best_metric)) {
    return false;
  }
  state_.best_metric = it->second;
  state_.best_global_step = state_.global_step;
  return true;
}

}  // namespace cpptrain
