#include "engines/zero/zero_engine.h"

#include <torch/cuda.h>
#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <chrono>
#include <cmath>
#include <unordered_set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/gradient_scaling.h"
#include "engines/host_collectives.h"
#include "engines/stepped_parameters.h"
#include "engines/zero/zero_gradients.h"
#include "engines/zero/zero_optimizer.h"
#include "kernels/cpu_adamw.h"
#include "sharding/agreed_buffer.h"
#include "sharding/all_ranks_ok.h"

namespace cpptrain {
namespace {

constexpr int64_t kAlignElements = 4;  // 16 bytes of fp32, as FSDP1 aligns

at::Tensor HostBuffer(int64_t numel, bool pin) {
  return torch::zeros({numel}, torch::TensorOptions().dtype(at::kFloat).pinned_memory(pin));
}

}  // namespace

LossScalerOptions ZeroLossScalerOptions(const proto::ZeroConfig& config) {
  LossScalerOptions options;
  if (config.loss_scale() > 0) {
    options.initial_scale = config.loss_scale();
    options.growth_factor = 1;
    options.backoff_factor = 1;
    return options;
  }
  options.initial_scale = std::ldexp(1.0, config.initial_scale_power());
  options.growth_interval = config.loss_scale_window();
  options.hysteresis = std::max(1, config.hysteresis());
  options.min_scale = config.min_loss_scale();
  return options;
}

absl::StatusOr<std::unique_ptr<ZeroEngine>> ZeroEngine::Create(const proto::ZeroConfig& config,
                                                               MixedPrecision precision,
                                                               c10::Device device,
                                                               std::shared_ptr<Communicator> comm) {
  if (comm == nullptr) return absl::InvalidArgumentError("ZeroEngine needs a communicator");
  if (config.stage() != 1 && config.stage() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "zero.stage is ", config.stage(),
        " but this is the ZeRO stage 1/2 engine: use 1 or 2 here (stage 3 is Zero3Engine)"));
  }
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the ZeRO engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  return std::unique_ptr<ZeroEngine>(new ZeroEngine(config, precision, device, std::move(comm)));
}

ZeroEngine::ZeroEngine(const proto::ZeroConfig& config, MixedPrecision precision,
                       c10::Device device, std::shared_ptr<Communicator> comm)
    : LocalEngine(device, precision),
      config_(config),
      comm_(std::move(comm)),
      offload_(config.offload_optimizer_device() == proto::ZeroConfig::CPU),
      pin_(offload_ && config.offload_optimizer_pin_memory() && torch::cuda::is_available()),
      working_(precision == MixedPrecision::kBf16 ? at::kBFloat16 : at::kFloat) {
  if (scaler_) scaler_.emplace(ZeroLossScalerOptions(config_));
}

ZeroEngine::~ZeroEngine() = default;

absl::Status ZeroEngine::PrepareForInference(std::shared_ptr<TrainableModel> model) {
  if (model_ == model) return absl::OkStatus();
  if (model_ != nullptr) {
    return absl::FailedPreconditionError(
        "the ZeRO engine already holds another model: use one engine per model");
  }
  CT_RETURN_IF_ERROR(LocalEngine::PrepareForInference(std::move(model)));
  // Rank 0's values win, as with DDP (and DeepSpeed's initialize).
  std::vector<at::Tensor> state = model_->parameters();
  for (const auto& b : model_->buffers()) state.push_back(b);
  return BroadcastFromRank0(*comm_, state);
}

