#include "engines/zero/zero_engine.h"

#include <torch/torch.h>

#include <cmath>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/host_collectives.h"
#include "engines/zero/zero_gradients.h"
#include "engines/zero/zero_optimizer.h"

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
      offload_(config.offload_optimizer_device() == proto::ZeroConfig::CPU) {
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
          " but stages 1 and 2 keep fp32 parameters (bf16/fp16 run under autocast): build the "
          "model in fp32, or use zero.stage=3 / fsdp, which cast to param_dtype"));
    }
    names_.push_back(std::move(name));
    params_.push_back(std::move(param));
  }
  std::vector<int64_t> numels;
  for (const at::Tensor& p : params_) numels.push_back(p.numel());
  layout_ = BuildZeroLayout(numels, comm_->size(), comm_->rank(),
                            std::max<int64_t>(1, config_.reduce_bucket_size()), kAlignElements);
  return CatchTorch([&] {
    torch::NoGradGuard no_grad;
    flat_ = torch::zeros({layout_->total_numel},
                         torch::TensorOptions().dtype(at::kFloat).device(device_));
    for (size_t i = 0; i < params_.size(); ++i) {
      const ZeroLayout::Param& p = layout_->params[i];
      at::Tensor view = flat_.narrow(0, p.offset, p.numel).view(params_[i].sizes());
      view.copy_(params_[i].detach());
      params_[i].set_data(view);
    }
  });
}

absl::Status ZeroEngine::BuildOptimizer(const OptimizerFactory& factory) {
  NamedParameters named;
  std::vector<ZeroOptimizer::Piece> pieces;
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    torch::NoGradGuard no_grad;
    if (offload_) {
      const bool pin = config_.offload_optimizer_pin_memory() && torch::cuda::is_available();
      master_ = HostBuffer(layout_->local_numel, pin);
      host_grad_ = HostBuffer(layout_->local_numel, pin);
    }
    for (size_t i = 0; i < params_.size(); ++i) {
      const ZeroLayout::Param& p = layout_->params[i];
      // Without offload the piece is the owned range of the parameter itself.
      at::Tensor data = offload_ ? master_.narrow(0, p.local_offset, p.own_numel)
                                 : flat_.narrow(0, p.offset + p.own_begin, p.own_numel);
      at::Tensor grad =
          (offload_ ? host_grad_ : grads_->shard()).narrow(0, p.local_offset, p.own_numel);
      at::Tensor piece = torch::empty({0}, data.options());
      piece.set_data(data);
      piece.set_requires_grad(true);
      piece.mutable_grad() = grad;
      named.emplace_back(names_[i], piece);
      pieces.push_back({params_[i], piece, p.own_begin});
    }
  }));
  params_version_ = -1;  // the masters are filled from the parameters before the first step
  CT_ASSIGN_OR_RETURN(std::unique_ptr<torch::optim::Optimizer> inner, factory(named));
  auto wrapped =
      std::make_unique<ZeroOptimizer>(std::move(inner), std::move(pieces), comm_.get(), device_);
  zero_optimizer_ = wrapped.get();
  optimizer_ = std::move(wrapped);
  return absl::OkStatus();
}

absl::Status ZeroEngine::PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                            const OptimizerFactory& factory) {
  CT_RETURN_IF_ERROR(PrepareForInference(std::move(model)));
  if (optimizer_ != nullptr) return absl::OkStatus();
  if (!layout_) {
    CT_RETURN_IF_ERROR(Flatten());
    grads_ = std::make_unique<ZeroGradients>(*layout_, params_, comm_.get(), device_,
                                             /*keep_full=*/config_.stage() == 1);
    CT_RETURN_IF_ERROR(CatchTorch([&] { grads_->Install(); }));
    CT_LOG_RANK0(INFO) << "ZeRO stage " << config_.stage() << ": " << params_.size()
                       << " parameters (" << layout_->total_numel << " elements padded) in "
                       << layout_->buckets.size() << " buckets over " << comm_->size() << " ranks; "
                       << layout_->local_numel << " owned per rank"
                       << (offload_ ? ", optimizer on the host" : "");
  }
  return BuildOptimizer(factory);
}

