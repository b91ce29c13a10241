// How a process finds its place in a job: read rank and world from the launcher's environment
// (torchrun, else Open MPI's mpirun, else SLURM, else a single process), connect the c10d store
// every rank shares, and create the communicator for a device type (on CUDA, this process's
// GPU as sharding/local_device.h picks it).
//
//   CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
//   CT_ASSIGN_OR_RETURN(auto store, ConnectStore(env, std::chrono::minutes(5)));
//   CT_ASSIGN_OR_RETURN(auto comm, CreateCommunicatorForDevice(
//       store, env.rank, env.world_size, c10::DeviceType::CPU, std::chrono::minutes(5)));
#ifndef CPPTRAIN_SHARDING_RENDEZVOUS_H_
#define CPPTRAIN_SHARDING_RENDEZVOUS_H_

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/DeviceType.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/communicator.h"

namespace cpptrain {

struct DistributedEnv {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun's agent already hosts a TCPStore at master_addr:master_port
  // (TORCHELASTIC_USE_AGENT_STORE=True, the default of torchrun 2.x). The ranks meet through it
  // only to learn where rank 0 hosts the job's own store (ConnectStore).
  bool use_agent_store = false;
  // TORCHELASTIC_RESTART_COUNT and TORCHELASTIC_RUN_ID: the key rank 0 publishes its store
  // under in the agent's store carries both, so a restarted attempt (or another job sharing
  // the store) never reads the address of an earlier one.
  int restart_count = 0;
  std::string run_id;
  // "torchrun", "mpirun", "slurm" or "single".
  std::string source = "single";
};

// The variables of the first launcher found:
//   torchrun, when RANK or WORLD_SIZE is set: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
//     MASTER_ADDR, MASTER_PORT, all required;
//   Open MPI's mpirun, when OMPI_COMM_WORLD_RANK or OMPI_COMM_WORLD_SIZE is set:
//     OMPI_COMM_WORLD_RANK, _LOCAL_RANK, _SIZE, _LOCAL_SIZE; MASTER_ADDR (mpirun -x
//     MASTER_ADDR=host), which may be left out when every rank runs on this host; MASTER_PORT
//     or 29500. Ahead of SLURM: mpirun inside an allocation starts its daemons with srun, and
//     its ranks inherit the daemons' SLURM variables;
//   SLURM, when SLURM_PROCID is set: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS,
//     SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE, SLURM_JOB_NODELIST's first host unless
//     MASTER_ADDR is set, MASTER_PORT or 29500;
// else rank 0 of 1. Errors name the variable and its value. (The GPU comes from
// sharding/local_device.h, which takes the local rank from these launchers in this order.)
absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment();
absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment(
    const std::function<const char*(const char*)>& getenv);

// The first host of a SLURM node list: "node[01-04,07]" -> "node01", "a,b" -> "a",
// "gpu-[1-3]x" -> "gpu-1x", "rack[1-2]-n[3-4]" -> "rack1-n3", "host" -> "host".
absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist);

// SLURM_TASKS_PER_NODE expanded per node: "4(x2),3" -> {4, 4, 3}.
absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(absl::string_view value);

// The store every rank of `env` shares: a c10d::TCPStore hosted by rank 0 (a HashStore for a
// world of one). Without the agent store it listens at master_addr:master_port. Under
// torchrun's agent store (use_agent_store), that port is the agent's, and its server speaks
// PyTorch 2.x's protocol, which LibTorch 1.13's client cannot: rank 0 then hosts the store on
// a free port and publishes "address:port" in the agent's store under
// "/worker/attempt_<restart_count>/cpptrain/<run_id>/store"
// (sharding/internal/agent_store_client.h), where the other ranks read it; the address is the
// one rank 0 reached the agent from (MASTER_ADDR when that is loopback). Everything after
// that (the peer watchdog, the communicators) uses the job's own store alike in both cases.
// Blocks until all world_size ranks have connected, at most `timeout`, which also becomes the
// store's timeout for later waits. With more than one rank it also starts this rank's
// PeerWatchdog (sharding/peer_watchdog.h) with the timeout CPPTRAIN_PEER_TIMEOUT_S gives
// (15 s unless set; 0: none; a bad value is an error before connecting): while any rank is
// silent that long, this process ends with exit code 75. The watchdog lives as long as the
// returned store and marks this rank finished when the store is released (or at exit).
// Letting go of the store in that order matters on LibTorch 1.x, whose TCPStore client ends
// its process when the server closes under it: a rank other than 0 closes its connection
// before its mark, and releasing rank 0's store (the server) blocks until every other rank's
// mark is in (or its heartbeat has stood still 3 s), at most the peer timeout, plus 200 ms.
// Hold the store until the job's work is done, and let go of it at exit before the watchdog's
// own exit handler does (an exit handler registered after ConnectStore returns runs first).
absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const DistributedEnv& env,
                                                             std::chrono::milliseconds timeout);

// Every rank of a group says which communicator it is about to create (`kind`, such as
// "cuda, NCCL") through `store`, then reads the others': an error on every rank, naming each
// rank's kind, when they differ. CreateCommunicatorForDevice calls it first, so ranks that
// chose differently (one sees no GPU and falls back to the CPU, or CPPTRAIN_SHARED_GPU or
// CPPTRAIN_CPU_COMM differs between them) fail at once instead of waiting in different
// rendezvous until the timeout. Nothing to agree with for one rank.
absl::Status AgreeOnCommunicatorKind(c10d::Store& store, int rank, int size,
                                     const std::string& kind, std::chrono::milliseconds timeout);

// CPU: Gloo, or the StoreCommunicator (slow, through `store`) in builds without Gloo or when
// the environment sets CPPTRAIN_CPU_COMM=store (=gloo insists on Gloo; another value is an
// error). CUDA: NCCL in builds with CPPTRAIN_HAS_NCCL (an error otherwise), on the GPU
// LocalDeviceFromEnvironment picks (sharding/local_device.h). Blocks like the
// communicator's Create (until every rank of the group joined, at most `timeout`).
absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicatorForDevice(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::DeviceType device_type,
    std::chrono::milliseconds timeout);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_RENDEZVOUS_H_
