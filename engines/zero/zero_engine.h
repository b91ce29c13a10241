// ZeRO stages 1 and 2 (DeepSpeed's zero_optimization; Megatron's distributed optimizer):
// parameters are replicated, the optimizer state is partitioned. Every rank holds the whole
// model; the trainable parameters become views of one flat buffer cut into buckets
// (engines/zero/zero_layout.h), and rank r owns the r-th 1/N of every bucket: the optimizer
// (the Trainer's factory, given the original names so weight-decay groups work) steps only
// 1-d views of those owned ranges. Per step:
//   backward   gradients are moved into fp32 buckets by hooks and reduce-scattered into the
//              owners as buckets complete (engines/zero/zero_gradients.h: stage 1 keeps the
//              full gradient and accumulates unsynced micro-batches locally; stage 2 keeps
//              none and reduces every micro-batch; stage 2 on one rank on the device holds
//              each parameter's gradient as the local engine does, bf16 when the optimizer
//              reads bf16 gradients, so it keeps no fp32 shard);
//   clip       the global norm over every rank's owned gradients (one all-reduce);
//   step       the owner updates its ranges, then every bucket is all-gathered back into the
//              replicated parameters (allgather_bucket_size elements in flight at most).
// Precision, as DeepSpeed's bf16 block: under bf16 the parameters become bf16 working copies
// (the flat buffer is bf16, 2 bytes a parameter) and each rank keeps fp32 masters of only its
// owned ranges; the step updates the masters and the all-gather spreads their bf16 rounding.
// The forward still runs under autocast (for the activations). Under fp16 and fp32 the
// parameters stay fp32 and, without offload, the owned ranges *are* the parameters' storage.
// Checkpoints see the masters: Engine::ExposeMasterWeights swaps the full fp32 values in.
// With offload_optimizer_device CPU the owned fp32 masters, their gradients and the optimizer
// state live in host memory (page-locked with offload_optimizer_pin_memory on CUDA): each
// reduced bucket is copied out on a side stream while backward goes on (its squared norm summed
// on the device meanwhile, for the clip), the step runs on the host, and the updated ranges go
// back rounded to bf16 on the host: with an optimizer that reports its progress (the Trainer's
// AdamW on its CPU path), each bucket as soon as it is stepped, while the host steps the next.
// On the CPU that path runs too (host == device, real copies).
//
//   CT_ASSIGN_OR_RETURN(auto engine, ZeroEngine::Create(config, precision, device, comm));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_ENGINES_ZERO_ZERO_ENGINE_H_
#define CPPTRAIN_ENGINES_ZERO_ZERO_ENGINE_H_

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/local/local_engine.h"
#include "engines/stepped_parameters.h"
#include "engines/zero/zero_layout.h"
#include "proto/engines.pb.h"
#include "sharding/communicator.h"

namespace cpptrain {

class ZeroGradients;
class ZeroOptimizer;

// What a rank holds, in bytes (for memory tests and reports).
struct ZeroFootprint {
  int64_t parameter_bytes = 0;  // the model's parameters (unique storages)
  int64_t host_copy_bytes = 0;  // offload under bf16: the host step's bf16 copy of the masters
  int64_t gradient_bytes = 0;   // gradient buffers alive (buckets, shard, host copy, .grad)
  int64_t optimizer_bytes = 0;  // optimizer state shaped like the pieces, plus host masters
  // The most bytes of gradient buffers (buckets, the reduced shard, a reduce-scatter's
  // output) alive at once during the backwards so far.
  int64_t peak_gradient_buffer_bytes = 0;
};

class ZeroEngine : public LocalEngine {
 public:
  // Errors: a stage other than 1 or 2 (stage 3 is Zero3Engine), fp16 off CUDA.
  static absl::StatusOr<std::unique_ptr<ZeroEngine>> Create(const proto::ZeroConfig& config,
                                                            MixedPrecision precision,
                                                            c10::Device device,
                                                            std::shared_ptr<Communicator> comm);
  ~ZeroEngine() override;

  std::string name() const override { return config_.stage() == 1 ? "zero1" : "zero2"; }
  int rank() const override { return comm_->rank(); }
  int world_size() const override { return comm_->size(); }

  absl::Status PrepareForInference(std::shared_ptr<TrainableModel> model) override;
  absl::Status PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                  const OptimizerFactory& factory) override;
  absl::Status Backward(const torch::Tensor& loss) override;
  void SetGradientSync(bool enabled) override { sync_ = enabled; }
  absl::StatusOr<torch::Tensor> ClipGradNorm(double max_norm) override;
  // Not captured yet (engines/step_capture.h).
  std::string EngineCaptureBlocker() override {
    return "ZeRO reduce-scatters and gathers its buckets with host-side bookkeeping a graph "
           "would not replay";
  }
  absl::StatusOr<bool> OptimizerStep() override;
  void ZeroGrad() override;
  void ResetOptimizer() override;
  absl::StatusOr<torch::Tensor> AllReduceSum(const torch::Tensor& values) override;
  absl::StatusOr<torch::Tensor> AllGather(const torch::Tensor& values) override;
  absl::StatusOr<bool> AllRanksFinite(bool local_finite) override;
  // Under bf16: the parameters become views of a full fp32 copy gathered from every rank's
  // masters (on the host with offload), and back to the bf16 working copies, taking what was
  // written into them as the new masters.
  absl::Status ExposeMasterWeights() override;
  absl::Status RestoreWorkingWeights() override;