absl::Status ZeroEngine::Flatten() {
  for (auto& [name, param] : UniqueTrainableParameters(*model_)) {
    if (param.scalar_type() != at::kFloat) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ZeRO stage ", config_.stage(), ": parameter ", name, " is ",
          c10::toString(param.scalar_type()),
          " but stages 1 and 2 take the model in fp32 (the optimizer's masters; under bf16 they "
          "make the bf16 working copies themselves): build the model in fp32, or use "
          "zero.stage=3 / fsdp, which cast to param_dtype"));
    }
    names_.push_back(std::move(name));
    params_.push_back(std::move(param));
  }
  std::vector<int64_t> numels;
  for (const at::Tensor& p : params_) numels.push_back(p.numel());
  layout_ = BuildZeroLayout(numels, comm_->size(), comm_->rank(),
                            std::max<int64_t>(1, config_.reduce_bucket_size()), kAlignElements);
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    torch::NoGradGuard no_grad;
    if (offload_ || working_ != at::kFloat) {
      master_ = offload_ ? HostBuffer(layout_->local_numel, pin_)
                         : torch::zeros({layout_->local_numel},
                                        torch::TensorOptions().dtype(at::kFloat).device(device_));
      for (size_t i = 0; i < params_.size(); ++i) {  // from the fp32 values, before any rounding
        const ZeroLayout::Param& p = layout_->params[i];
        master_.narrow(0, p.local_offset, p.own_numel)
            .copy_(params_[i].detach().reshape({-1}).narrow(0, p.own_begin, p.own_numel));
      }
    }
    flat_ = torch::zeros({layout_->total_numel},
                         torch::TensorOptions().dtype(working_).device(device_));
    PointParametersInto(flat_, /*copy=*/true);
  }));
  params_version_ = ParametersVersion();
  return absl::OkStatus();
}

void ZeroEngine::PointParametersInto(const at::Tensor& flat, bool copy) {
  for (size_t i = 0; i < params_.size(); ++i) {
    const ZeroLayout::Param& p = layout_->params[i];
    at::Tensor view = flat.narrow(0, p.offset, p.numel).view(params_[i].sizes());
    if (copy) view.copy_(params_[i].detach());
    params_[i].set_data(view);
  }
}

absl::Status ZeroEngine::BuildOptimizer(const OptimizerFactory& factory) {
  NamedParameters named;
  std::vector<ZeroOptimizer::Piece> pieces;
  pieces_.clear();
  pieces_in_order_.clear();
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      const ZeroLayout::Param& p = layout_->params[i];
      // Without a separate master the piece is the owned range of the parameter itself.
      at::Tensor data = master_.defined() ? master_.narrow(0, p.local_offset, p.own_numel)
                                          : flat_.narrow(0, p.offset + p.own_begin, p.own_numel);
      at::Tensor piece = torch::empty({0}, data.options());
      piece.set_data(data);
      piece.set_requires_grad(true);
      named.emplace_back(names_[i], piece);
      pieces_in_order_.push_back(piece);
      pieces_[piece.unsafeGetTensorImpl()] = {p.bucket, p.local_offset};
      pieces.push_back({params_[i], piece, p.own_begin});
    }
  }));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> inner, factory(named));
  auto wrapped =
      std::make_unique<ZeroOptimizer>(std::move(inner), std::move(pieces), comm_.get(), device_);
  zero_optimizer_ = wrapped.get();
  optimizer_ = std::move(wrapped);
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(&zero_optimizer_->inner());
  grads_->HoldBf16(scaling != nullptr && scaling->ReadsBf16Gradients());
  return CatchTorch([&] { PointPiecesAtGradients(); });
}

void ZeroEngine::PointPiecesAtGradients() {
  for (size_t i = 0; i < pieces_in_order_.size(); ++i) {
    pieces_in_order_[i].mutable_grad() = grads_->OwnedGradient(static_cast<int>(i));
  }
}

void ZeroEngine::ReleasePieceGradients() {
  for (at::Tensor& piece : pieces_in_order_) piece.mutable_grad() = at::Tensor();
}

absl::Status ZeroEngine::PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                            const OptimizerFactory& factory) {
  CT_RETURN_IF_ERROR(PrepareForInference(std::move(model)));
  if (optimizer_ != nullptr) return absl::OkStatus();
  if (!layout_) {
    CT_RETURN_IF_ERROR(Flatten());
    const ZeroGradients::ShardPlace shard_place{offload_ ? c10::Device(c10::kCPU) : device_, pin_,
                                                /*reduce_squares=*/offload_};
    grads_ = std::make_unique<ZeroGradients>(*layout_, params_, comm_.get(), device_,
                                             /*keep_full=*/config_.stage() == 1, shard_place);
    CT_RETURN_IF_ERROR(CatchTorch([&] { grads_->Install(); }));
    CT_LOG_RANK0(INFO) << "ZeRO stage " << config_.stage() << ": " << params_.size()
                       << " parameters (" << layout_->total_numel << " elements padded) in "
                       << layout_->buckets.size() << " buckets over " << comm_->size() << " ranks; "
                       << layout_->local_numel << " owned per rank"
                       << (offload_ ? ", optimizer on the host" : "")
                       << (working_ != at::kFloat ? ", bf16 working parameters" : "");
  }
  return BuildOptimizer(factory);
}

