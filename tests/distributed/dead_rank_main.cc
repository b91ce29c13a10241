// Run under //tools:launch with N processes (Gloo on the CPU): every rank all-reduces in a
// loop, and one rank (--fault_rank, the last by default) fails in the middle of the loop
// (after iteration --die_at) as --fault says:
//   kill: SIGKILL. Its connections close, so the others' collective fails or the launcher,
//         seeing the exit, stops them; the launcher names the dead rank.
//   stop: SIGSTOP. The process lives on, holding its sockets and sending nothing: the others
//         wait in the all-reduce until their peer watchdogs (sharding/peer_watchdog.h) see
//         its silence and end them; then the launcher stops the rest. It first prints
//         "stop_epoch_ms=<ms since the epoch>" so a test can time the job from the stop.
// With --catch_sigterm, SIGTERM only sets a flag, as during tools/train's Train(), so a rank
// that is stopped or blocked in a collective outlives the launcher's SIGTERM until its SIGKILL.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>

#include <torch/types.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "sharding/rendezvous.h"

ABSL_FLAG(int, die_at, 20, "iteration after which the faulty rank fails");
ABSL_FLAG(int, iterations, 1000000, "all-reduces to run");
ABSL_FLAG(std::string, fault, "kill", "kill (SIGKILL) or stop (SIGSTOP)");
ABSL_FLAG(int, fault_rank, -1, "the rank that fails; -1: the last");
ABSL_FLAG(bool, catch_sigterm, false, "SIGTERM only sets a flag, as in tools/train");
ABSL_FLAG(int, timeout_s, 1800, "the rendezvous's and the collectives' timeout (ddp_timeout's "
          "default)");

namespace {

volatile sig_atomic_t g_sigterm = 0;

void RecordSigterm(int) { g_sigterm = 1; }

void Fail(const std::string& fault) {
  if (fault == "stop") {
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    LOG(INFO) << "stopping myself (SIGSTOP) in the middle of the all-reduces: stop_epoch_ms="
              << std::chrono::duration_cast<std::chrono::milliseconds>(now).count();
    google::FlushLogFiles(google::GLOG_INFO);
    raise(SIGSTOP);
    return;
  }
  LOG(INFO) << "killing myself in the middle of the all-reduces";
  raise(SIGKILL);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  auto env = cpptrain::DistributedEnvFromEnvironment();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 1;
  }
  cpptrain::InitLogging(argv[0], env->rank);
  const std::string fault = absl::GetFlag(FLAGS_fault);
  if (fault != "kill" && fault != "stop") {
    LOG(ERROR) << "--fault=" << fault << " is neither kill nor stop";
    return 1;
  }
  if (absl::GetFlag(FLAGS_catch_sigterm)) signal(SIGTERM, &RecordSigterm);
  const int fault_rank =
      absl::GetFlag(FLAGS_fault_rank) < 0 ? env->world_size - 1 : absl::GetFlag(FLAGS_fault_rank);
  const std::chrono::seconds timeout(absl::GetFlag(FLAGS_timeout_s));
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
    if (env->rank == fault_rank && i == absl::GetFlag(FLAGS_die_at)) Fail(fault);
    auto work = (*comm)->AllReduce(t, cpptrain::ReduceOp::kAvg);
    absl::Status status = work.ok() ? (*work)->Wait() : work.status();
    if (!status.ok()) {
      LOG(ERROR) << "all-reduce " << i << " failed: " << status.message();
      return 2;
    }
  }
  return 0;
}
