#include "base/cuda_graph.h"

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#if defined(CPPTRAIN_HAS_CUDA)
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace cpptrain {
namespace {

absl::Status Catching(const std::function<absl::Status()>& work) {
  try {
    return work();
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

}  // namespace

#if defined(CPPTRAIN_HAS_CUDA)

struct SideStreamGraph::Impl {
  explicit Impl(c10::DeviceIndex index) : stream(c10::cuda::getStreamFromPool(false, index)) {}
  c10::cuda::CUDAStream stream;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
};

namespace {

// `waiter` waits (on the device) for what `from` has queued so far.
void Follow(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& from) {
  at::cuda::CUDAEvent event;
  event.record(from);
  event.block(waiter);
}

// Runs `body` with `side` current on its device, ordered after and before the device's current
// stream. Exceptions become a Status.
absl::Status OnSideStream(const c10::cuda::CUDAStream& side,
                          const std::function<absl::Status()>& body) {
  c10::cuda::CUDAGuard device_guard(side.device_index());
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(side.device_index());
  Follow(side, current);
  absl::Status status;
  {
    c10::cuda::CUDAStreamGuard stream_guard(side);
    status = Catching(body);
  }
  Follow(current, side);
  return status;
}

}  // namespace

bool SideStreamGraph::Supported() { return true; }

SideStreamGraph::SideStreamGraph(c10::Device device) : device_(device) {
  if (device_.is_cuda()) impl_ = std::make_unique<Impl>(device_.index());
}

SideStreamGraph::~SideStreamGraph() = default;

absl::Status SideStreamGraph::RunEager(const std::function<absl::Status()>& work) {
  if (impl_ == nullptr) return Catching(work);
  return OnSideStream(impl_->stream, work);
}

absl::Status SideStreamGraph::Capture(const std::function<absl::Status()>& work) {
  if (impl_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graphs capture CUDA work, and this runs on ", device_.str()));
  }
  Reset();
  // The graph's pool cannot reuse blocks the eager steps left cached: hand them back first, so
  // the device holds one step's activations, not two.
  c10::cuda::CUDACachingAllocator::emptyCache();
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  absl::Status status = OnSideStream(impl_->stream, [&]() -> absl::Status {
    // Thread-local: the loader's threads may pin host memory meanwhile; the capturing thread
    // (and autograd's, whose work is on this stream) may not synchronize.
    graph->capture_begin(at::cuda::MempoolId_t{0, 0}, cudaStreamCaptureModeThreadLocal);
    absl::Status work_status = Catching(work);
    try {
      graph->capture_end();  // ends the capture even when `work` failed
    } catch (const std::exception& e) {
      if (work_status.ok()) work_status = absl::InternalError(e.what());
    }
    return work_status;
  });
  if (!status.ok()) {
    (void)cudaGetLastError();  // a failed capture leaves a (non-sticky) error behind
    return absl::FailedPreconditionError(
        absl::StrCat("the step could not be captured as a CUDA graph: ", status.message()));
  }
  impl_->graph = std::move(graph);
  return absl::OkStatus();
}

absl::Status SideStreamGraph::Replay() {
  if (!captured()) return absl::FailedPreconditionError("Replay before a successful Capture");
  return OnSideStream(impl_->stream, [&] {
    impl_->graph->replay();
    return absl::OkStatus();
  });
}

void SideStreamGraph::Reset() {
  if (impl_ != nullptr) impl_->graph.reset();
}

bool SideStreamGraph::captured() const { return impl_ != nullptr && impl_->graph != nullptr; }

bool IsCapturingCudaGraph(const c10::Device& device) {
  if (!device.is_cuda()) return false;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaError_t error =
      cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(device.index()).stream(), &status);
  return error == cudaSuccess && status != cudaStreamCaptureStatusNone;
}

#else  // no CUDA

struct SideStreamGraph::Impl {};

bool SideStreamGraph::Supported() { return false; }
SideStreamGraph::SideStreamGraph(c10::Device device) : device_(device) {}
SideStreamGraph::~SideStreamGraph() = default;

absl::Status SideStreamGraph::RunEager(const std::function<absl::Status()>& work) {
  return Catching(work);
}

absl::Status SideStreamGraph::Capture(const std::function<absl::Status()>&) {
  return absl::FailedPreconditionError(
      "this LibTorch build has no CUDA, so no CUDA graphs: the step runs eagerly");
}

absl::Status SideStreamGraph::Replay() {
  return absl::FailedPreconditionError("Replay before a successful Capture");
}

void SideStreamGraph::Reset() {}
bool SideStreamGraph::captured() const { return false; }
bool IsCapturingCudaGraph(const c10::Device&) { return false; }

#endif

}  // namespace cpptrain
