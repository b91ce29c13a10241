#include "engines/zero/host_copies.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <utility>

#if CPPTRAIN_HAS_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace cpptrain {

#if CPPTRAIN_HAS_CUDA
struct HostCopies::Side {
  c10::cuda::CUDAStream stream;
};
struct HostCopies::Landed {  // recorded on the copy stream after an accumulating copy
  at::cuda::CUDAEvent event;
};
#else
struct HostCopies::Side {};
struct HostCopies::Landed {};
#endif

HostCopies::HostCopies() = default;

HostCopies::~HostCopies() { Drain(); }

void HostCopies::Put(const at::Tensor& src, const at::Tensor& dst, bool accumulate) {
  torch::NoGradGuard no_grad;
  if (!src.is_cuda() || dst.device() == src.device()) {
    accumulate ? dst.add_(src) : dst.copy_(src);
    return;
  }
#if CPPTRAIN_HAS_CUDA
  const c10::DeviceIndex index = src.device().index();
  if (side_ == nullptr) {
    side_.reset(new Side{c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)});
  }
  at::cuda::CUDAEvent ready;
  ready.record(c10::cuda::getCurrentCUDAStream(index));
  ready.block(side_->stream);
  c10::cuda::CUDAStreamGuard guard(side_->stream);
  if (accumulate) {
    AddLanded();  // their staging goes back to the allocator before this one is taken
    Pending pending{
        torch::empty(src.sizes(), src.options().device(c10::kCPU).pinned_memory(dst.is_pinned())),
        dst, std::make_shared<Landed>()};
    pending.staging.copy_(src, /*non_blocking=*/true);
    pending.landed->event.record(side_->stream);
    pending_.push_back(std::move(pending));
  } else {
    dst.copy_(src, /*non_blocking=*/true);
  }
  // The caller may free src at once: the allocator does not reuse its memory before the copy
  // stream's work queued so far is done.
  c10::cuda::CUDACachingAllocator::recordStream(src.storage().data_ptr(), side_->stream);
#endif
}

void HostCopies::AddLanded() {
#if CPPTRAIN_HAS_CUDA
  torch::NoGradGuard no_grad;
  auto it = pending_.begin();
  while (it != pending_.end() && it->landed != nullptr && it->landed->event.query()) {
    it->dst.add_(it->staging);
    ++it;
  }
  pending_.erase(pending_.begin(), it);
#endif
}

void HostCopies::Drain() {
#if CPPTRAIN_HAS_CUDA
  if (side_ != nullptr) side_->stream.synchronize();
#endif
  torch::NoGradGuard no_grad;
  for (Pending& p : pending_) {
    if (p.staging.defined()) p.dst.add_(p.staging);
  }
  pending_.clear();
}

}  // namespace cpptrain