absl::Status ZeroEngine::Backward(const torch::Tensor& loss) {
  if (grads_ == nullptr) return absl::FailedPreconditionError("Backward before PrepareForTraining");
  // A second micro-batch replaces held bf16 gradients by fp32 sums: the pieces must not keep
  // the bf16 ones alive meanwhile.
  if (grads_->held()) ReleasePieceGradients();
  grads_->Begin(sync_);
  absl::Status status = LocalEngine::Backward(loss);
  absl::Status finished = grads_->Finish(status.ok());
  if (!status.ok()) return status;
  CT_RETURN_IF_ERROR(finished);
  // Held gradients are new tensors each backward (the shard's views stay where they are).
  if (grads_->held()) return CatchTorch([&] { PointPiecesAtGradients(); });
  return absl::OkStatus();
}

absl::Status ZeroEngine::CheckNoStrayGradients() const {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].grad().defined()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", comm_->rank(), ": ZeRO: parameter ", names_[i],
          " has a gradient from a backward that did not go through Engine::Backward, so no rank "
          "reduced it: call engine()->Backward(loss) instead of loss.backward()"));
    }
  }
  return absl::OkStatus();
}

// The sum of squares of this rank's gradient shard. With offload, the one summed on the device
// as the buckets were reduced, where it still describes the shard (not under fp16, whose unscale
// wrote the shard since); else on the host through kernels/cpu_adamw.h's threaded pass (ATen's
// norm of a 12 GB host tensor ran at 12 GB/s on the H200 host; ours, 300 ms), on the device as
// a norm reduction (no temporary the size of the shard). Held gradients: the local engine's norm.
at::Tensor ZeroEngine::ShardSquares() {
  if (grads_->held()) {
    return GlobalNorm(grads_->OwnedGradients()).square().reshape({1}).to(device_);
  }
  if (!scaler_) {
    at::Tensor reduced = grads_->ReducedSquares();
    if (reduced.defined()) return reduced;
  }
  const at::Tensor& shard = grads_->shard();
  if (!shard.is_cuda()) {
    const double sum = kernels::CpuSumOfSquares(shard.data_ptr<float>(), shard.numel());
    return torch::full({1}, sum, torch::TensorOptions().dtype(at::kFloat)).to(device_);
  }
  return shard.norm().square().reshape({1}).to(at::kFloat);
}

void ZeroEngine::CancelPendingScale() {
  if (!scale_pending_ || zero_optimizer_ == nullptr) return;
  if (auto* scaling = dynamic_cast<ScalesGradientsInStep*>(&zero_optimizer_->inner())) {
    scaling->ScaleGradientsInNextStep(torch::Tensor());
  }
  scale_pending_ = false;
}

// The shard scaled by `coefficient` (a 0-dim float64 tensor: on the host for offload, else on
// the device), or the coefficient handed to the optimizer's next step (engines/gradient_scaling.h),
// which saves a pass over the shard.
void ZeroEngine::ScaleShard(const at::Tensor& coefficient) {
  auto* scaling = dynamic_cast<ScalesGradientsInStep*>(&zero_optimizer_->inner());
  if (scaling != nullptr && scaling->ScaleGradientsInNextStep(coefficient)) {
    scale_pending_ = true;
    return;
  }
  ScaleGradients(grads_->OwnedGradients(), coefficient);
  grads_->ShardWritten();
}

absl::Status ZeroEngine::CheckReduced() const {
  if (grads_->AllReduced()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", comm_->rank(),
      ": ZeRO: no synchronized backward since ZeroGrad, so this rank "
      "holds no reduced gradients to clip or step with: run Engine::Backward with gradient "
      "synchronization on (SetGradientSync(true), the last micro-batch of a step) first"));
}