absl::Status ZeroEngine::Backward(const torch::Tensor& loss) {
  if (grads_ == nullptr) return absl::FailedPreconditionError("Backward before PrepareForTraining");
  grads_->Begin(sync_);
  absl::Status status = LocalEngine::Backward(loss);
  absl::Status finished = grads_->Finish(status.ok());
  if (!status.ok()) return status;
  CT_RETURN_IF_ERROR(finished);
  // Offload: the optimizer's gradients are the host copy (clipping and unscaling act on it).
  if (offload_ && optimizer_ != nullptr) {
    CT_RETURN_IF_ERROR(CatchTorch([&] { host_grad_.copy_(grads_->shard()); }));
  }
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

absl::StatusOr<double> ZeroEngine::ClipGradNorm(double max_norm) {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("ClipGradNorm before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(CheckNoStrayGradients());
  CT_RETURN_IF_ERROR(UnscaleOnce());
  at::Tensor& shard = offload_ ? host_grad_ : grads_->shard();
  CT_ASSIGN_OR_RETURN(at::Tensor squares,
                      CatchTorch([&] { return shard.pow(2).sum().reshape({1}).to(at::kFloat); }));
  CT_RETURN_IF_ERROR(CatchTorch([&] { squares = squares.to(device_); }));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Work> work, comm_->AllReduce(squares, ReduceOp::kSum));
  CT_RETURN_IF_ERROR(work->Synchronize());
  return CatchTorch([&] {
    const double norm = std::sqrt(squares.cpu().item<double>());
    if (max_norm > 0) ClipByNorm({shard}, norm, max_norm);
    return norm;
  });
}

int64_t ZeroEngine::ParametersVersion() const {
  int64_t version = 0;
  for (const at::Tensor& p : params_) version += static_cast<int64_t>(p._version());
  return version;
}

void ZeroEngine::RefreshMasters() {
  if (!offload_ || ParametersVersion() == params_version_) return;
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < layout_->buckets.size(); ++b) {
    const ZeroLayout::Bucket& bucket = layout_->buckets[b];
    master_.narrow(0, bucket.local_offset, bucket.shard_numel)
        .copy_(flat_.narrow(0, layout_->OwnedBegin(b, comm_->rank()), bucket.shard_numel));
  }
  params_version_ = ParametersVersion();
}

absl::Status ZeroEngine::AllGatherParameters() {
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
    at::Tensor mine = flat_.narrow(0, layout_->OwnedBegin(b, comm_->rank()), bucket.shard_numel);
    if (offload_) {
      CT_RETURN_IF_ERROR(CatchTorch(
          [&] { mine.copy_(master_.narrow(0, bucket.local_offset, bucket.shard_numel), true); }));
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

absl::StatusOr<bool> ZeroEngine::OptimizerStep() {
  if (optimizer_ == nullptr) {
    return absl::FailedPreconditionError("OptimizerStep before PrepareForTraining");
  }
  CT_RETURN_IF_ERROR(CheckNoStrayGradients());
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
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    RefreshMasters();
    optimizer_->step();
  }));
  CT_RETURN_IF_ERROR(AllGatherParameters());
  return true;
}

void ZeroEngine::ZeroGrad() {
  if (grads_ != nullptr) grads_->Clear();
  if (offload_ && host_grad_.defined()) host_grad_.zero_();
}

void ZeroEngine::ResetOptimizer() {
  LocalEngine::ResetOptimizer();
  zero_optimizer_ = nullptr;
  master_ = at::Tensor();
  host_grad_ = at::Tensor();
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
  if (host_grad_.defined()) out.gradient_bytes += host_grad_.numel() * host_grad_.element_size();
  if (zero_optimizer_ != nullptr) out.optimizer_bytes = zero_optimizer_->StateBytes();
  if (master_.defined()) out.optimizer_bytes += master_.numel() * master_.element_size();
  return out;
}

}  // namespace cpptrain
