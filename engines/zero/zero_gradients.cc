#include "engines/zero/zero_gradients.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/accumulate_gradient.h"
#include "kernels/cpu_adamw.h"

namespace cpptrain {

ZeroGradients::ZeroGradients(const ZeroLayout& layout, std::vector<at::Tensor> params,
                             Communicator* comm, c10::Device device, bool keep_full,
                             ShardPlace shard_place)
    : layout_(layout),
      params_(std::move(params)),
      comm_(comm),
      device_(device),
      keep_full_(keep_full),
      held_(comm->size() == 1 && !keep_full && shard_place.device == device &&
            !shard_place.reduce_squares),
      reduce_squares_(shard_place.reduce_squares) {
  const auto fp32 = torch::TensorOptions().dtype(at::kFloat).device(device_);
  if (held_) {
    held_grads_.resize(params_.size());
  } else {
    shard_ = torch::zeros({layout_.local_numel}, torch::TensorOptions()
                                                     .dtype(at::kFloat)
                                                     .device(shard_place.device)
                                                     .pinned_memory(shard_place.pinned));
  }
  fresh_.assign(layout_.buckets.size(), true);
  buckets_.resize(layout_.buckets.size());
  if (keep_full_) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      buckets_[b] = torch::zeros({layout_.buckets[b].numel}, fp32);
    }
  }
  pending_.assign(layout_.buckets.size(), 0);
  ready_.assign(params_.size(), false);
}

ZeroGradients::~ZeroGradients() {
  std::lock_guard<std::mutex> lock(mu_);
  (void)CompleteLocked();
}

void ZeroGradients::Install() {
  if (!accumulators_.empty()) return;
  accumulators_ =
      InstallGradientHooks<ZeroGradients, &ZeroGradients::OnGradient>(params_, hooks_.handle());
}

void ZeroGradients::Reinstall() {
  accumulators_.clear();
  Install();
}

at::Tensor& ZeroGradients::BucketBuffer(int b) {
  if (!buckets_[b].defined()) {
    buckets_[b] = torch::zeros({layout_.buckets[b].numel},
                               torch::TensorOptions().dtype(at::kFloat).device(device_));
  }
  return buckets_[b];
}

void ZeroGradients::Begin(bool sync) {
  std::lock_guard<std::mutex> lock(mu_);
  in_backward_ = true;
  launching_ = sync || !keep_full_;
  std::fill(ready_.begin(), ready_.end(), false);
  for (size_t b = 0; b < pending_.size(); ++b) {
    pending_[b] = static_cast<int>(layout_.buckets[b].params.size());
  }
  next_launch_ = 0;
}

void ZeroGradients::OnGradient(int index) {
  std::lock_guard<std::mutex> lock(mu_);
  at::Tensor& param = params_[index];
  if (!in_backward_ || ready_[index] || !param.grad().defined()) return;
  const ZeroLayout::Param& p = layout_.params[index];
  {
    torch::NoGradGuard no_grad;
    const at::Tensor grad = param.grad().reshape({-1});
    if (held_) {
      HoldLocked(index, grad);
    } else {
      BucketBuffer(p.bucket)
          .narrow(0, p.offset - layout_.buckets[p.bucket].begin, p.numel)
          .add_(grad);
    }
  }
  param.mutable_grad() = at::Tensor();
  ready_[index] = true;
  --pending_[p.bucket];
  SamplePeakLocked();
  if (launching_) LaunchReadyLocked();
}

// Nobody else holds `grad` (AccumulateGrad hands over its buffer or a clone); the pieces the
// optimizer steps are fp32.
void ZeroGradients::HoldLocked(int index, const at::Tensor& grad) {
  at::Tensor& held = held_grads_[index];
  if (held.defined()) held_bytes_ -= held.numel() * held.element_size();
  AccumulateGradient(held, grad, at::kFloat, hold_bf16_);
  held_bytes_ += held.numel() * held.element_size();
}

void ZeroGradients::HoldZerosLocked(int b) {
  torch::NoGradGuard no_grad;
  for (const int index : layout_.buckets[b].params) {
    if (held_grads_[index].defined()) continue;
    // What autograd would have made, held by HoldLocked's rule.
    const auto options =
        torch::TensorOptions().dtype(params_[index].scalar_type()).device(device_);
    HoldLocked(index, torch::zeros({layout_.params[index].numel}, options));
  }
}

at::Tensor ZeroGradients::OwnedGradient(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  if (held_) return held_grads_[i];
  const ZeroLayout::Param& p = layout_.params[i];
  return shard_.narrow(0, p.local_offset, p.own_numel);
}

std::vector<at::Tensor> ZeroGradients::OwnedGradients() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!held_) return {shard_};
  std::vector<at::Tensor> out;
  for (const at::Tensor& held : held_grads_) {
    if (held.defined()) out.push_back(held);
  }
  return out;
}

void ZeroGradients::SamplePeakLocked() {
  int64_t bytes = held_bytes_;
  if (shard_.defined()) bytes += shard_.numel() * shard_.element_size();
  for (const at::Tensor& bucket : buckets_) {
    if (bucket.defined()) bytes += bucket.numel() * bucket.element_size();
  }
  const bool aliased = in_flight_ >= 0 && in_flight_out_.is_same(buckets_[in_flight_]);
  if (in_flight_out_.defined() && !aliased) {
    bytes += in_flight_out_.numel() * in_flight_out_.element_size();
  }
  peak_buffer_bytes_ = std::max(peak_buffer_bytes_, bytes);
}

