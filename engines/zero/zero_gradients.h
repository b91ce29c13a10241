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
//     On one rank with the shard on the device the sum is the gradient itself, so nothing is
//     bucketed or reduced and no shard is made: each parameter's gradient is held as its own
//     tensor (`held()`), as the local engine holds it. The first one since Clear() is the
//     tensor autograd made, unless it is bf16 and the optimizer does not read bf16 gradients
//     (HoldBf16(false)): then it is widened to fp32; a second micro-batch's is added into an
//     fp32 copy. One micro-batch a step costs no pass over the gradients and, under bf16,
//     2 bytes a parameter of gradient memory.
// Buckets are launched strictly in order on every rank; a bucket's reduce-scatter is
// completed (Work::Wait, then added into shard()) before the next one is launched, so at most
// one is in flight. Parameters that got no gradient in a backward count as zeros.
//
//   ZeroGradients grads(layout, params, comm, device, /*keep_full=*/false, ShardOn(device));
//   grads.Begin(sync);  loss.backward();  CT_RETURN_IF_ERROR(grads.Finish());
//   ... grads.OwnedGradient(i) holds the summed gradient of parameter i's owned elements ...
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
  // Undefined when held().
  at::Tensor& shard() { return shard_; }
  // One rank, stage 2, on the device: the gradients are held per parameter, not in shard().
  bool held() const { return held_; }
  // Whether a held bf16 gradient stays bf16 (the optimizer reads bf16 gradients of fp32
  // parameters, engines/gradient_scaling.h) or is widened to fp32. Set between steps.
  void HoldBf16(bool on) { hold_bf16_ = on; }
  // The 1-d summed gradient of parameter i's owned elements: a view of shard(), or the held
  // tensor (undefined until a backward since Clear() gave it one).
  at::Tensor OwnedGradient(int i);
  // The tensors holding this rank's owned gradients, to norm or scale: shard(), or every held
  // gradient.
  std::vector<at::Tensor> OwnedGradients();
  // Whether every bucket was reduced into shard() since Clear() (a synchronized backward).
  bool AllReduced();
  // [1] fp32 on the device: the sum of squares of shard() as it was reduced, when ShardPlace
  // asked for it, every bucket was reduced exactly once since Clear() (no accumulation of
  // micro-batches into the shard) and nobody wrote the shard since (ShardWritten()); else
  // undefined, and the caller reads the shard itself.
  at::Tensor ReducedSquares();
  // Someone scaled or wrote shard(): ReducedSquares() no longer describes it.
  void ShardWritten();
  // Bytes of gradient buffers alive now: buckets, shard(), held gradients and any parameter's
  // .grad.
  int64_t LiveBytes() const;
  // The most bytes of buckets, shard(), held gradients and reduce-scatter outputs alive at once
  // since the last ResetPeak(), sampled after each gradient is bucketed or held and each bucket
  // is launched.
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
  void HoldLocked(int index, const at::Tensor& grad);  // held(): keeps or adds `grad`
  // held(): the parameters of bucket b that got no gradient since Clear() get zeros.
  void HoldZerosLocked(int b);

  const ZeroLayout& layout_;
  std::vector<at::Tensor> params_;
  Communicator* comm_;
  c10::Device device_;
  bool keep_full_;
  bool held_;  // one rank, stage 2, on the device: gradients held per parameter (see the top)
  bool hold_bf16_ = false;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;

  std::mutex mu_;
  at::Tensor shard_;
  // Per bucket: nothing was reduced into its shard range since Clear() (held_: its parameters
  // that got no gradient have none held until the bucket is launched).
  std::vector<bool> fresh_;
  std::vector<at::Tensor> held_grads_;  // held_: per parameter, 1-d; undefined until one comes
  int64_t held_bytes_ = 0;
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
