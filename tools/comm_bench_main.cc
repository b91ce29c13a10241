// //tools:comm_bench: collective bandwidth in the manner of nccl-tests, through the project's
// Communicator (NCCL for CUDA tensors, Gloo for CPU tensors). Run one process per rank:
//
//   bazel-bin/tools/launch --nproc_per_node=4 bazel-bin/tools/comm_bench --device=cuda
//
// For each collective and each size (bytes of the full buffer: the all-reduce tensor, the
// all-gather output, the reduce-scatter input), it checks the result against a formula, then
// times --iters back-to-back launches after --warmup and prints
//   algbw = bytes / time
//   busbw = algbw * 2 (n - 1) / n   (all-reduce)
//           algbw * (n - 1) / n     (all-gather, reduce-scatter)
//           algbw                   (broadcast)
// as a table and as JSON lines (rank 0).
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/cuda.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status.h"
#include "sharding/communicator.h"
#include "sharding/local_device.h"
#include "sharding/rendezvous.h"

ABSL_FLAG(std::string, device, "cpu", "cpu (Gloo) or cuda (NCCL, one GPU per local rank)");
ABSL_FLAG(int64_t, min_bytes, 1024, "smallest buffer");
ABSL_FLAG(int64_t, max_bytes, int64_t{1} << 30, "largest buffer");
ABSL_FLAG(int64_t, factor, 4, "size multiplier between rows");
ABSL_FLAG(std::string, collectives, "all_reduce,all_gather,reduce_scatter,broadcast",
          "comma-separated subset");
ABSL_FLAG(std::string, dtype, "bf16", "fp32, bf16, fp16 or int64");
ABSL_FLAG(int, warmup, 5, "untimed iterations per size");
ABSL_FLAG(int, iters, 20, "timed iterations per size");
ABSL_FLAG(int, timeout_s, 600, "collective timeout");

namespace cpptrain {
namespace {

absl::StatusOr<at::ScalarType> ParseDtype(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  if (name == "int64") return at::kLong;
  return absl::InvalidArgumentError(
      absl::StrCat("--dtype=", name, " is not one of fp32, bf16, fp16, int64"));
}

void SyncDevice(const at::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// --device=cuda: this process's GPU (sharding/local_device.h), whose context it creates.
absl::StatusOr<at::Device> BenchDevice() {
  if (absl::GetFlag(FLAGS_device) != "cuda") return at::Device(at::kCPU);
  CT_ASSIGN_OR_RETURN(const LocalDevice local,
                      LocalDeviceFromEnvironment(static_cast<int>(torch::cuda::device_count())));
  const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(local.cuda_index));
  SyncDevice(device);
  return device;
}

// Launches one collective of `kind` over buffers sized for `bytes`; `check` verifies values.
class Case {
 public:
  Case(std::string kind, Communicator& comm, int64_t bytes, at::TensorOptions options)
      : kind_(std::move(kind)), comm_(comm) {
    const int64_t n = comm.size();
    const int64_t elements = std::max<int64_t>(n, bytes / options.dtype().itemsize() / n * n);
    if (kind_ == "all_gather") {
      small_ = at::empty({elements / n}, options);
      big_ = at::empty({elements}, options);
    } else if (kind_ == "reduce_scatter") {
      big_ = at::empty({elements}, options);
      small_ = at::empty({elements / n}, options);
    } else {
      big_ = at::empty({elements}, options);
    }
    bytes_ = big_.numel() * big_.element_size();
  }

  int64_t bytes() const { return bytes_; }

  double BusFactor() const {
    const double n = comm_.size();
    if (kind_ == "all_reduce") return 2.0 * (n - 1) / n;
    if (kind_ == "broadcast") return 1.0;
    return (n - 1) / n;
  }

  absl::StatusOr<std::unique_ptr<Work>> Launch() {
    if (kind_ == "all_reduce") return comm_.AllReduce(big_, ReduceOp::kSum);
    if (kind_ == "all_gather") return comm_.AllGather(small_, big_);
    if (kind_ == "reduce_scatter") return comm_.ReduceScatter(big_, small_, ReduceOp::kSum);
    return comm_.Broadcast(big_, 0);
  }