absl::StatusOr<torch::Tensor> ZeroEngine::ClipGradNorm(double max_norm) {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("ClipGradNorm before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(CheckNoStrayGradients());
  CT_RETURN_IF_ERROR(CheckReduced());
  CT_RETURN_IF_ERROR(UnscaleOnce());
  CancelPendingScale();  // clipping again: the norm is of the unscaled gradients
  const auto start = std::chrono::steady_clock::now();
  CT_ASSIGN_OR_RETURN(at::Tensor squares, CatchTorch([&] { return ShardSquares(); }));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm_->AllReduce(squares, ReduceOp::kSum));
  if (!offload_) {
    // The shard is on the device: the norm, the coefficient and the scaling stay there.
    CT_RETURN_IF_ERROR(work->Wait());  // the current stream waits; the host does not
    return CatchTorch([&] {
      torch::Tensor norm = squares.reshape({}).to(at::kDouble).sqrt();  // as std::sqrt would
      if (max_norm > 0) ScaleShard(ClipCoefficient(norm, max_norm));
      return norm;
    });
  }
  // Offload: the host step takes the coefficient, so the host reads the norm.
  CT_RETURN_IF_ERROR(work->Synchronize());
  return CatchTorch([&] {
    const double norm = std::sqrt(squares.cpu().item<double>());
    const double coefficient = max_norm > 0 ? ClipCoefficient(norm, max_norm) : 1.0;
    if (coefficient < 1.0) ScaleShard(torch::scalar_tensor(coefficient, torch::kDouble));
    if (offload_ && timed_steps_ < 2) {
      CT_LOG_RANK0(INFO) << "ZeRO offload clip: norm and clipping "
                         << std::chrono::duration<double, std::milli>(
                                std::chrono::steady_clock::now() - start)
                                .count()
                         << " ms" << (scale_pending_ ? " (scaling in the optimizer's step)" : "");
    }
    return torch::scalar_tensor(norm, torch::kDouble);
  });
}

int64_t ZeroEngine::ParametersVersion() const {
  int64_t version = 0;
  for (const at::Tensor& p : params_) version += static_cast<int64_t>(p._version());
  return version;
}

void ZeroEngine::RefreshMasters() {
  if (!master_.defined() || ParametersVersion() == params_version_) return;
  CopyOwnedIntoMasters(flat_);
  params_version_ = ParametersVersion();
}

void ZeroEngine::CopyOwnedIntoMasters(const at::Tensor& flat) {
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < layout_->buckets.size(); ++b) {
    const ZeroLayout::Bucket& bucket = layout_->buckets[b];
    master_.narrow(0, bucket.local_offset, bucket.shard_numel)
        .copy_(flat.narrow(0, layout_->OwnedBegin(b, comm_->rank()), bucket.shard_numel));
  }
}

absl::Status ZeroEngine::AllGatherParameters(const std::vector<bool>& copied) {
  torch::NoGradGuard no_grad;
  const int64_t limit = std::max<int64_t>(1, config_.allgather_bucket_size());
  std::vector<std::unique_ptr<Work>> in_flight;
  int64_t in_flight_numel = 0;
  for (size_t b = 0; b < layout_->buckets.size(); ++b) {
    const ZeroLayout::Bucket& bucket = layout_->buckets[b];
    if (!in_flight.empty() && in_flight_numel + bucket.numel > limit) {
      for (auto& work : in_flight) CT_RETURN_IF_ERROR(work->Wait());
      in_flight.clear();
      in_flight_numel = 0;
    }
    at::Tensor mine = OwnedRange(b);
    if (master_.defined() && !copied[b]) {
      CT_RETURN_IF_ERROR(CatchTorch([&] { CopyMasterInto(mine, b, /*rounded=*/false); }));
    }
    at::Tensor full = flat_.narrow(0, bucket.begin, bucket.numel);
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm_->AllGather(mine, full));
    in_flight.push_back(std::move(work));
    in_flight_numel += bucket.numel;
  }
  for (auto& work : in_flight) CT_RETURN_IF_ERROR(work->Wait());
  params_version_ = ParametersVersion();
  return absl::OkStatus();
}