  // Null before PrepareForTraining.
  const ZeroLayout* layout() const { return layout_ ? &*layout_ : nullptr; }
  ZeroFootprint Footprint() const;

 private:
  ZeroEngine(const proto::ZeroConfig& config, MixedPrecision precision, c10::Device device,
             std::shared_ptr<Communicator> comm);
  absl::Status Flatten();
  absl::Status BuildOptimizer(const OptimizerFactory& factory);
  // Every trainable parameter becomes its view of `flat` (copying its values in first).
  void PointParametersInto(const at::Tensor& flat, bool copy);
  // This rank's masters of bucket b into `mine`, its owned range of flat_ (from master_bf16_
  // when `rounded`: the optimizer's step wrote it).
  void CopyMasterInto(at::Tensor& mine, int b, bool rounded);
  // Rebuilds the host masters from the parameters when someone else wrote them (a checkpoint
  // load), detected by the parameters' version counters (the all-gather writes none of them).
  void RefreshMasters();
  // This rank's owned ranges of `flat` (a full-length buffer, any dtype) into the masters.
  void CopyOwnedIntoMasters(const at::Tensor& flat);
  int64_t ParametersVersion() const;
  struct PieceAt {
    int bucket;
    int64_t local_offset;  // in master_ and master_bf16_
  };
  // Every bucket's owned range into the others' (its masters copied in first, unless
  // `copied[b]`: the step put them there already).
  absl::Status AllGatherParameters(const std::vector<bool>& copied);
  std::vector<bool> StepCopyingBack();  // the buckets whose masters it copied into flat_
  // The step without offload under bf16 (CUDA or CPU), with an optimizer that writes bf16
  // copies in its pass (the Trainer's AdamW on its CUDA kernels or its CPU kernel): it writes
  // each piece's rounded value straight into the piece's place in flat_, so the masters need no
  // second pass to be copied there. The buckets whose every piece it wrote.
  std::vector<bool> StepWritingWorkingCopies(ReportsSteppedParameters& reports);
  bool RequestBf16Copies(ReportsSteppedParameters& reports, std::vector<int>& unwritten);
  const PieceAt& FindPiece(const at::Tensor& piece) const;  // one of the optimizer's tensors
  // Each piece's .grad becomes its parameter's owned gradient (ZeroGradients::OwnedGradient).
  void PointPiecesAtGradients();
  void ReleasePieceGradients();  // held gradients: only ZeroGradients keeps them
  at::Tensor OwnedRange(int b) const;  // this rank's range of bucket b in flat_
  // An error unless a synchronized backward filled the gradient shard since ZeroGrad.
  absl::Status CheckReduced() const;
  at::Tensor ShardSquares();
  void ScaleShard(const at::Tensor& coefficient);  // now, or in the optimizer's next step
  void CancelPendingScale();
  absl::Status CheckNoStrayGradients() const;

  proto::ZeroConfig config_;
  std::shared_ptr<Communicator> comm_;
  bool offload_ = false;
  bool pin_ = false;                     // host buffers page-locked
  at::ScalarType working_ = at::kFloat;  // the parameters' dtype (flat_)
  bool sync_ = true;
  std::vector<std::string> names_;  // trainable parameters, each tensor once
  std::vector<at::Tensor> params_;
  std::optional<ZeroLayout> layout_;
  at::Tensor flat_;              // the parameters' storage, [layout total_numel], working_
  at::Tensor master_;            // fp32 [local_numel] under offload (host) or bf16, else unset
  at::Tensor master_bf16_;       // offload under bf16: the masters rounded by the host step (page-
                                 // locked with pin_), 2 bytes per owned element
  at::Tensor exposed_;           // fp32 [total_numel] between Expose and RestoreWorkingWeights
  bool scale_pending_ = false;   // the optimizer's next step applies the clip coefficient
  int timed_steps_ = 0;           // offload steps whose host time was logged (the first two)
  int64_t params_version_ = -1;  // ParametersVersion() when the masters were last right
  std::unique_ptr<ZeroGradients> grads_;
  ZeroOptimizer* zero_optimizer_ = nullptr;  // owned by optimizer_
  std::unordered_map<const c10::TensorImpl*, PieceAt> pieces_;  // the inner optimizer's tensors
  std::vector<at::Tensor> pieces_in_order_;                     // the same, in params_ order
};

// LossScaler options from DeepSpeed's fp16 keys: loss_scale 0 is dynamic from
// 2^initial_scale_power (x2 after loss_scale_window clean steps, x0.5 after `hysteresis`
// overflows, never below min_loss_scale); loss_scale > 0 is that fixed scale (overflowing steps
// are still skipped).
LossScalerOptions ZeroLossScalerOptions(const proto::ZeroConfig& config);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ZERO_ZERO_ENGINE_H_
