#include "engines/ddp/ddp_engine.h"

#include <algorithm>
#include <mutex>
#include <utility>

#include <torch/csrc/autograd/function.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/hook_owner.h"
#include "engines/host_collectives.h"
#include "engines/working_parameters.h"

namespace cpptrain {

struct DdpEngine::Reducer {
  struct Bucket {
    at::Tensor buffer;        // flat; each parameter's .grad is a view of it
    std::vector<int> params;  // indices into `params`
    int pending = 0;          // gradients not yet accumulated in this backward
    std::unique_ptr<Work> work;
  };

  Communicator* comm = nullptr;
  WorkingParameters* working = nullptr;  // bf16 working copies: buckets hold the masters' grads
  const bool* sync = nullptr;
  bool find_unused = false;
  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::vector<int> bucket_of;
  std::vector<Bucket> buckets;  // launch order
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // keeps the hooks alive

  std::mutex mu;
  std::vector<bool> ready;
  size_t next_to_launch = 0;
  bool in_backward = false;     // inside a synchronized Engine::Backward
  bool stray_backward = false;  // gradients came from a backward that bypassed Backward()
  absl::Status error;
  HookOwner<Reducer> hooks{this};  // last: cleared first, so hooks outliving the engine stop

  // Nothing ready, nothing launched: the state at the start of a synchronized backward.
  void BeginLocked() {
    in_backward = true;
    std::fill(ready.begin(), ready.end(), false);
    for (Bucket& b : buckets) b.pending = static_cast<int>(b.params.size());
    next_to_launch = 0;
  }

  void MarkReadyLocked(int index) {
    if (ready[index]) return;
    ready[index] = true;
    --buckets[bucket_of[index]].pending;
  }

  // Buckets go out strictly in order, so every rank issues the same collectives.
  void LaunchReadyLocked() {
    while (next_to_launch < buckets.size() && buckets[next_to_launch].pending == 0) {
      Bucket& b = buckets[next_to_launch++];
      absl::StatusOr<std::unique_ptr<Work>> work = comm->AllReduce(b.buffer, ReduceOp::kSum);
      if (!work.ok()) {
        if (error.ok()) error = work.status();
        continue;
      }
      b.work = std::move(*work);
    }
  }

  // Called from the hook on parameter `index`'s gradient accumulator, also from inside a
  // nested backward (a recomputed layer's). Outside a synchronized Engine::Backward the
  // gradient only accumulates locally; with synchronization on, that is remembered so the
  // step refuses to use gradients no rank reduced.
  void OnGradientAccumulated(int index) {
    if (!*sync) return;
    std::lock_guard<std::mutex> lock(mu);
    if (!in_backward) {
      stray_backward = true;
      return;
    }
    MarkReadyLocked(index);
    LaunchReadyLocked();
  }

  // After the whole backward has returned (never from inside it: a nested backward of a
  // recomputed layer ends long before the outer one). When the backward failed, only waits
  // for what was launched, so no collective still reads the buckets.
  void Finalize(bool backward_ok) {
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::string> unused;
    for (size_t i = 0; i < params.size() && backward_ok; ++i) {
      if (!ready[i]) unused.push_back(names[i]);
    }
    if (!unused.empty() && find_unused) {
      if (working != nullptr) working->ZeroUnmoved();  // their bucket ranges hold old gradients
      for (size_t i = 0; i < params.size(); ++i) MarkReadyLocked(static_cast<int>(i));
      LaunchReadyLocked();
    } else if (!unused.empty() && error.ok()) {
      error = absl::FailedPreconditionError(absl::StrCat(
          "rank ", comm->rank(), ": DDP: ", unused.size(),
          " parameter(s) received no gradient in this backward: ", absl::StrJoin(unused, ", "),
          ". With ddp.find_unused_parameters=false every parameter must take part in the loss:"
          " set ddp.find_unused_parameters=true, or freeze them (requires_grad=false)"));
    }
    for (size_t i = 0; i < next_to_launch; ++i) {
      if (buckets[i].work == nullptr) continue;
      absl::Status waited = buckets[i].work->Wait();
      if (!waited.ok() && error.ok()) error = waited;
      buckets[i].work.reset();
    }
    in_backward = false;
  }