at::Tensor ZeroEngine::OwnedRange(int b) const {
  return flat_.narrow(0, layout_->OwnedBegin(b, comm_->rank()), layout_->buckets[b].shard_numel);
}

const ZeroEngine::PieceAt& ZeroEngine::FindPiece(const at::Tensor& piece) const {
  auto it = pieces_.find(piece.unsafeGetTensorImpl());
  TORCH_CHECK(it != pieces_.end(),
              "ZeRO: the optimizer stepped a tensor that is not one of the engine's pieces (the "
              "optimizer factory must step the tensors it is given)");
  return it->second;
}

// The step. With offload and an optimizer that reports each parameter it has stepped
// (engines/stepped_parameters.h: the Trainer's AdamW on its CPU kernel path), each bucket's
// masters are copied into their working range once its last piece is stepped, so the copies to
// the device overlap the host's work on the next buckets. Under bf16 that step also rounds each
// master into master_bf16_, and a bucket whose pieces were all written goes from there.
std::vector<bool> ZeroEngine::StepCopyingBack() {
  const size_t buckets = layout_->buckets.size();
  std::vector<bool> copied(buckets, false);
  auto* reports = dynamic_cast<ReportsSteppedParameters*>(&zero_optimizer_->inner());
  if (!offload_ && master_.defined() && working_ == at::kBFloat16 && reports != nullptr) {
    return StepWritingWorkingCopies(*reports);
  }
  if (!offload_ || !master_.defined() || reports == nullptr) {
    optimizer_->step();
    return copied;
  }
  absl::Cleanup forget = [reports] {  // nothing stays pending past this step if it throws
    reports->ReportEachParameterInNextStep(nullptr);
    reports->WriteBf16CopiesInNextStep(nullptr);
  };
  std::vector<int> left(buckets, 0);  // per bucket: pieces not stepped yet
  for (const auto& [impl, piece] : pieces_) ++left[piece.bucket];
  std::vector<int> unwritten = left;  // per bucket: pieces whose bf16 copy is not asked for
  if (working_ != at::kBFloat16 || !RequestBf16Copies(*reports, unwritten)) unwritten.clear();
  reports->ReportEachParameterInNextStep([&](const at::Tensor& piece) {
    const int b = FindPiece(piece).bucket;
    if (--left[b] > 0) return;
    at::Tensor mine = OwnedRange(b);
    CopyMasterInto(mine, b, /*rounded=*/!unwritten.empty() && unwritten[b] == 0);
    copied[b] = true;
  });
  optimizer_->step();
  return copied;
}

std::vector<bool> ZeroEngine::StepWritingWorkingCopies(ReportsSteppedParameters& reports) {
  // The pieces whose copy was asked for, each once however often the optimizer asks.
  std::unordered_set<const c10::TensorImpl*> written;
  absl::Cleanup forget = [&reports] { reports.WriteBf16CopiesInNextStep(nullptr); };
  const bool asked = reports.WriteBf16CopiesInNextStep([this, &written](const at::Tensor& piece) {
    const PieceAt& at = FindPiece(piece);
    written.insert(piece.unsafeGetTensorImpl());
    const int64_t within = at.local_offset - layout_->buckets[at.bucket].local_offset;
    return OwnedRange(at.bucket).narrow(0, within, piece.numel());
  });
  optimizer_->step();
  std::vector<bool> copied(layout_->buckets.size(), asked);
  for (const auto& [impl, piece] : pieces_) {
    if (written.count(impl) == 0) copied[piece.bucket] = false;
  }
  return copied;
}

bool ZeroEngine::RequestBf16Copies(ReportsSteppedParameters& reports, std::vector<int>& unwritten) {
  if (!master_bf16_.defined()) {  // zeros: the padding between pieces is never written
    master_bf16_ = torch::zeros({layout_->local_numel},
                                torch::TensorOptions().dtype(working_).pinned_memory(pin_));
  }
  // The last step's copies to the device read master_bf16_ without the host waiting for them.
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
  return reports.WriteBf16CopiesInNextStep([this, &unwritten](const at::Tensor& piece) {
    const PieceAt& at = FindPiece(piece);
    --unwritten[at.bucket];
    return master_bf16_.narrow(0, at.local_offset, piece.numel());
  });
}

