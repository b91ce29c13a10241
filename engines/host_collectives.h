// Blocking collectives on small host values (token counts, finite flags, timing figures) over
// one or more communicators in turn, for the engines' AllReduceSum / AllGather /
// AllRanksFinite. Null communicators are skipped, so an engine passes {shard, replicate} and
// a plain mesh simply has no replicate. Also the replicated engines' start: rank 0's
// parameters and buffers broadcast to every rank. On a CUDA device the collectives of host
// values run from a pool stream, so they wait for nothing the caller's stream has queued.
//
//   CT_ASSIGN_OR_RETURN(at::Tensor total, AllReduceSumOver({comm}, device, counts));
#ifndef CPPTRAIN_ENGINES_HOST_COLLECTIVES_H_
#define CPPTRAIN_ENGINES_HOST_COLLECTIVES_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

#include "absl/status/statusor.h"
#include "sharding/communicator.h"

namespace cpptrain {

// The sum over every rank of `values`, on the CPU (computed on `device`).
absl::StatusOr<at::Tensor> AllReduceSumOver(const std::vector<Communicator*>& comms,
                                            c10::Device device, const at::Tensor& values);

// Every rank's `values` stacked along dim 0 in rank order, on the CPU. The first communicator
// is the inner mesh dimension: rank = outer coordinate * inner size + inner coordinate.
absl::StatusOr<at::Tensor> AllGatherOver(const std::vector<Communicator*>& comms,
                                         c10::Device device, const at::Tensor& values);

// True when every rank passed true.
absl::StatusOr<bool> AllRanksFiniteOver(const std::vector<Communicator*>& comms,
                                        c10::Device device, bool local_finite);

// Overwrites each tensor in place with rank 0's value, one blocking broadcast per tensor.
absl::Status BroadcastFromRank0(Communicator& comm, const std::vector<at::Tensor>& tensors);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_HOST_COLLECTIVES_H_
