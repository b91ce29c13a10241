// The gradient side of ZeRO stages 1 and 2: hooks on every trainable parameter's gradient
// accumulator move its gradient into its bucket (engines/zero/zero_layout.h) in fp32 and drop
// the parameter's .grad; a complete bucket is reduce-scattered (summed) into this rank's
// `shard()`, which accumulates over micro-batches until Clear(). The shard lives on the device
// or, for ZeRO-Offload, in host memory: each reduced bucket is then copied out on a side stream
// while the rest of backward runs (engines/zero/host_copies.h), and no fp32 shard is kept on the
// device. There the squared norm of each reduced bucket is also summed on the device as it is
// reduced (`ReducedSquares()`), so clipping needs no pass over the host shard.
//
//   stage 1 (keep_full=true): every bucket's fp32 buffer lives for the whole run (the full
//     gradient, 4P bytes). With synchronization off (non-final micro-batches) gradients only
//     add up in the buckets; with it on, buckets are reduce-scattered as soon as they are
//     complete, while the rest of backward runs.
//   stage 2 (keep_full=false): a bucket's buffer exists from its first gradient until its
//     reduce-scatter is done, and every micro-batch is reduced (DeepSpeed's ZeRO-2 does the
//     same): no full gradient is ever kept, and synchronization off changes nothing.
//     On one rank with the shard on the device the sum is the gradient itself: each gradient
//     goes straight into its shard range (copied after Clear(), added after that) and no
//     bucket is ever made, so the shard is all the gradient memory (one fp32 copy, not three).
// Buckets are launched strictly in order on every rank; a bucket's reduce-scatter is
// completed (Work::Wait, then added into shard()) before the next one is launched, so at most
// one is in flight. Parameters that got no gradient in a backward count as zeros.
//
//   ZeroGradients grads(layout, params, comm, device, /*keep_full=*/false, ShardOn(device));
//   grads.Begin(sync);  loss.backward();  CT_RETURN_IF_ERROR(grads.Finish());
//   ... grads.shard() holds the summed gradient of this rank's owned elements ...
//   grads.Clear();
#ifndef CPPTRAIN_ENGINES_ZERO_ZERO_GRADIENTS_H_
#define CPPTRAIN_ENGINES_ZERO_ZERO_GRADIENTS_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>
#include <mutex>
#include <vector>

#include "absl/status/status.h"
#include "engines/hook_owner.h"
#include "engines/zero/host_copies.h"
#include "engines/zero/zero_layout.h"
#include "sharding/communicator.h"

namespace torch::autograd {
struct Node;
}

namespace cpptrain {

class ZeroGradients {
 public:
  // Where shard() lives: the device, or the host (page-locked with `pinned`); with
  // `reduce_squares` the squared norm of what is reduced into it is summed on the device.
  struct ShardPlace {
    c10::Device device;
    bool pinned = false;
    bool reduce_squares = false;
  };

  // `params[i]` is layout.params[i]'s tensor; `comm` (not owned) outlives this.
  ZeroGradients(const ZeroLayout& layout, std::vector<at::Tensor> params, Communicator* comm,
                c10::Device device, bool keep_full, ShardPlace shard_place);
  ~ZeroGradients();

  // Installs the hooks (once).
  void Install();
  // Installs them again, on the parameters' current gradient accumulators (after set_data to
  // another dtype or device, which replaces them).
  void Reinstall();
  // Before a backward through Engine::Backward: with `sync` off (stage 1 only) no bucket is
  // launched.
  void Begin(bool sync);
  // After it: launches what is left (synchronized), waits for every reduce-scatter and copy.
  absl::Status Finish(bool backward_ok);
  // Starts a new accumulation (the next reduced gradients overwrite shard() instead of adding)
  // and zeroes the buckets, waiting for anything in flight first.
  void Clear();

  // [layout.local_numel] fp32 where ShardPlace says: this rank's summed gradients once a
  // synchronized backward has finished (between Clear and then, its values are stale).
  at::Tensor& shard() { return shard_; }
  // Whether every bucket was reduced into shard() since Clear() (a synchronized backward).
  bool AllReduced();
  // [1] fp32 on the device: the sum of squares of shard() as it was reduced, when ShardPlace
  // asked for it, every bucket was reduced exactly once since Clear() (no accumulation of
  // micro-batches into the shard) and nobody wrote the shard since (ShardWritten()); else
  // undefined, and the caller reads the shard itself.
  at::Tensor ReducedSquares();
  // Someone scaled or wrote shard(): ReducedSquares() no longer describes it.
  void ShardWritten();
  // Bytes of gradient buffers alive now: buckets, shard(), and any parameter's .grad.
  int64_t LiveBytes() const;
  // The most bytes of buckets, shard() and reduce-scatter outputs alive at once since the
  // last ResetPeak(), sampled after each gradient is bucketed and each bucket is launched.
  int64_t peak_buffer_bytes() const { return peak_buffer_bytes_; }
  void ResetPeak() { peak_buffer_bytes_ = 0; }

  // For the hook.
  void OnGradient(int index);

 private:
  void LaunchReadyLocked();
  void SamplePeakLocked();
  absl::Status CompleteLocked();  // the reduce-scatter in flight, if any
  void AddSquaresLocked(const at::Tensor& reduced, bool fresh);
  bool AllReducedLocked() const;
  at::Tensor& BucketBuffer(int b);
  at::Tensor ShardRange(const ZeroLayout::Param& p);  // p's elements of shard() (one rank)
  // Zeros bucket b's parameters that got no gradient, and its padding (padding_[b]).
  void ZeroUnwrittenLocked(int b);
  void FindPadding();  // fills padding_

  const ZeroLayout& layout_;
  std::vector<at::Tensor> params_;
  Communicator* comm_;
  c10::Device device_;
  bool keep_full_;
  bool direct_;  // one rank, stage 2, shard on the device: gradients go into shard() directly
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;

  std::mutex mu_;
  at::Tensor shard_;
  // Per bucket: nothing was reduced into its shard range since Clear() (direct_: its range
  // holds this backward's copies, and stale values elsewhere, until the bucket is launched).
  std::vector<bool> fresh_;
  std::vector<at::Tensor> padding_;  // direct_: per bucket, the shard positions no parameter has
  bool reduce_squares_;
  at::Tensor squares_;         // [1] fp64 on the device: see ReducedSquares()
  bool squares_valid_ = true;  // since Clear(): no bucket accumulated, no ShardWritten()
  HostCopies copies_;
  std::vector<at::Tensor> buckets_;  // fp32 [bucket numel]; stage 2: undefined when idle
  std::vector<int> pending_;         // gradients still missing per bucket in this backward
  std::vector<bool> ready_;
  size_t next_launch_ = 0;
  bool in_backward_ = false;
  bool launching_ = false;
  int in_flight_ = -1;  // bucket whose reduce-scatter is in flight
  at::Tensor in_flight_out_;
  std::unique_ptr<Work> work_;
  absl::Status error_;
  int64_t peak_buffer_bytes_ = 0;
  HookOwner<ZeroGradients> hooks_{this};  // last: cleared first, so hooks outliving it stop
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ZERO_ZERO_GRADIENTS_H_
