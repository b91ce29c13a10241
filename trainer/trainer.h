// The Trainer owns the loop: epochs and optimizer steps, gradient accumulation with exact
// loss normalization, evaluation and prediction, logging and callbacks. Everything about where
// parameters live is delegated to an Engine (engines/engine.h), chosen from the training
// arguments unless the application passes one. Applications subclass Trainer and override the
// protected steps.
//
//   class MyTrainer : public Trainer {
//     using Trainer::Trainer;
//     torch::Tensor ComputeLoss(TrainableModel& m, const Batch& b, int64_t n) override {...}
//   };
//   MyTrainer trainer(args, model, train_data, eval_data);
//   CT_ASSIGN_OR_RETURN(TrainOutput out, trainer.Train());
//   CT_ASSIGN_OR_RETURN(Metrics metrics, trainer.Evaluate());
#ifndef CPPTRAIN_TRAINER_TRAINER_H_
#define CPPTRAIN_TRAINER_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "module/batch.h"
#include "module/trainable_model.h"
#include "proto/checkpoint.pb.h"
#include "proto/training_args.pb.h"
#include "trainer/callbacks.h"
#include "trainer/data/collator.h"
#include "trainer/data/dataset.h"
#include "trainer/internal/divergence_watch.h"
#include "trainer/scheduler.h"

namespace cpptrain {

class DataLoader;
namespace trainer_internal {
class StepGraph;
struct StepVote;
}  // namespace trainer_internal

struct EvalPrediction {
  at::Tensor predictions;  // logits, padded along dim 1 with -100 across batches
  at::Tensor label_ids;    // labels, padded along dim 1 with -100
};
using ComputeMetricsFn = std::function<Metrics(const EvalPrediction&)>;
// Hugging Face's compute_loss_func(outputs, labels, num_items_in_batch): the loss to
// back-propagate from the model's logits for `batch`, its summed loss divided by
// `num_items_in_batch` (evaluation passes 1, so it returns the sum).
using ComputeLossFn = std::function<torch::Tensor(const torch::Tensor& logits, const Batch& batch,
                                                  int64_t num_items_in_batch)>;
// Hugging Face's preprocess_logits_for_metrics(logits, labels): applied to each evaluation
// batch's logits before they are gathered and kept for compute_metrics (e.g. an argmax, so
// [B, T] ids are kept instead of [B, T, V] logits).
using PreprocessLogitsFn =
    std::function<torch::Tensor(const torch::Tensor& logits, const torch::Tensor& labels)>;

struct TrainOutput {
  int64_t global_step = 0;
  double training_loss = 0;  // mean of the step losses, over every step since step 0
  Metrics metrics;           // train_runtime, train_samples_per_second, ...
};

struct PredictionOutput {
  at::Tensor predictions;
  at::Tensor label_ids;
  Metrics metrics;  // test_loss, user metrics, test_runtime, test_samples_per_second,
                    // test_steps_per_second
};

// What PredictionStep returns for one batch.
struct PredictionStepOutput {
  at::Tensor loss_sum;  // fp32 scalar: summed loss over the batch's counted targets
  int64_t num_targets = 0;
  at::Tensor logits;  // undefined when only the loss is wanted
};

class Trainer {
 public:
  // `engine` may be null: it is then created from args' engine oneof on first use.
  Trainer(proto::TrainingArguments args, std::shared_ptr<TrainableModel> model,
          std::shared_ptr<const Dataset> train_dataset,
          std::shared_ptr<const Dataset> eval_dataset = nullptr,
          std::unique_ptr<Engine> engine = nullptr);
  virtual ~Trainer();

  absl::StatusOr<TrainOutput> Train();
  // Hugging Face's train(resume_from_checkpoint=...): a checkpoint directory, or "latest" (or
  // "true"); overrides args.resume_from_checkpoint for this and later calls. "" trains from
  // scratch.
  absl::StatusOr<TrainOutput> Train(const std::string& resume_from_checkpoint);
  // Metrics named "<prefix>_loss", ...; `dataset` null means the eval dataset.
  absl::StatusOr<Metrics> Evaluate(std::shared_ptr<const Dataset> dataset = nullptr,
                                   const std::string& prefix = "eval");
  absl::StatusOr<PredictionOutput> Predict(std::shared_ptr<const Dataset> dataset,
                                           const std::string& prefix = "test");

  // Hugging Face's save_model(output_dir): the model's weights as model.safetensors (gathered
  // when sharded) and, for a DecoderLM, config.json and generation_config.json, into
  // `output_dir` ("" means args.output_dir), so from_pretrained loads it. No optimizer or
  // trainer state. Collective: every rank calls it.
  absl::Status SaveModel(const std::string& output_dir = "");

