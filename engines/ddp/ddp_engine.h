// Data parallel: every rank holds the whole model. Parameters and buffers are broadcast from
// rank 0 when prepared. Gradients live in flat buckets (reverse order of registration, each of
// the model's AdjacentParameterGroups whole and in forward order, about bucket_cap_mb each;
// each parameter's .grad is a view of its bucket), and a bucket is
// all-reduced as soon as every gradient in it has been accumulated, from a hook on the
// parameter's gradient accumulator, while the rest of backward still runs. Buckets are launched
// in order on every rank and waited for once the whole backward has returned (in Backward(),
// never from inside autograd: a recomputed layer's nested backward ends before the outer one,
// so the first gradient hook cannot tell when backward is over). With broadcast_buffers,
// rank 0's buffers are broadcast before every training forward. With gradient synchronization
// off (non-final micro-batches of an accumulation) there is no communication at all. Gradients
// are summed, not averaged: the Trainer divides the loss by the global number of targets.
// Under bf16 with ddp.bf16_working_copies (the default) the parameters are bf16 working copies
// (engines/working_parameters.h) and the buckets hold the fp32 masters' gradients, laid out in
// bucket order, which the hooks move the bf16 gradients into. The step may be replayed as a
// CUDA graph (TrainingArguments.cuda_graphs; EngineCaptureBlocker says when not).
//
//   CT_ASSIGN_OR_RETURN(auto engine, DdpEngine::Create(config, precision, device, comm));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_ENGINES_DDP_DDP_ENGINE_H_
#define CPPTRAIN_ENGINES_DDP_DDP_ENGINE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/local/local_engine.h"
#include "proto/engines.pb.h"
#include "sharding/communicator.h"

namespace cpptrain {

class DdpEngine : public LocalEngine {
 public:
  // `comm` spans all ranks and serves tensors on `device` (NCCL for CUDA, Gloo for CPU).
  static absl::StatusOr<std::unique_ptr<DdpEngine>> Create(const proto::DdpConfig& config,
                                                           MixedPrecision precision,
                                                           c10::Device device,
                                                           std::shared_ptr<Communicator> comm);
  ~DdpEngine() override;

  std::string name() const override { return "ddp"; }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }

  absl::Status PrepareForInference(std::shared_ptr<TrainableModel> model) override;
  absl::Status PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                  const OptimizerFactory& factory) override;
  // Broadcasts rank 0's buffers first when training with ddp.broadcast_buffers.
  std::unique_ptr<ForwardScope> EnterForward() override;
  absl::Status Backward(const torch::Tensor& loss) override;
  void SetGradientSync(bool enabled) override { sync_ = enabled; }
  absl::StatusOr<torch::Tensor> ClipGradNorm(double max_norm) override;
  // A captured step (engines/step_capture.h) records each bucket's all-reduce where the hooks
  // launched it; a replay runs them in that order again, with no hook or bookkeeping on the
  // host, which is right as long as every step produces the same gradients in the same order.
  // So the step is not captured with ddp.find_unused_parameters, whose set of unused parameters
  // may change from step to step.
  std::string EngineCaptureBlocker() override;
  // LocalEngine's, and the hooks made again on the capturing stream.
  absl::Status PrepareForCapture() override;
  // The communicator's watchdog holds the replay's collectives to its timeout (they were
  // recorded at the capture, so nothing else watches them): a peer that died during a replay
  // ends the job as in an eager step.
  absl::Status StepReplayed() override;
  absl::StatusOr<bool> OptimizerStep() override;
  // Zeroes the buckets and forgets any backward that did not complete.
  void ZeroGrad() override;
  absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) override;
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) override;

  // Bucket layout, for tests: parameter names per bucket, in launch order.
  std::vector<std::vector<std::string>> BucketParameterNames() const;

  // Whether every rank's gradients are finite (a max all-reduce of the overflow flag).
  absl::StatusOr<bool> AllRanksFinite(bool local_finite) override;

  struct Reducer;  // buckets, hooks and in-flight work (ddp_engine.cc)

 private:
  DdpEngine(const proto::DdpConfig& config, MixedPrecision precision, c10::Device device,
            std::shared_ptr<Communicator> comm);
  absl::Status BroadcastState();
  // An error when gradients came from a backward outside Backward() while sync was on.
  absl::Status CheckGradientsSynchronized();

  proto::DdpConfig config_;
  std::shared_ptr<Communicator> comm_;
  bool sync_ = true;
  bool broadcast_done_ = false;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_DDP_DDP_ENGINE_H_
