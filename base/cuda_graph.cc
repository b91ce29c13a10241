#include "base/cuda_graph.h"

#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#if defined(CPPTRAIN_HAS_CUDA)
#include <ATen/core/CachingHostAllocator.h>
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

namespace {

// After a capture that CUDA invalidated. LibTorch 2.11's CUDAGraph::capture_end throws before it
// stops routing allocations to the graph's pool, and its reset() releases that pool only after a
// successful capture, so both are done here, each at most once (a LibTorch that already did one
// makes the call throw, which is ignored). The graph object is kept for the life of the process:
// the allocators' routing filter and the capturing-graphs map hold pointers to it.
void ReleaseFailedCapture(std::unique_ptr<at::cuda::CUDAGraph> graph, c10::DeviceIndex device,
                          at::cuda::MempoolId_t pool) {
  auto ignoring = [](const std::function<void()>& call) {
    try {
      call();
    } catch (const std::exception&) {
    }
  };
  ignoring([&] { c10::cuda::CUDACachingAllocator::endAllocateToPool(device, pool); });
  ignoring([&] { at::getHostAllocator(at::kCUDA)->end_allocate_to_pool(pool); });
  ignoring([&] { c10::cuda::CUDACachingAllocator::releasePool(device, pool); });
  ignoring([&] { at::getHostAllocator(at::kCUDA)->release_pool(pool); });
  static auto* kept = new std::vector<std::unique_ptr<at::cuda::CUDAGraph>>();
  kept->push_back(std::move(graph));
  (void)cudaGetLastError();  // the invalidated capture's error is not sticky: clear it
}

}  // namespace

absl::Status SideStreamGraph::Capture(const std::function<absl::Status()>& work) {
  if (impl_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CUDA graphs capture CUDA work, and this runs on ", device_.str()));
  }
  Reset();
  const c10::DeviceIndex index = device_.index();
  // The graph's pool cannot reuse blocks the eager steps left cached: hand them back first, so
  // the device holds one step's activations, not two.
  absl::Status status = Catching([] {
    c10::cuda::CUDACachingAllocator::emptyCache();
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  const at::cuda::MempoolId_t pool = at::cuda::graph_pool_handle();
  auto graph = std::make_unique<at::cuda::CUDAGraph>();
  bool began = false, ended = false;
  status = OnSideStream(impl_->stream, [&]() -> absl::Status {
    // Thread-local: the loader's threads may pin host memory meanwhile; the capturing thread
    // (and autograd's, whose work is on this stream) may not synchronize.
    graph->capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    began = true;
    absl::Status work_status = Catching(work);
    try {
      graph->capture_end();  // ends the capture even when `work` failed
      ended = true;
    } catch (const std::exception& e) {
      if (work_status.ok()) work_status = absl::InternalError(e.what());
    }
    return work_status;
  });
  if (!status.ok()) {
    if (began && !ended) {
      ReleaseFailedCapture(std::move(graph), index, pool);
    } else {
      (void)cudaGetLastError();
    }
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
