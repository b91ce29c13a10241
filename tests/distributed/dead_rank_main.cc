// Run under //tools:launch with N processes (Gloo on the CPU): every rank all-reduces in a
// loop; the last rank kills itself with SIGKILL in the middle of the loop (after iteration
// --die_at). The other ranks must not hang: their collective fails (the peer's connection
// closes) or the launcher stops them, and the launcher reports the dead rank.
#include <signal.h>
#include <unistd.h>

#include <chrono>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "sharding/rendezvous.h"

ABSL_FLAG(int, die_at, 20, "iteration after which the last rank kills itself");
ABSL_FLAG(int, iterations, 1000000, "all-reduces to run");

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto env = cpptrain::DistributedEnvFromEnvironment();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 1;
  }
  cpptrain::InitLogging(argv[0], env->rank);
  const std::chrono::milliseconds timeout(30000);
  auto store = cpptrain::ConnectStore(*env, timeout);
  if (!store.ok()) {
    LOG(ERROR) << store.status();
    return 1;
  }
  auto comm = cpptrain::CreateCommunicatorForDevice(*store, env->rank, env->world_size,
                                                     c10::DeviceType::CPU, timeout);
  if (!comm.ok()) {
    LOG(ERROR) << comm.status();
    return 1;
  }
  at::Tensor t = torch::ones({1 << 16});
  for (int i = 0; i < absl::GetFlag(FLAGS_iterations); ++i) {
    if (env->rank == env->world_size - 1 && i == absl::GetFlag(FLAGS_die_at)) {
      LOG(INFO) << "killing myself in the middle of the all-reduces";
      raise(SIGKILL);
    }
    auto work = (*comm)->AllReduce(t, cpptrain::ReduceOp::kAvg);
    absl::Status status = work.ok() ? (*work)->Wait() : work.status();
    if (!status.ok()) {
      LOG(ERROR) << "all-reduce " << i << " failed: " << status.message();
      return 2;
    }
  }
  return 0;
}
