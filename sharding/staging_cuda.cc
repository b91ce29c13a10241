#include "sharding/staging_cuda.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace {

class CudaDeviceStaging : public DeviceStaging {
 public:
  CudaDeviceStaging(int device, std::chrono::microseconds delay)
      : device_(device),
        delay_(delay),
        stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/false,
                                             static_cast<c10::DeviceIndex>(device))) {}

  c10::Device device() const override {
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(device_));
  }

  absl::StatusOr<std::vector<at::Tensor>> ToHost(const std::vector<at::Tensor>& tensors,
                                                 const std::vector<bool>& copy) override {
    return CatchTorch([&] {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      at::cuda::CUDAEvent inputs_ready;
      inputs_ready.record(c10::cuda::getCurrentCUDAStream(device_));
      inputs_ready.block(stream_);
      std::vector<at::Tensor> host;
      {
        c10::cuda::CUDAStreamGuard on_staging(stream_);
        for (size_t i = 0; i < tensors.size(); ++i) {
          at::Tensor h = at::empty(tensors[i].sizes(),
                                   at::TensorOptions().dtype(tensors[i].scalar_type())
                                       .pinned_memory(true));
          if (copy[i]) h.copy_(tensors[i], /*non_blocking=*/true);
          host.push_back(std::move(h));
        }
      }
      stream_.synchronize();
      return host;
    });
  }

  absl::StatusOr<std::function<absl::Status()>> FromHost(
      const std::vector<at::Tensor>& host, const std::vector<at::Tensor>& device) override {
    return CatchTorch([&] {
      c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_));
      const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
      // The outputs may still be in use by the caller's stream (an in-place all-reduce's
      // tensor was read there): the copies wait for it.
      at::cuda::CUDAEvent outputs_free;
      outputs_free.record(current);
      outputs_free.block(stream_);
      {
        c10::cuda::CUDAStreamGuard on_staging(stream_);
        if (delay_.count() > 0) at::cuda::sleep(DelayCycles());
        for (size_t i = 0; i < host.size(); ++i) {
          at::Tensor out = device[i];
          out.copy_(host[i], /*non_blocking=*/true);
          // Freed and reused on another stream, the memory waits for this copy.
          c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(), stream_);
        }
      }
      auto copied = std::make_shared<at::cuda::CUDAEvent>();
      copied->record(stream_);
      copied->block(current);
      return std::function<absl::Status()>(
          [copied] { return CatchTorch([&] { copied->synchronize(); }); });
    });
  }

  bool Capturing() const override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device_);
    return cudaStreamIsCapturing(current.stream(), &status) == cudaSuccess &&
           status != cudaStreamCaptureStatusNone;
  }

 private:
  // The spin's length in GPU clock cycles (the attribute is in kHz).
  int64_t DelayCycles() const {
    int khz = 0;
    if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device_) != cudaSuccess || khz <= 0) {
      khz = 1'500'000;
    }
    return static_cast<int64_t>(delay_.count()) * khz / 1000;
  }

  int device_;
  std::chrono::microseconds delay_;
  c10::cuda::CUDAStream stream_;
};

}  // namespace

std::unique_ptr<DeviceStaging> CudaStaging(int device, std::chrono::microseconds delay) {
  return std::make_unique<CudaDeviceStaging>(device, delay);
}

}  // namespace cpptrain