  void AddCallback(std::shared_ptr<TrainerCallback> callback);
  void set_compute_metrics(ComputeMetricsFn fn) { compute_metrics_ = std::move(fn); }
  // Replaces the default loss (ComputeLoss's) in training and evaluation; a ComputeLoss
  // override that does not call Trainer::ComputeLoss ignores it.
  void set_compute_loss_func(ComputeLossFn fn) { compute_loss_func_ = std::move(fn); }
  void set_preprocess_logits_for_metrics(PreprocessLogitsFn fn) {
    preprocess_logits_ = std::move(fn);
  }
  // Hugging Face's data_collator: builds every batch (training, evaluation, prediction) from
  // the examples instead of the default Collator (which pads tokens with pad_token_id).
  void set_data_collator(DataCollatorFn fn) { data_collator_ = std::move(fn); }
  // Padding token the collator uses for token datasets (default 0).
  void set_pad_token_id(int64_t id) { pad_token_id_ = id; }
  // What defines the run besides the training arguments (tools/train: its model and data
  // configuration), part of the run identity saved with each checkpoint (trainer/run_identity.h).
  void set_job_identity(std::string extra) { job_identity_ = std::move(extra); }

  const proto::TrainingArguments& args() const { return args_; }
  const TrainerState& state() const { return state_; }
  TrainableModel& model() { return *model_; }
  // Null until the first Train/Evaluate/Predict created it (unless passed in).
  Engine* engine() { return engine_.get(); }
  // The signal (SIGTERM, SIGINT) after which the last Train() saved a checkpoint and returned
  // a Cancelled error; 0 when it was not stopped by one. Programs exit with 128 + it.
  int stopped_by_signal() const { return stopped_by_signal_; }

 protected:
  // The loss to back-propagate for one micro-batch: its summed loss divided by the number of
  // targets in the whole accumulated (and, across ranks, global) batch. Evaluation calls it
  // too (with num_items_in_batch 1, so it returns the summed loss), as Hugging Face's
  // prediction_step calls compute_loss: an override changes eval_loss as well. The default:
  // compute_loss_func when set, else label-smoothed cross-entropy when
  // label_smoothing_factor > 0, else the model's LossSum.
  virtual torch::Tensor ComputeLoss(TrainableModel& model, const Batch& batch,
                                    int64_t num_items_in_batch);
  // Forward and backward of one micro-batch already on the device; returns the detached loss
  // (kept on the device: reading it would synchronize the host every micro-batch). With
  // cuda_graphs, a step replayed from a CUDA graph runs none of this host code: it runs for the
  // warm-up steps, the captured step and steps of other shapes only, and the batch it gets for
  // the captured step is the graph's input buffer (refilled at every replay).
  virtual absl::StatusOr<torch::Tensor> TrainingStep(const Batch& batch,
                                                     int64_t num_items_in_batch);
  // After every optimizer step (replayed or not): its micro-batches as the loader gave them
  // (on the host) and this rank's share of the step's loss (a device scalar of its own; reading
  // it waits for the step). For subclasses that record what each step trained on.
  virtual void StepFinished(const std::vector<Batch>& micro_batches,
                            const torch::Tensor& step_loss) {}
  // Forward of one evaluation batch (no grad).
  virtual PredictionStepOutput PredictionStep(const Batch& batch, bool loss_only);
  virtual absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> CreateOptimizer(
      const NamedParameters& params);
  virtual absl::StatusOr<std::unique_ptr<LrSchedule>> CreateScheduler(int64_t total_steps);
  // Adds epoch and step, appends to the history and calls the callbacks.
  virtual void Log(Metrics logs);
  // Writes the model's configuration files into a checkpoint or save_model directory `dir`
  // (rank 0 only, beside the weights). The default writes Hugging Face's config.json and
  // generation_config.json when the model's ConfigProto is a DecoderConfig, so
  // from_pretrained loads the directory, and nothing for other models: override it to write
  // your model's own.
  virtual absl::Status WriteModelConfig(const std::string& dir);

  // args, state, control, the model and (once created) the engine's optimizer.
  CallbackContext Context();
  // The last optimizer step's global gradient norm before clipping, on the device (a replayed
  // step may overwrite it: copy what you keep); undefined when max_grad_norm is 0.
  const torch::Tensor& last_grad_norm() const { return last_grad_norm_; }

 private:
  struct EvalResult;

