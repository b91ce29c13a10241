// Device work queued on a side stream of one CUDA device, run eagerly or captured once as a CUDA
// graph and replayed (at::cuda::CUDAGraph). Builds without CUDA (Debian's LibTorch) have the
// same class: Supported() is false there and Capture reports that it cannot.
//
//   SideStreamGraph graph(device);
//   CT_RETURN_IF_ERROR(graph.RunEager(work));      // warm-up: the stream's handles, workspaces
//   absl::Status captured = graph.Capture(work);   // queues nothing; on an error, no graph
//   if (captured.ok()) CT_RETURN_IF_ERROR(graph.Replay());   // runs what `work` queued
//
// Every call orders the side stream after the work already queued on the device's current
// stream and the current stream after the side stream's, so tensors move between the two
// without further synchronization. `work` must queue everything on the current stream (which
// is the side stream while it runs) and must not read device values on the host: such a read
// makes the capture fail, and Capture then says which operation it was.
#ifndef CPPTRAIN_BASE_CUDA_GRAPH_H_
#define CPPTRAIN_BASE_CUDA_GRAPH_H_

#include <functional>
#include <memory>

#include <c10/core/Device.h>

#include "absl/status/status.h"

namespace cpptrain {

class SideStreamGraph {
 public:
  // Whether this build can capture CUDA graphs (a CUDA LibTorch 2.x).
  static bool Supported();

  explicit SideStreamGraph(c10::Device device);
  ~SideStreamGraph();
  SideStreamGraph(const SideStreamGraph&) = delete;
  SideStreamGraph& operator=(const SideStreamGraph&) = delete;

  // Runs `work` with the side stream current (its work runs now, as usual).
  absl::Status RunEager(const std::function<absl::Status()>& work);
  // Runs `work` with the side stream current and captures what it queues instead of running it;
  // memory it allocates comes from the graph's own pool and stays the graph's. Replaces an
  // earlier graph. An error from `work` or from the capture leaves no graph; the error says
  // which (an operation that synchronizes with the host names itself in it).
  absl::Status Capture(const std::function<absl::Status()>& work);
  // Queues the captured work on the side stream. An error when nothing was captured.
  absl::Status Replay();
  // Drops the graph and its memory pool.
  void Reset();
  bool captured() const;

 private:
  struct Impl;
  c10::Device device_;
  std::unique_ptr<Impl> impl_;
};

// True while the current stream of `device` is being captured into a CUDA graph (false on the
// CPU and in builds without CUDA).
bool IsCapturingCudaGraph(const c10::Device& device);

}  // namespace cpptrain

#endif  // CPPTRAIN_BASE_CUDA_GRAPH_H_