  // Forgets a backward that did not complete (an out-of-memory retry): nothing in flight,
  // nothing ready.
  void Reset() {
    std::lock_guard<std::mutex> lock(mu);
    for (Bucket& b : buckets) {
      if (b.work != nullptr) (void)b.work->Wait();
      b.work.reset();
    }
    in_backward = false;
    stray_backward = false;
    error = absl::OkStatus();
  }
};

namespace {

// The parameters in `units` (FlatOrderUnits, reversed: roughly the order backward produces
// gradients), grouped into buckets of up to `cap_bytes` and of one dtype. A unit (the model's
// adjacent set, which one backward node fills together) stays in one bucket: it starts a new one
// where it would overflow the cap, and a bucket it alone exceeds holds it alone. Only a change
// of dtype inside a unit splits it (never with working copies: every master is fp32).
std::vector<std::vector<int>> GroupIntoBuckets(const std::vector<at::Tensor>& params,
                                               const std::vector<std::vector<int>>& units,
                                               int64_t cap_bytes) {
  std::vector<std::vector<int>> groups;
  int64_t bytes = 0;
  auto dtype_of = [&](int i) { return params[i].scalar_type(); };
  for (const std::vector<int>& unit : units) {
    int64_t size = 0;
    for (int i : unit) size += params[i].numel() * params[i].element_size();
    for (size_t k = 0; k < unit.size(); ++k) {
      const int i = unit[k];
      const bool over = k == 0 && !groups.empty() && bytes + size > cap_bytes;
      if (groups.empty() || over || dtype_of(groups.back()[0]) != dtype_of(i)) {
        groups.emplace_back();
        bytes = 0;
      }
      groups.back().push_back(i);
    }
    bytes += size;
  }
  return groups;
}

// Each bucket's buffer: with working copies a range of their fp32 gradient buffer (laid out in
// bucket order), else its own, and each parameter's .grad a view of it; then the hooks that
// mark gradients ready (with working copies, theirs call OnGradientAccumulated).
void BuildBuckets(DdpEngine::Reducer& reducer, const std::vector<std::vector<int>>& groups) {
  for (const std::vector<int>& group : groups) {
    DdpEngine::Reducer::Bucket bucket;
    int64_t numel = 0;
    for (int i : group) numel += reducer.params[i].numel();
    if (reducer.working != nullptr) {
      const int64_t begin = reducer.working->offset(group[0]);
      bucket.buffer = reducer.working->gradients().narrow(0, begin, numel);
    } else {
      bucket.buffer = torch::zeros({numel}, reducer.params[group[0]].options());
    }
    int64_t offset = 0;
    for (int i : group) {
      at::Tensor& p = reducer.params[i];
      if (reducer.working == nullptr) {
        p.mutable_grad() = bucket.buffer.narrow(0, offset, p.numel()).view(p.sizes());
      }
      offset += p.numel();
      reducer.bucket_of[i] = static_cast<int>(reducer.buckets.size());
    }
    bucket.params = group;
    reducer.buckets.push_back(std::move(bucket));
  }
  if (reducer.working != nullptr) return;
  reducer.accumulators =
      InstallGradientHooks<DdpEngine::Reducer, &DdpEngine::Reducer::OnGradientAccumulated>(
          reducer.params, reducer.hooks.handle());
}

}  // namespace

absl::StatusOr<std::unique_ptr<DdpEngine>> DdpEngine::Create(const proto::DdpConfig& config,
                                                             MixedPrecision precision,
                                                             c10::Device device,
                                                             std::shared_ptr<Communicator> comm) {
  if (comm == nullptr) return absl::InvalidArgumentError("DdpEngine needs a communicator");
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the DDP engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  return std::unique_ptr<DdpEngine>(new DdpEngine(config, precision, device, std::move(comm)));
}

DdpEngine::DdpEngine(const proto::DdpConfig& config, MixedPrecision precision, c10::Device device,
                     std::shared_ptr<Communicator> comm)
    : LocalEngine(device, precision, config.bf16_working_copies()),
      config_(config),
      comm_(std::move(comm)) {}

DdpEngine::~DdpEngine() = default;

absl::Status DdpEngine::BroadcastState() {
  std::vector<at::Tensor> tensors;
  for (const auto& p : model_->parameters()) tensors.push_back(p);
  for (const auto& b : model_->buffers()) tensors.push_back(b);
  return BroadcastFromRank0(*comm_, tensors);
}

std::unique_ptr<ForwardScope> DdpEngine::EnterForward() {
  // PyTorch's broadcast_buffers: buffers a forward may update (running statistics) follow
  // rank 0's at every training forward. The Trainer calls this inside its error boundary.
  if (config_.broadcast_buffers() && model_ != nullptr && model_->is_training() &&
      at::GradMode::is_enabled()) {
    const std::vector<at::Tensor> buffers = model_->buffers();
    if (!buffers.empty()) {
      const absl::Status status = BroadcastFromRank0(*comm_, buffers);
      TORCH_CHECK(status.ok(), "DDP broadcast_buffers: ", status.ToString());
    }
  }
  return LocalEngine::EnterForward();
}

absl::Status DdpEngine::PrepareForInference(std::shared_ptr<TrainableModel> model) {
  CT_RETURN_IF_ERROR(LocalEngine::PrepareForInference(std::move(model)));
  if (!broadcast_done_) {
    CT_RETURN_IF_ERROR(BroadcastState());
    broadcast_done_ = true;
  }
  return absl::OkStatus();
}

absl::Status DdpEngine::PrepareForTraining(std::shared_ptr<TrainableModel> model,
                                           const OptimizerFactory& factory) {
  CT_RETURN_IF_ERROR(PrepareForInference(model));
  if (reducer_ != nullptr) return LocalEngine::PrepareForTraining(std::move(model), factory);
  auto reducer = std::make_unique<Reducer>();
  reducer->comm = comm_.get();
  reducer->sync = &sync_;
  reducer->find_unused = config_.find_unused_parameters();
  for (auto& [name, param] : UniqueTrainableParameters(*model_)) {
    reducer->names.push_back(std::move(name));
    reducer->params.push_back(std::move(param));
  }
  const int64_t cap_bytes = static_cast<int64_t>(config_.bucket_cap_mb() * 1024 * 1024);
  reducer->bucket_of.assign(reducer->params.size(), -1);
  const std::vector<std::vector<int>> groups =
      GroupIntoBuckets(reducer->params, FlatUnits(/*reversed=*/true), cap_bytes);
  if (WantsWorkingCopies()) {
    std::vector<int> order;
    for (const std::vector<int>& group : groups) {
      order.insert(order.end(), group.begin(), group.end());
    }
    Reducer* r = reducer.get();
    CT_RETURN_IF_ERROR(MakeWorkingCopies(std::move(order), /*flat_gradients=*/true,
                                         [r](int i) { r->OnGradientAccumulated(i); }));
    reducer->working = working_.get();
  }
  CT_RETURN_IF_ERROR(CatchTorch([&] { BuildBuckets(*reducer, groups); }));
  reducer->ready.assign(reducer->params.size(), false);
  reducer_ = std::move(reducer);
  CT_LOG_RANK0(INFO) << "DDP: " << reducer_->params.size() << " parameters in "
                     << reducer_->buckets.size() << " buckets of up to "
                     << config_.bucket_cap_mb() << " MiB over " << comm_->size() << " ranks ("
                     << comm_->backend() << ")";
  return LocalEngine::PrepareForTraining(model_, factory);
}

absl::Status DdpEngine::Backward(const torch::Tensor& loss) {
  if (!sync_ || reducer_ == nullptr) return LocalEngine::Backward(loss);
  {
    std::lock_guard<std::mutex> lock(reducer_->mu);
    reducer_->BeginLocked();
  }
  absl::Status status = LocalEngine::Backward(loss);
  reducer_->Finalize(status.ok());
  std::lock_guard<std::mutex> lock(reducer_->mu);
  absl::Status error = std::move(reducer_->error);
  reducer_->error = absl::OkStatus();
  return status.ok() ? error : status;
}

absl::Status DdpEngine::CheckGradientsSynchronized() {
  if (reducer_ == nullptr) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(reducer_->mu);
  if (!reducer_->stray_backward) return absl::OkStatus();
  reducer_->stray_backward = false;
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", comm_->rank(),
      ": DDP: gradients were computed by a backward that did not go through "
      "Engine::Backward, so no rank reduced them: call engine()->Backward(loss) instead of "
      "loss.backward() (a Trainer subclass overriding TrainingStep must too)"));
}