absl::Status ZeroGradients::CompleteLocked() {
  if (in_flight_ < 0) return absl::OkStatus();
  const int b = in_flight_;
  in_flight_ = -1;
  absl::Status waited = work_ != nullptr ? work_->Wait() : absl::OkStatus();
  work_.reset();
  if (waited.ok()) {
    copies_.Put(in_flight_out_,
                shard_.narrow(0, layout_.buckets[b].local_offset, layout_.buckets[b].shard_numel),
                /*accumulate=*/!fresh_[b]);
    if (reduce_squares_) AddSquaresLocked(in_flight_out_, fresh_[b]);
    fresh_[b] = false;
  }
  in_flight_out_ = at::Tensor();
  if (keep_full_) {
    buckets_[b].zero_();
  } else {
    buckets_[b] = at::Tensor();
  }
  return waited;
}

// On CUDA a norm reduction queued behind the reduction like the copy out (no temporary the size
// of the bucket); on the CPU the threaded pass in double the host shard's norm takes, so both
// paths give the clip the same value. Summed in double; an accumulated bucket's range is a sum
// no longer seen here.
void ZeroGradients::AddSquaresLocked(const at::Tensor& reduced, bool fresh) {
  if (!fresh) squares_valid_ = false;
  if (!squares_valid_) return;
  torch::NoGradGuard no_grad;
  if (!squares_.defined()) {
    squares_ = torch::zeros({1}, reduced.options().dtype(at::kDouble));
  }
  if (reduced.is_cuda()) {
    squares_.add_(reduced.norm().square());
  } else {
    const at::Tensor flat = reduced.contiguous();
    squares_.add_(kernels::CpuSumOfSquares(flat.data_ptr<float>(), flat.numel()));
  }
}

void ZeroGradients::LaunchReadyLocked() {
  while (next_launch_ < layout_.buckets.size() && pending_[next_launch_] == 0) {
    const int b = static_cast<int>(next_launch_++);
    if (held_) {  // the gradients are held already; one that got none holds zeros
      if (fresh_[b]) HoldZerosLocked(b);
      fresh_[b] = false;
      SamplePeakLocked();
      continue;
    }
    absl::Status done = CompleteLocked();
    if (!done.ok() && error_.ok()) error_ = done;
    at::Tensor& input = BucketBuffer(b);
    if (comm_->size() == 1 && !keep_full_) {
      // One rank's sum is its bucket: no collective and no second bucket-sized buffer (stage 1
      // zeroes its bucket for the next step, so it keeps the reduce-scatter's copy).
      in_flight_out_ = input;
      in_flight_ = b;
      SamplePeakLocked();
      continue;
    }
    in_flight_out_ = torch::empty({layout_.buckets[b].shard_numel}, input.options());
    auto work = comm_->ReduceScatter(input, in_flight_out_, ReduceOp::kSum);
    if (!work.ok()) {
      if (error_.ok()) error_ = work.status();
      continue;
    }
    work_ = std::move(*work);
    in_flight_ = b;
    SamplePeakLocked();
  }
}

absl::Status ZeroGradients::Finish(bool backward_ok) {
  std::lock_guard<std::mutex> lock(mu_);
  if (launching_ && backward_ok) {
    // Parameters that got no gradient contribute zeros.
    for (size_t b = 0; b < pending_.size(); ++b) pending_[b] = 0;
    LaunchReadyLocked();
  }
  absl::Status done = CompleteLocked();
  if (!done.ok() && error_.ok()) error_ = done;
  copies_.Drain();
  in_backward_ = false;
  absl::Status error = std::move(error_);
  error_ = absl::OkStatus();
  return error;
}

void ZeroGradients::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  (void)CompleteLocked();
  copies_.Drain();
  in_backward_ = false;
  error_ = absl::OkStatus();
  torch::NoGradGuard no_grad;
  std::fill(fresh_.begin(), fresh_.end(), true);
  squares_valid_ = true;
  if (squares_.defined()) squares_.zero_();
  for (at::Tensor& bucket : buckets_) {
    if (!bucket.defined()) continue;
    if (keep_full_) {
      bucket.zero_();
    } else {
      bucket = at::Tensor();
    }
  }
  for (at::Tensor& held : held_grads_) held = at::Tensor();
  held_bytes_ = 0;
  for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
}

bool ZeroGradients::AllReducedLocked() const {
  return std::none_of(fresh_.begin(), fresh_.end(), [](bool fresh) { return fresh; });
}

bool ZeroGradients::AllReduced() {
  std::lock_guard<std::mutex> lock(mu_);
  return AllReducedLocked();
}

at::Tensor ZeroGradients::ReducedSquares() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reduce_squares_ || !squares_valid_ || !AllReducedLocked() || !squares_.defined()) {
    return at::Tensor();
  }
  return squares_.to(at::kFloat);
}

void ZeroGradients::ShardWritten() {
  std::lock_guard<std::mutex> lock(mu_);
  squares_valid_ = false;
}

int64_t ZeroGradients::LiveBytes() const {
  int64_t bytes = held_bytes_;
  if (shard_.defined()) bytes += shard_.numel() * shard_.element_size();
  for (const at::Tensor& bucket : buckets_) {
    if (bucket.defined()) bytes += bucket.numel() * bucket.element_size();
  }
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) bytes += p.grad().numel() * p.grad().element_size();
  }
  return bytes;
}

}  // namespace cpptrain