  // Fills inputs with rank-dependent values, runs once, and checks against the formula.
  absl::Status Verify() {
    const int rank = comm_.rank();
    const int n = comm_.size();
    at::Tensor input = kind_ == "all_gather" ? small_ : big_;
    input.fill_(rank + 1);
    CT_ASSIGN_OR_RETURN(auto work, Launch());
    CT_RETURN_IF_ERROR(work->Synchronize());
    at::Tensor expected;
    at::Tensor got;
    if (kind_ == "all_reduce") {
      got = big_;
      expected = at::full_like(big_, n * (n + 1) / 2);
    } else if (kind_ == "reduce_scatter") {
      got = small_;
      expected = at::full_like(small_, n * (n + 1) / 2);
    } else if (kind_ == "broadcast") {
      got = big_;
      expected = at::full_like(big_, 1);
    } else {
      got = big_;
      expected = at::arange(1, n + 1, big_.options()).repeat_interleave(small_.numel());
    }
    if (!got.to(at::kDouble).equal(expected.to(at::kDouble))) {
      return absl::InternalError(absl::StrCat("rank ", rank, ": ", kind_, " of ", bytes_,
                                              " bytes gave wrong values"));
    }
    return absl::OkStatus();
  }

 private:
  std::string kind_;
  Communicator& comm_;
  at::Tensor big_;
  at::Tensor small_;
  int64_t bytes_ = 0;
};

absl::Status Run() {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  InitLogging("comm_bench", env.rank);
  CT_ASSIGN_OR_RETURN(const at::Device device, BenchDevice());
  const std::chrono::milliseconds timeout(absl::GetFlag(FLAGS_timeout_s) * 1000);
  CT_ASSIGN_OR_RETURN(auto store, ConnectStore(env, timeout));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm,
                      CreateCommunicatorForDevice(store, env.rank, env.world_size,
                                                  device.type(), timeout));
  CT_ASSIGN_OR_RETURN(at::ScalarType dtype, ParseDtype(absl::GetFlag(FLAGS_dtype)));
  const at::TensorOptions options = at::TensorOptions().dtype(dtype).device(device);
  if (env.rank == 0) {
    std::printf("# %s over %d ranks, %s, busbw = algbw * (2(n-1)/n all-reduce, (n-1)/n "
                "all-gather/reduce-scatter, 1 broadcast)\n",
                comm->backend().c_str(), env.world_size, absl::GetFlag(FLAGS_dtype).c_str());
    std::printf("%-15s %14s %12s %12s %12s\n", "collective", "bytes", "time_us", "algbw_GB/s",
                "busbw_GB/s");
  }
  for (const std::string& kind :
       std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_collectives), ','))) {
    for (int64_t bytes = absl::GetFlag(FLAGS_min_bytes); bytes <= absl::GetFlag(FLAGS_max_bytes);
         bytes *= absl::GetFlag(FLAGS_factor)) {
      Case c(kind, *comm, bytes, options);
      CT_RETURN_IF_ERROR(c.Verify());
      for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) {
        CT_ASSIGN_OR_RETURN(auto work, c.Launch());
        CT_RETURN_IF_ERROR(work->Wait());
      }
      SyncDevice(device);
      CT_RETURN_IF_ERROR(comm->Barrier());
      const int iters = absl::GetFlag(FLAGS_iters);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        CT_ASSIGN_OR_RETURN(auto work, c.Launch());
        CT_RETURN_IF_ERROR(work->Wait());
      }
      SyncDevice(device);
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
      // The slowest rank decides the collective's time.
      at::Tensor slowest =
          at::full({1}, seconds, at::TensorOptions().dtype(at::kDouble).device(device));
      CT_ASSIGN_OR_RETURN(auto max_work, comm->AllReduce(slowest, ReduceOp::kMax));
      CT_RETURN_IF_ERROR(max_work->Synchronize());
      const double time = slowest.cpu().item<double>();
      const double algbw = c.bytes() / time / 1e9;
      const double busbw = algbw * c.BusFactor();
      if (env.rank == 0) {
        std::printf("%-15s %14lld %12.1f %12.2f %12.2f\n", kind.c_str(),
                    static_cast<long long>(c.bytes()), time * 1e6, algbw, busbw);
        std::printf(
            "{\"collective\":\"%s\",\"backend\":\"%s\",\"ranks\":%d,\"dtype\":\"%s\",\"bytes\":%"
            "lld,"
            "\"time_us\":%.2f,\"algbw_gbps\":%.3f,\"busbw_gbps\":%.3f,\"verified\":true}\n",
            kind.c_str(), comm->backend().c_str(), env.world_size,
            absl::GetFlag(FLAGS_dtype).c_str(), static_cast<long long>(c.bytes()), time * 1e6,
            algbw, busbw);
        std::fflush(stdout);
      }
    }
  }
  return comm->Barrier();
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::Status status = cpptrain::Run();
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return 1;
  }
  return 0;
}
