#include "sharding/local_device.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status.h"

namespace cpptrain {
namespace {

using GetEnv = std::function<const char*(const char*)>;

struct LocalRankVariable {
  const char* name;
  const char* launcher;
};

// In precedence order (local_device.h says why the MPI launchers come before SLURM).
constexpr LocalRankVariable kLocalRankVariables[] = {
    {"LOCAL_RANK", "torchrun"},
    {"OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI's mpirun"},
    {"MPI_LOCALRANKID", "MPICH's mpiexec"},
    {"SLURM_LOCALID", "srun"},
};

// The local rank from the first variable that is set; the device is left for the caller.
absl::StatusOr<LocalDevice> LocalRankFromEnvironment(const GetEnv& getenv) {
  LocalDevice device;
  for (const LocalRankVariable& variable : kLocalRankVariables) {
    const char* value = getenv(variable.name);
    if (value == nullptr) continue;
    if (!absl::SimpleAtoi(value, &device.local_rank) || device.local_rank < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(variable.name, "=\"", value, "\" is not a local rank (", variable.launcher,
                       " sets it to a whole number >= 0 for each process): fix it or unset it"));
    }
    device.local_rank_variable = variable.name;
    return device;
  }
  return device;
}

std::string VisibleDevicesText(const GetEnv& getenv) {
  const char* value = getenv("CUDA_VISIBLE_DEVICES");
  if (value == nullptr) return "CUDA_VISIBLE_DEVICES unset";
  return absl::StrCat("CUDA_VISIBLE_DEVICES=\"", value, "\"");
}

std::string LocalRankText(const LocalDevice& device) {
  if (device.local_rank_variable.empty()) {
    return "local rank 0 (no LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID or "
           "SLURM_LOCALID set)";
  }
  return absl::StrCat("local rank ", device.local_rank, " (", device.local_rank_variable, "=",
                      device.local_rank, ")");
}

// Whether the launcher left this process one GPU of its own: CUDA_VISIBLE_DEVICES names exactly
// one device (srun --gpus-per-task=1 sets it per task).
bool NamesOneDevice(const GetEnv& getenv) {
  const char* value = getenv("CUDA_VISIBLE_DEVICES");
  if (value == nullptr) return false;
  const std::vector<absl::string_view> devices = absl::StrSplit(value, ',', absl::SkipEmpty());
  return devices.size() == 1;
}

// CPPTRAIN_SHARED_GPU: unset, "0" or "1".
absl::StatusOr<bool> SharedGpu(const GetEnv& getenv) {
  const char* value = getenv("CPPTRAIN_SHARED_GPU");
  if (value == nullptr || absl::string_view(value) == "0") return false;
  if (absl::string_view(value) == "1") return true;
  return absl::InvalidArgumentError(absl::StrCat(
      "CPPTRAIN_SHARED_GPU=\"", value,
      "\" is neither 0 nor 1: set 1 to let processes share a GPU (collectives staged through "
      "the CPU, for tests), or unset it"));
}

}  // namespace

absl::StatusOr<LocalDevice> LocalDeviceFromEnvironment(const GetEnv& getenv, int visible_devices) {
  CT_ASSIGN_OR_RETURN(LocalDevice device, LocalRankFromEnvironment(getenv));
  if (visible_devices < 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        LocalRankText(device), ": this process sees no CUDA device (", VisibleDevicesText(getenv),
        "); run on the CPU, or check CUDA_VISIBLE_DEVICES and the GPUs the job was given"));
  }
  CT_ASSIGN_OR_RETURN(device.shared_gpu, SharedGpu(getenv));
  if (device.shared_gpu) {
    device.cuda_index = device.local_rank % visible_devices;
    return device;
  }
  if (device.local_rank < visible_devices) {
    device.cuda_index = device.local_rank;
    return device;
  }
  if (visible_devices == 1 && NamesOneDevice(getenv)) {
    device.cuda_index = 0;  // one GPU per task, whatever the local rank
    return device;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      LocalRankText(device), " needs cuda:", device.local_rank, ", but this process sees ",
      visible_devices, visible_devices == 1 ? " CUDA device (" : " CUDA devices (",
      VisibleDevicesText(getenv), "): start at most ", visible_devices,
      visible_devices == 1 ? " process" : " processes",
      " on this host (one per GPU), or give each process a GPU of its own "
      "(CUDA_VISIBLE_DEVICES naming one device, as srun --gpus-per-task=1 sets it)"));
}

absl::StatusOr<LocalDevice> LocalDeviceFromEnvironment(int visible_devices) {
  return LocalDeviceFromEnvironment(&std::getenv, visible_devices);
}

absl::Status CheckSameLocalRank(const LocalDevice& device, int launcher_local_rank,
                                absl::string_view launcher) {
  if (device.local_rank == launcher_local_rank) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      LocalRankText(device), " picks the GPU but the ", launcher, " variables give local rank ",
      launcher_local_rank,
      ": two launchers' variables disagree; unset those of the launcher that did not start this "
      "process"));
}

}  // namespace cpptrain
