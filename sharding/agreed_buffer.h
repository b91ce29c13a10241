// One buffer for a loop of collectives, allocated before the loop on every rank, with every
// rank learning whether all allocations succeeded. A rank that runs out of memory inside such
// a loop skips a collective its peers already wait in: on NCCL they wait until ddp_timeout.
// Allocated up front and agreed on, one rank out of memory fails every rank at once with an
// error that names it; the loop then carves its tensors out of the buffer and allocates
// nothing on the device.
//
//   CT_ASSIGN_OR_RETURN(at::Tensor staging,
//                       AllocateOnEveryRank(ranks, bytes, device, "gathering a checkpoint"));
//   for (...) {
//     at::Tensor out = StagingView(staging, {world * n}, at::kBFloat16);  // no allocation
//     ... AllGather(in, out) ...
//   }
//
// Fault injection for tests: CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK=R makes the allocation fail on
// rank R (HostGroup::rank) as running out of memory does (ResourceExhausted).
#ifndef CPPTRAIN_SHARDING_AGREED_BUFFER_H_
#define CPPTRAIN_SHARDING_AGREED_BUFFER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "sharding/host_group.h"

namespace cpptrain {

inline constexpr char kFailAllocOnRank[] = "CPPTRAIN_TEST_FAIL_ALLOC_ON_RANK";

// A uint8 tensor of `bytes` (at least 1) on `device`. Collective over `ranks`: every rank calls
// it, and every rank gets an error when any rank's allocation failed (AllRanksOk's message:
// the failing rank, the bytes, the device and `purpose`).
absl::StatusOr<at::Tensor> AllocateOnEveryRank(HostGroup& ranks, int64_t bytes,
                                               const c10::Device& device,
                                               const std::string& purpose);

// The front of `staging` (from AllocateOnEveryRank) as a contiguous tensor of `dtype` and
// `shape`, sharing its memory. Throws (TORCH_CHECK) when `staging` is too small.
at::Tensor StagingView(const at::Tensor& staging, at::IntArrayRef shape, at::ScalarType dtype);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_AGREED_BUFFER_H_