absl::StatusOr<torch::Tensor> DdpEngine::ClipGradNorm(double max_norm) {
  CT_RETURN_IF_ERROR(CheckGradientsSynchronized());
  return LocalEngine::ClipGradNorm(max_norm);
}

std::string DdpEngine::EngineCaptureBlocker() {
  if (std::string local = LocalEngine::EngineCaptureBlocker(); !local.empty()) return local;
  if (config_.find_unused_parameters()) {
    return "with ddp.find_unused_parameters the parameters left out may differ from step to "
           "step, and a replay would reduce the captured step's choice";
  }
  return "";
}

absl::Status DdpEngine::PrepareForCapture() {
  CT_RETURN_IF_ERROR(LocalEngine::PrepareForCapture());
  if (reducer_ == nullptr || working_ != nullptr) return absl::OkStatus();  // theirs remade
  // The hooks sit on the parameters' own accumulators here; made again, the accumulators run
  // on the capturing stream (engines/step_capture.h).
  if (!ReleaseAccumulators(reducer_->accumulators)) {
    return absl::FailedPreconditionError(
        "DDP's gradient accumulators are held elsewhere (a graph of an unfinished backward?), "
        "so they cannot be made again on the capturing stream");
  }
  return CatchTorch([&] {
    reducer_->accumulators = InstallGradientHooks<Reducer, &Reducer::OnGradientAccumulated>(
        reducer_->params, reducer_->hooks.handle());
  });
}

