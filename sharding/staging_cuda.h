// Staging of CUDA tensors for StagedCommunicator (sharding/staged_communicator.h): the copies
// to and from pinned host memory run on a stream of the staging's own, ordered against the
// caller's current stream by CUDA events. Built in CUDA builds only (CPPTRAIN_HAS_CUDA).
//
// Streams: ToHost makes the staging stream wait on an event recorded on the caller's current
// stream, copies there, and blocks the host until the copies are done. FromHost copies on the
// staging stream (after `delay`, a spin on that stream that widens the window in which a
// reader that skipped Work::Wait would see the old values), records the copied tensors'
// use by that stream with the caching allocator, and makes the caller's current stream wait
// on an event recorded after the copies; the returned function blocks the host on that event.
//
//   CT_ASSIGN_OR_RETURN(auto comm, StagedCommunicator::Create(
//       std::move(gloo), CudaStaging(/*device=*/0, std::chrono::microseconds(200))));
#ifndef CPPTRAIN_SHARDING_STAGING_CUDA_H_
#define CPPTRAIN_SHARDING_STAGING_CUDA_H_

#include <chrono>
#include <memory>

#include "sharding/staged_communicator.h"

namespace cpptrain {

// Stages tensors of cuda:`device`. `delay`: how long the staging stream spins before copying
// results back (0: not at all).
std::unique_ptr<DeviceStaging> CudaStaging(int device, std::chrono::microseconds delay);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_STAGING_CUDA_H_