  // Collective: builds the engine when there is none, and the first time rank 0 creates
  // output_dir, every rank learning whether it could.
  absl::Status EnsureEngine();
  // overwrite_output_dir: removes an earlier run's checkpoints and metrics.jsonl (rank 0), or
  // warns that they are there.
  absl::Status PrepareOutputDir();
  // Before the first step (trainer_preflight.cc): output_dir writable, room for a checkpoint,
  // the same training arguments on every rank. Every rank returns an error when one fails.
  absl::Status Preflight();
  absl::StatusOr<std::unique_ptr<DataLoader>> MakeLoader(std::shared_ptr<const Dataset> dataset,
                                                         bool train, int64_t batch_size) const;
  // One optimizer step's micro-batches; the last `joined` are join batches (labels all
  // ignored) of a rank that ran out while others had batches left.
  struct MicroBatches {
    std::vector<Batch> batches;
    int64_t joined = 0;
  };
  absl::StatusOr<TrainOutput> InnerTrainingLoop(int64_t batch_size);
  absl::StatusOr<MicroBatches> NextMicroBatches(DataLoader& loader, int64_t count);
  absl::Status RunOptimizerStep(MicroBatches& step);
  // The step's loss normalizer (its counted targets over every rank), after adding its tokens
  // to num_input_tokens_seen and agreeing on a stop signal.
  // With cuda_graphs, this rank's `vote` on capturing or replaying the step rides along, and
  // `graph_agreed` says whether every rank's agreed (StepGraph::Agreed).
  struct CountedStep {
    int64_t normalizer = 1;
    bool graph_agreed = false;
  };
  absl::StatusOr<CountedStep> CountStep(const MicroBatches& step,
                                        const trainer_internal::StepVote* vote);
  struct StepResult {
    torch::Tensor loss;       // this rank's share, a device scalar
    torch::Tensor grad_norm;  // undefined without clipping
    bool stepped = true;      // false when the engine skipped the update (fp16 overflow)
  };
  // Forward and backward of each micro-batch (already on the device), clipping, the optimizer
  // step; with `callbacks`, on_substep_end and on_pre_optimizer_step between the parts.
  absl::StatusOr<StepResult> StepDeviceWork(const std::vector<Batch>& on_device,
                                            int64_t normalizer, bool callbacks);
  // The same through step_graph_ (eager, captured or replayed).
  absl::StatusOr<StepResult> RunGraphStep(const MicroBatches& step, int64_t normalizer,
                                          bool agreed);
  // This rank's vote on capturing or replaying `step` (StepGraph::Propose), for CountStep.
  trainer_internal::StepVote GraphVote(const MicroBatches& step);
  // Why no step of this run can be a CUDA graph (the build, the engine, its device, fp16); "".
  std::string CudaGraphBlocker();
  absl::Status SnapshotInitialParameters();
  // After an out-of-memory failure: initial weights, fresh optimizer, nothing left over.
  absl::Status ResetForRetry();
  // Runs `io`, a read or write of the model's parameters from outside a step, with the
  // engine's full-precision masters in them (Engine::ExposeMasterWeights), and restores the
  // working copies even when `io` fails. Collective: when exposing fails on any rank, no rank
  // runs `io` (which may be collective) and every rank returns an error.
  absl::Status WithMasterWeights(const std::function<absl::Status()>& io);
  absl::Status MaybeLogEvaluateSave();
  // Collective: an error on every rank once any rank's applied step had a non-finite loss or
  // gradient norm (trainer/internal/divergence_watch.h).
  absl::Status CheckNotDiverged();
  // Collective: OK, or (when a callback's write failed, e.g. rank 0's metrics.jsonl) an error
  // on every rank naming the file, after saving a checkpoint of this step where one can be.
  absl::Status LogWritesOk();
  // After the step in which a rank got SIGTERM/SIGINT: a checkpoint (unless this step saved
  // one), then a Cancelled error naming it.
  absl::Status SaveAndStopForSignal();
  absl::StatusOr<EvalResult> RunEvaluation(std::shared_ptr<const Dataset> dataset,
                                           bool keep_outputs);
  // User metrics (prefixed), "<prefix>_loss", runtime and samples per second.
  Metrics ResultMetrics(const EvalResult& result, const std::string& prefix);
  // Records a new best metric; true when `metrics` improved on it (or set it first).
  bool UpdateBestMetric(const Metrics& metrics);
  // trainer_checkpoint.cc
  // Writes checkpoint-<step>; on a failure on any rank, every rank returns an error that names
  // it and the newest earlier checkpoint, and what was written is removed.
  absl::Status SaveCheckpoint();
  // SaveCheckpoint's parts: the files of every rank into `temp_dir`, then rank 0's (state,
  // config, the rename to `name`).
  absl::Status WriteCheckpoint(const std::string& name, const std::string& temp_dir);
  absl::Status FinishCheckpoint(const std::string& name, const std::string& temp_dir);
  absl::Status SaveFailed(const absl::Status& error, const std::string& name,
                          const std::string& temp_dir);
  // Collective: `local` where it failed, else an error naming the ranks where it failed and
  // their messages (sharding/all_ranks_ok.h).
  absl::Status AllRanksOk(const absl::Status& local);
  void RotateCheckpoints();
  // "latest" (or "true"): the newest finished checkpoint that verifies, falling back past
  // damaged ones; otherwise the path given, which must verify.
  absl::Status ResumeFromCheckpoint(const std::string& requested);
  // Collective: every rank verifies what it will load (VerifyResumableOnThisRank) and all
  // agree. DataLoss when any rank found the checkpoint damaged.
  absl::StatusOr<proto::TrainerCheckpointState> VerifyResumable(const std::string& dir);
  // OK unless `saved` records a run identity other than this job's (resume_from_checkpoint:
  // latest only; an explicit path continues whatever it names).
  absl::Status SameRun(const std::string& dir, const proto::TrainerCheckpointState& saved);
  // trainer_state.textproto (checksum, parse), the model and optimizer state this rank reads
  // (VerifyModelState, strict by load_strict) and this rank's rng_state file.
  absl::StatusOr<proto::TrainerCheckpointState> VerifyResumableOnThisRank(const std::string& dir);
  // Collective: every rank loads its part, then all agree (AllRanksOk) before going on.
  absl::Status RestoreCheckpoint(const std::string& dir,
                                 const proto::TrainerCheckpointState& saved);
  // This rank's random state, when the checkpoint was saved on as many ranks.
  absl::Status RestoreRngState(const std::string& dir, const proto::TrainerCheckpointState& saved);
  absl::Status LoadBestModel();