void ZeroEngine::CopyMasterInto(at::Tensor& mine, int b, bool rounded) {
  const ZeroLayout::Bucket& bucket = layout_->buckets[b];
  if (rounded) {  // not written again before the next step synchronizes with the device
    mine.copy_(master_bf16_.narrow(0, bucket.local_offset, bucket.shard_numel),
               /*non_blocking=*/true);
    return;
  }
  const at::Tensor master = master_.narrow(0, bucket.local_offset, bucket.shard_numel);
  if (!offload_ || working_ == at::kFloat || !mine.is_cuda()) {
    // fp32 offload: master_ is read by this copy while the host goes on; the next write of it
    // is the next step, after the next backward's copies out (queued behind this one) landed.
    mine.copy_(master, /*non_blocking=*/true);
    return;
  }
  // The host rounds to the working dtype, so half the bytes cross the bus; the page-locked
  // staging block is not reused before the copy is done (the host allocator records it).
  at::Tensor staging = torch::empty({bucket.shard_numel},
                                    torch::TensorOptions().dtype(working_).pinned_memory(pin_));
  staging.copy_(master);
  mine.copy_(staging, /*non_blocking=*/true);
}

absl::Status ZeroEngine::ExposeMasterWeights() {
  if (!layout_ || !master_.defined() || working_ == at::kFloat) return absl::OkStatus();
  if (exposed_.defined()) {
    return absl::FailedPreconditionError(
        "ExposeMasterWeights called twice: call RestoreWorkingWeights after each one");
  }
  // In host memory, whatever the device: a save or load must not need 4 bytes a parameter of
  // free device memory. The buckets are gathered through one device buffer the size of the
  // largest. Both are allocated before the first gather and agreed on, and a failed copy still
  // takes part in every gather, so one rank out of memory never leaves the others in one. The
  // parameters change only once everything is gathered, so an error leaves them as they were.
  at::Tensor full;
  CT_RETURN_IF_ERROR(AllRanksOk(*this, CatchTorch([&] {
                                  RefreshMasters();  // when the working copies were written
                                  full = torch::empty({layout_->total_numel},
                                                      torch::TensorOptions().dtype(at::kFloat));
                                })));
  int64_t most = 1;
  for (const ZeroLayout::Bucket& bucket : layout_->buckets) {
    most = std::max(most, bucket.numel + bucket.shard_numel);
  }
  CT_ASSIGN_OR_RETURN(const at::Tensor staging,
                      AllocateOnEveryRank(*this, most * static_cast<int64_t>(sizeof(float)),
                                          device_, "gathering the fp32 masters"));
  torch::NoGradGuard no_grad;
  absl::Status copied;  // this rank's first failed copy
  for (const ZeroLayout::Bucket& bucket : layout_->buckets) {
    at::Tensor both = StagingView(staging, {bucket.numel + bucket.shard_numel}, at::kFloat);
    at::Tensor gathered = both.narrow(0, 0, bucket.numel);
    at::Tensor mine = both.narrow(0, bucket.numel, bucket.shard_numel);
    if (copied.ok()) {
      copied = CatchTorch(
          [&] { mine.copy_(master_.narrow(0, bucket.local_offset, bucket.shard_numel)); });
    }
    CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm_->AllGather(mine, gathered));
    CT_RETURN_IF_ERROR(work->Wait());
    if (copied.ok()) {
      copied = CatchTorch([&] { full.narrow(0, bucket.begin, bucket.numel).copy_(gathered); });
    }
  }
  CT_RETURN_IF_ERROR(AllRanksOk(*this, copied));
  CT_RETURN_IF_ERROR(CatchTorch([&] { PointParametersInto(full, /*copy=*/false); }));
  exposed_ = std::move(full);
  return absl::OkStatus();
}

