// Copies into host memory that overlap the compute stream (ZeRO-Offload's gradient copy-out).
// On CUDA each copy runs on a side stream, after the work queued so far on the current stream,
// into the host tensor (page-locked for the copy to be asynchronous); Drain() waits for every
// copy and then does the additions. Same-device copies (the CPU, or a device shard) happen at
// once on the current stream. An accumulating copy lands in page-locked staging, added into its
// destination by the next accumulating Put that finds it landed (so staging for only the copies
// still in flight is alive) or at Drain().
//
//   HostCopies copies;
//   copies.Put(reduced_bucket_shard, host_grad.narrow(0, offset, n), /*accumulate=*/false);
//   ... more backward work is queued meanwhile ...
//   copies.Drain();   // host_grad holds the copy (or the sum, with accumulate)
#ifndef CPPTRAIN_ENGINES_ZERO_HOST_COPIES_H_
#define CPPTRAIN_ENGINES_ZERO_HOST_COPIES_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace cpptrain {

class HostCopies {
 public:
  HostCopies();
  ~HostCopies();  // drains

  // dst = src, or dst += src with `accumulate`. The caller may drop src at once (on CUDA its
  // memory is recorded on the copy stream, so the allocator does not reuse it before the copy).
  void Put(const at::Tensor& src, const at::Tensor& dst, bool accumulate);
  // Waits for every copy Put started, then adds the accumulated ones into their destinations.
  void Drain();

 private:
  struct Side;    // the CUDA copy stream, where there is CUDA
  struct Landed;  // a CUDA event after a copy, where there is CUDA
  struct Pending {  // an accumulating copy: `staging` (host) is added into dst once landed
    at::Tensor staging, dst;
    std::shared_ptr<Landed> landed;
  };
  // Adds the oldest accumulating copies that have landed (in order) and drops their staging.
  void AddLanded();
  std::unique_ptr<Side> side_;
  std::vector<Pending> pending_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ZERO_HOST_COPIES_H_
