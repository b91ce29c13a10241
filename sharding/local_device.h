// Which GPU this process drives: the one rule every place that picks a CUDA device follows
// (the NCCL communicator, the engines' data-parallel device, the local engine's "auto", the
// tools), so they cannot disagree.
//
//   CT_ASSIGN_OR_RETURN(LocalDevice local,
//                       LocalDeviceFromEnvironment(static_cast<int>(torch::cuda::device_count())));
//   const c10::Device device(c10::kCUDA, local.cuda_index);
//
// The local rank (this process's index among the job's processes on its host) is the first of
//   LOCAL_RANK                  torchrun, tools/launch
//   OMPI_COMM_WORLD_LOCAL_RANK  Open MPI's mpirun
//   MPI_LOCALRANKID             MPICH's and Intel MPI's mpiexec (Hydra)
//   SLURM_LOCALID               srun
// that is set, else 0. The MPI launchers come before SLURM: mpirun inside a SLURM allocation
// starts its daemons with srun, so its ranks inherit a daemon's SLURM_LOCALID (0 on every
// rank of a host).
//
// The device is cuda:<local rank> when the process sees more CUDA devices than its local rank;
// else cuda:0 when CUDA_VISIBLE_DEVICES names exactly one device and the process sees one (one
// GPU per task, as srun --gpus-per-task=1 arranges); else an error, because several processes
// on one GPU fail in NCCL ("Duplicate GPU detected").
//
// Shared-GPU mode (CPPTRAIN_SHARED_GPU=1, for tests on a machine with fewer GPUs than
// processes): the device is cuda:<local rank modulo the devices seen>, and `shared_gpu` tells
// the communicators to stage CUDA tensors through the CPU communicator instead of NCCL
// (sharding/staged_communicator.h). Every process of the job must be given the same setting.
#ifndef CPPTRAIN_SHARDING_LOCAL_DEVICE_H_
#define CPPTRAIN_SHARDING_LOCAL_DEVICE_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cpptrain {

struct LocalDevice {
  int local_rank = 0;
  // The variable the local rank came from ("LOCAL_RANK", ...); empty when none was set.
  std::string local_rank_variable;
  // The CUDA device index, among the devices this process sees.
  int cuda_index = 0;
  // CPPTRAIN_SHARED_GPU=1: processes may share a GPU; CUDA collectives are staged, not NCCL's.
  bool shared_gpu = false;
};

// `visible_devices`: the CUDA devices this process sees (torch::cuda::device_count()); the
// caller asks CUDA, this function only reads the environment. Errors name the variables, their
// values and the device count, and say what to change.
absl::StatusOr<LocalDevice> LocalDeviceFromEnvironment(
    const std::function<const char*(const char*)>& getenv, int visible_devices);
absl::StatusOr<LocalDevice> LocalDeviceFromEnvironment(int visible_devices);

// An error unless `device` has the local rank `launcher_local_rank` that the launcher
// `launcher` gives (DistributedEnv's local_rank and source): when two launchers' variables
// disagree (say, a LOCAL_RANK a job script exported under srun), ranks would share a GPU.
absl::Status CheckSameLocalRank(const LocalDevice& device, int launcher_local_rank,
                                absl::string_view launcher);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_LOCAL_DEVICE_H_
