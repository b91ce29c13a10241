// Run under //tools:launch with N processes: checks every collective of the Communicator
// against a formula, for fp32, bf16, fp16 and int64 and chunk sizes that no world size
// divides evenly. --device=cpu uses Gloo, --device=cuda NCCL (one GPU per process), so both
// backends pass the same checks. Exits 0 and prints "N checks passed" when all hold.
#include <ATen/ATen.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "sharding/local_device.h"
#include "sharding/rendezvous.h"

ABSL_FLAG(std::string, device, "cpu", "cpu (Gloo) or cuda (NCCL)");

namespace cpptrain {
namespace {

int checks = 0;

absl::Status Expect(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  ++checks;
  if (!got.to(at::kDouble).cpu().equal(want.to(at::kDouble).cpu())) {
    return absl::InternalError(
        absl::StrCat(what, ": got ", got.to(at::kDouble).sum().item<double>(), " (sum), want ",
                     want.to(at::kDouble).sum().item<double>()));
  }
  return absl::OkStatus();
}

absl::Status Done(absl::StatusOr<std::unique_ptr<Work>> work) {
  if (!work.ok()) return work.status();
  return (*work)->Synchronize();
}

absl::Status Check(Communicator& comm, at::TensorOptions options, int64_t chunk) {
  const int n = comm.size();
  const int r = comm.rank();
  const std::string tag =
      absl::StrCat(c10::toString(options.dtype().toScalarType()), " chunk ", chunk);
  const bool floating = at::isFloatingType(options.dtype().toScalarType());

  at::Tensor t = at::full({chunk}, r + 1, options);
  CT_RETURN_IF_ERROR(Done(comm.AllReduce(t, ReduceOp::kSum)));
  CT_RETURN_IF_ERROR(
      Expect(t, at::full({chunk}, n * (n + 1) / 2, options), "all-reduce sum " + tag));
  t.fill_(r + 1);
  CT_RETURN_IF_ERROR(Done(comm.AllReduce(t, ReduceOp::kMax)));
  CT_RETURN_IF_ERROR(Expect(t, at::full({chunk}, n, options), "all-reduce max " + tag));
  if (floating) {
    t.fill_(2 * (r + 1));
    CT_RETURN_IF_ERROR(Done(comm.AllReduce(t, ReduceOp::kAvg)));
    CT_RETURN_IF_ERROR(Expect(t, at::full({chunk}, n + 1, options), "all-reduce avg " + tag));
  }

  at::Tensor in = at::arange(chunk, options) + r * 1000;
  at::Tensor out = at::empty({n * chunk}, options);
  CT_RETURN_IF_ERROR(Done(comm.AllGather(in, out)));
  std::vector<at::Tensor> expected;
  for (int k = 0; k < n; ++k) expected.push_back(at::arange(chunk, options) + k * 1000);
  CT_RETURN_IF_ERROR(Expect(out, at::cat(expected), "all-gather " + tag));

  // Rank r contributes (r + 1) * (k + 1) to chunk k; chunk k sums to (k + 1) n (n + 1) / 2.
  at::Tensor big = at::empty({n * chunk}, options);
  for (int k = 0; k < n; ++k) big.narrow(0, k * chunk, chunk).fill_((r + 1) * (k + 1));
  at::Tensor mine = at::empty({chunk}, options);
  CT_RETURN_IF_ERROR(Done(comm.ReduceScatter(big, mine, ReduceOp::kSum)));
  CT_RETURN_IF_ERROR(Expect(mine, at::full({chunk}, (r + 1) * n * (n + 1) / 2, options),
                            "reduce-scatter sum " + tag));

  at::Tensor b = at::full({chunk}, r == n - 1 ? 7 : 0, options);
  CT_RETURN_IF_ERROR(Done(comm.Broadcast(b, n - 1)));
  CT_RETURN_IF_ERROR(Expect(b, at::full({chunk}, 7, options), "broadcast " + tag));

  // The last rank holds part k = k * 100 + arange(chunk); rank r receives part r only.
  const int root = n - 1;
  at::Tensor parts;
  if (r == root) {
    std::vector<at::Tensor> all;
    for (int k = 0; k < n; ++k) all.push_back(at::arange(chunk, options) + k * 100);
    parts = at::cat(all);
  }
  at::Tensor part = at::full({chunk}, -1, options);
  CT_RETURN_IF_ERROR(Done(comm.Scatter(parts, part, root)));
  CT_RETURN_IF_ERROR(Expect(part, at::arange(chunk, options) + r * 100, "scatter " + tag));

  std::vector<at::Tensor> many = {at::full({chunk}, r + 1, options),
                                  at::full({chunk + 3}, 1, options)};
  CT_RETURN_IF_ERROR(Done(comm.AllReduceCoalesced(many, ReduceOp::kSum)));
  CT_RETURN_IF_ERROR(
      Expect(many[0], at::full({chunk}, n * (n + 1) / 2, options), "coalesced all-reduce " + tag));
  CT_RETURN_IF_ERROR(
      Expect(many[1], at::full({chunk + 3}, n, options), "coalesced all-reduce " + tag));

  std::vector<at::Tensor> ins = {at::full({chunk}, r, options), at::full({2}, r, options)};
  std::vector<at::Tensor> outs = {at::empty({n * chunk}, options), at::empty({2 * n}, options)};
  CT_RETURN_IF_ERROR(Done(comm.AllGatherCoalesced(ins, outs)));
  at::Tensor ranks = at::arange(n, options);
  CT_RETURN_IF_ERROR(
      Expect(outs[0], ranks.repeat_interleave(chunk), "coalesced all-gather " + tag));
  CT_RETURN_IF_ERROR(Expect(outs[1], ranks.repeat_interleave(2), "coalesced all-gather " + tag));

  std::vector<at::Tensor> rs_in = {at::full({n * chunk}, r + 1, options)};
  std::vector<at::Tensor> rs_out = {at::empty({chunk}, options)};
  CT_RETURN_IF_ERROR(Done(comm.ReduceScatterCoalesced(rs_in, rs_out, ReduceOp::kSum)));
  CT_RETURN_IF_ERROR(Expect(rs_out[0], at::full({chunk}, n * (n + 1) / 2, options),
                            "coalesced reduce-scatter " + tag));
  return comm.Barrier();
}

// A collective that the other ranks never join must fail on its own, naming the collective
// and the rank (NCCL: the watchdog aborts the communicator), instead of hanging.
absl::Status CheckTimeout(const DistributedEnv& env, c10::intrusive_ptr<c10d::Store> store,
                          const at::Device& device) {
  auto group = c10::make_intrusive<c10d::PrefixStore>("timeout_check", store);
  const std::chrono::milliseconds short_timeout(3000);
  CT_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> comm,
      CreateCommunicatorForDevice(group, env.rank, env.world_size, device.type(), short_timeout));
  if (env.rank != 0) {
    // Waits until rank 0 is done; the communicator is left alone (never torn down with a
    // collective its peer abandoned).
    CT_RETURN_IF_ERROR(
        CatchTorch([&] { store->wait({"timeout_check_done"}, std::chrono::seconds(120)); }));
    comm.release();
    return absl::OkStatus();
  }
  at::Tensor t = at::ones({1024}, at::TensorOptions().device(device));
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<Work>> work = comm->AllReduce(t, ReduceOp::kSum);
  absl::Status status = work.ok() ? (*work)->Synchronize() : work.status();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CT_RETURN_IF_ERROR(
      CatchTorch([&] { store->set("timeout_check_done", std::vector<uint8_t>{1}); }));
  if (status.ok()) return absl::InternalError("an all-reduce no peer joined succeeded");
  const std::string message(status.message());
  if (message.find("rank 0") == std::string::npos ||
      (message.find("all-reduce") == std::string::npos &&
       message.find("AllReduce") == std::string::npos)) {
    return absl::InternalError("the timeout error does not name the collective and the rank: " +
                               message);
  }
  std::printf("rank 0: timeout check passed after %.1f s: %s\n", seconds, message.c_str());
  std::fflush(stdout);
  comm.release();
  return absl::OkStatus();
}

// --device=cuda: this process's GPU, as the NCCL communicator picks it.
absl::StatusOr<at::Device> CheckDevice() {
  if (absl::GetFlag(FLAGS_device) != "cuda") return at::Device(at::kCPU);
  CT_ASSIGN_OR_RETURN(const LocalDevice local,
                      LocalDeviceFromEnvironment(static_cast<int>(torch::cuda::device_count())));
  return at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(local.cuda_index));
}

absl::Status Run() {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  InitLogging("collectives_check", env.rank);
  CT_ASSIGN_OR_RETURN(const at::Device device, CheckDevice());
  const std::chrono::milliseconds timeout(120000);
  CT_ASSIGN_OR_RETURN(auto store, ConnectStore(env, timeout));
  CT_ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> comm,
      CreateCommunicatorForDevice(store, env.rank, env.world_size, device.type(), timeout));
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    for (int64_t chunk : {1, 5, 1003}) {
      CT_RETURN_IF_ERROR(Check(*comm, at::TensorOptions().dtype(dtype).device(device), chunk));
    }
  }
  std::printf("rank %d: %s over %d ranks: %d checks passed\n", env.rank, comm->backend().c_str(),
              env.world_size, checks);
  std::fflush(stdout);
  return CheckTimeout(env, store, device);
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