absl::Status ZeroEngine::RestoreWorkingWeights() {
  if (!exposed_.defined()) return absl::OkStatus();
  absl::Status restored = CatchTorch([&] {
    torch::NoGradGuard no_grad;
    CopyOwnedIntoMasters(exposed_);
    flat_.copy_(exposed_);
    PointParametersInto(flat_, /*copy=*/false);
    // set_data to another dtype or device gave the parameters new gradient accumulators.
    grads_->Reinstall();
  });
  exposed_ = at::Tensor();
  params_version_ = ParametersVersion();
  return restored;
}

absl::StatusOr<bool> ZeroEngine::OptimizerStep() {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("OptimizerStep before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(CheckNoStrayGradients());
  CT_RETURN_IF_ERROR(CheckReduced());
  if (scaler_) {
    CT_RETURN_IF_ERROR(UnscaleOnce());
    grads_unscaled_ = false;
    scaler_->Update(grads_finite_);
    if (!grads_finite_) {
      LOG(WARNING) << "fp16 gradients overflowed: step skipped, loss scale now "
                   << scaler_->scale();
      return false;
    }
  }
  const auto start = std::chrono::steady_clock::now();
  std::vector<bool> copied;
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    RefreshMasters();
    copied = StepCopyingBack();
  }));
  scale_pending_ = false;
  const auto stepped = std::chrono::steady_clock::now();
  CT_RETURN_IF_ERROR(AllGatherParameters(copied));
  if (offload_ && timed_steps_ < 2) {  // the warm-up steps of a run: where the host time goes
    ++timed_steps_;
    if (device_.is_cuda()) torch::cuda::synchronize(device_.index());
    const auto ms = [](auto d) { return std::chrono::duration<double, std::milli>(d).count(); };
    CT_LOG_RANK0(INFO) << "ZeRO offload step " << timed_steps_ << ": host optimizer "
                       << ms(stepped - start) << " ms, copy back + all-gather "
                       << ms(std::chrono::steady_clock::now() - stepped) << " ms, "
                       << at::get_num_threads() << " host threads";
  }
  return true;
}

void ZeroEngine::ZeroGrad() {
  if (grads_ != nullptr) grads_->Clear();
  // Held gradients are freed only once the pieces let go of them too.
  if (grads_ != nullptr && grads_->held()) ReleasePieceGradients();
  CancelPendingScale();  // a step skipped after the clip (fp16 overflow)
}

void ZeroEngine::ResetOptimizer() {
  LocalEngine::ResetOptimizer();
  zero_optimizer_ = nullptr;  // the masters stay: they are the parameters' values
  pieces_.clear();
  pieces_in_order_.clear();
  if (scaler_) scaler_.emplace(ZeroLossScalerOptions(config_));
}

absl::StatusOr<bool> ZeroEngine::AllRanksFinite(bool local_finite) {
  return AllRanksFiniteOver({comm_.get()}, device_, local_finite);
}

absl::StatusOr<torch::Tensor> ZeroEngine::AllReduceSum(const torch::Tensor& values) {
  return AllReduceSumOver({comm_.get()}, device_, values);
}

absl::StatusOr<torch::Tensor> ZeroEngine::AllGather(const torch::Tensor& values) {
  return AllGatherOver({comm_.get()}, device_, values);
}

ZeroFootprint ZeroEngine::Footprint() const {
  ZeroFootprint out;
  if (model_ == nullptr) return out;
  std::unordered_set<const void*> storages;
  for (const at::Tensor& p : model_->parameters()) {
    const auto& storage = p.storage();
    if (storages.insert(storage.unsafeGetStorageImpl()).second) {
      out.parameter_bytes += static_cast<int64_t>(storage.nbytes());
    }
  }
  if (grads_ != nullptr) {
    out.gradient_bytes = grads_->LiveBytes();
    out.peak_gradient_buffer_bytes = grads_->peak_buffer_bytes();
  }
  if (zero_optimizer_ != nullptr) out.optimizer_bytes = zero_optimizer_->StateBytes();
  if (master_.defined()) out.optimizer_bytes += master_.numel() * master_.element_size();
  if (master_bf16_.defined()) {
    out.host_copy_bytes = master_bf16_.numel() * master_bf16_.element_size();
  }
  return out;
}

}  // namespace cpptrain