  proto::TrainingArguments args_;
  std::shared_ptr<TrainableModel> model_;
  std::shared_ptr<const Dataset> train_dataset_;
  std::shared_ptr<const Dataset> eval_dataset_;
  std::unique_ptr<Engine> engine_;
  ComputeMetricsFn compute_metrics_;
  ComputeLossFn compute_loss_func_;
  PreprocessLogitsFn preprocess_logits_;
  DataCollatorFn data_collator_;
  // Set while PredictionStep wants logits: the default ComputeLoss leaves the logits it
  // computed here, so an evaluation that keeps them runs one forward.
  bool capture_logits_ = false;
  torch::Tensor captured_logits_;
  int64_t pad_token_id_ = 0;

  CallbackHandler callbacks_;
  TrainerState state_;
  TrainerControl control_;
  std::unique_ptr<LrSchedule> schedule_;
  // With cuda_graphs, during Train: the step's CUDA graph (trainer/internal/step_graph.h).
  std::unique_ptr<trainer_internal::StepGraph> step_graph_;
  std::optional<ReduceLrOnPlateau> plateau_;

  // Summed step losses, kept on the device until a log reads them (this rank's share of the
  // global loss): since the last log, and over the whole run. Steps since the last log.
  torch::Tensor loss_since_log_;
  torch::Tensor loss_total_;
  int64_t logged_steps_ = 0;
  // Summed step losses of every rank up to the checkpoint resumed from (0 from scratch), and
  // its step: train_loss averages over every step since step 0.
  double resumed_loss_total_ = 0;
  int64_t resumed_step_ = 0;
  // 0, or the resumed step when the checkpoint did not record its summed loss.
  int64_t train_loss_from_step_ = 0;
  // What the checkpoint being written records as loss_total (all ranks, all steps).
  double loss_total_to_save_ = 0;
  // Model parameters outside embeddings, for total_flos (counted as training starts).
  int64_t flops_parameters_ = 0;
  // The last step's gradient norm, on the device until a log reads it; undefined when
  // max_grad_norm is 0 (none computed).
  torch::Tensor last_grad_norm_;
  // The first applied step whose loss or gradient norm was not finite; checked (collectively)
  // before logging, evaluating and saving, and at the end of training.
  trainer_internal::DivergenceWatch divergence_;
  double last_lr_ = 0;
  std::string job_identity_;
  std::string best_model_checkpoint_;  // "" until a checkpoint holds the best metric
  bool training_ = false;  // inside Train, whose log points check the callbacks' writes
  bool output_dir_made_ = false;  // EnsureEngine's agreed creation of output_dir succeeded
  int stop_signal_ = 0;                // agreed by all ranks in the step's all-reduce
  int stopped_by_signal_ = 0;
  int64_t last_saved_step_ = -1;
  // auto_find_batch_size only: this rank's trainable parameters before the first step.
  std::vector<torch::Tensor> initial_parameters_;
};

// The finished checkpoint-<step> directory of `output_dir` with the highest step (without
// verifying it: resume_from_checkpoint "latest" also skips damaged ones).
absl::StatusOr<std::string> LatestCheckpoint(const std::string& output_dir);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_TRAINER_H_