absl::Status DdpEngine::StepReplayed() {
  return comm_->WatchQueuedWork("collectives of the step replayed as a CUDA graph");
}

absl::StatusOr<bool> DdpEngine::OptimizerStep() {
  CT_RETURN_IF_ERROR(CheckGradientsSynchronized());
  return LocalEngine::OptimizerStep();
}

void DdpEngine::ZeroGrad() {
  if (reducer_ == nullptr) return;
  reducer_->Reset();
  if (working_ != nullptr) {  // the next gradients overwrite the buckets' ranges
    LocalEngine::ZeroGrad();
    return;
  }
  CancelPendingClip();
  torch::NoGradGuard no_grad;
  for (auto& bucket : reducer_->buckets) bucket.buffer.zero_();
}

absl::StatusOr<bool> DdpEngine::AllRanksFinite(bool local_finite) {
  return AllRanksFiniteOver({comm_.get()}, device_, local_finite);
}

absl::StatusOr<torch::Tensor> DdpEngine::AllReduceSum(const torch::Tensor& values) {
  return AllReduceSumOver({comm_.get()}, device_, values);
}

absl::StatusOr<torch::Tensor> DdpEngine::AllGather(const torch::Tensor& values) {
  return AllGatherOver({comm_.get()}, device_, values);
}

std::vector<std::vector<std::string>> DdpEngine::BucketParameterNames() const {
  std::vector<std::vector<std::string>> out;
  if (reducer_ == nullptr) return out;
  for (const auto& bucket : reducer_->buckets) {
    out.emplace_back();
    for (int i : bucket.params) out.back().push_back(reducer_->names[i]);
  }
  return out;
}

}  // namespace cpptrain
