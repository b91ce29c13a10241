#include "sharding/local_device.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace cpptrain {
namespace {

using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

absl::StatusOr<LocalDevice> FromEnv(const Env& env, int visible_devices) {
  return LocalDeviceFromEnvironment(
      [&env](const char* name) -> const char* {
        auto it = env.find(name);
        return it == env.end() ? nullptr : it->second.c_str();
      },
      visible_devices);
}

struct Case {
  std::string name;
  Env env;
  int visible_devices;
  // Expected on success (`error` empty).
  int local_rank;
  int cuda_index;
  std::string variable;
  // Every part must appear in the error.
  std::vector<std::string> error;
};

Case Picks(std::string name, Env env, int visible_devices, int local_rank, int cuda_index,
           std::string variable) {
  return {std::move(name),
          std::move(env),
          visible_devices,
          local_rank,
          cuda_index,
          std::move(variable),
          {}};
}

Case Fails(std::string name, Env env, int visible_devices, std::vector<std::string> error) {
  return {std::move(name), std::move(env), visible_devices, 0, 0, "", std::move(error)};
}

// One row per launcher layout; the name says which.
std::vector<Case> LauncherCases() {
  return {
      Picks("torchrun",
            {{"RANK", "6"}, {"LOCAL_RANK", "2"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}}, 4,
            2, 2, "LOCAL_RANK"),
      Picks("srun with every GPU of the node visible",
            {{"SLURM_PROCID", "7"}, {"SLURM_LOCALID", "3"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}, 4,
            3, 3, "SLURM_LOCALID"),
      Picks("srun --gpus-per-task=1",
            {{"SLURM_PROCID", "7"}, {"SLURM_LOCALID", "3"}, {"CUDA_VISIBLE_DEVICES", "3"}}, 1, 3, 0,
            "SLURM_LOCALID"),
      Picks("srun --gpus-per-task=1, first task",
            {{"SLURM_LOCALID", "0"}, {"CUDA_VISIBLE_DEVICES", "0"}}, 1, 0, 0, "SLURM_LOCALID"),
      Picks("srun --gpus-per-task=2, second task",
            {{"SLURM_LOCALID", "1"}, {"CUDA_VISIBLE_DEVICES", "2,3"}}, 2, 1, 1, "SLURM_LOCALID"),
      Picks("mpirun (Open MPI)",
            {{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}}, 8, 1, 1,
            "OMPI_COMM_WORLD_LOCAL_RANK"),
      Picks("mpirun with one GPU per rank",
            {{"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"CUDA_VISIBLE_DEVICES", "GPU-8f2c"}}, 1, 3, 0,
            "OMPI_COMM_WORLD_LOCAL_RANK"),
      // mpirun's daemons were started by srun: every rank inherits a daemon's SLURM_LOCALID.
      Picks("mpirun inside a SLURM allocation",
            {{"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"SLURM_LOCALID", "0"}}, 4, 2, 2,
            "OMPI_COMM_WORLD_LOCAL_RANK"),
      Picks("mpiexec (MPICH, Intel MPI)", {{"PMI_RANK", "3"}, {"MPI_LOCALRANKID", "1"}}, 2, 1, 1,
            "MPI_LOCALRANKID"),
      Picks("mpiexec inside a SLURM allocation", {{"MPI_LOCALRANKID", "1"}, {"SLURM_LOCALID", "0"}},
            2, 1, 1, "MPI_LOCALRANKID"),
      Picks("single process", {}, 1, 0, 0, ""),
      Picks("single process on a host of 8 GPUs", {}, 8, 0, 0, ""),
      Picks("single process, one GPU of the host visible", {{"CUDA_VISIBLE_DEVICES", "5"}}, 1, 0, 0,
            ""),
      Picks("torchrun inside srun: LOCAL_RANK over SLURM_LOCALID",
            {{"LOCAL_RANK", "1"}, {"SLURM_LOCALID", "0"}}, 2, 1, 1, "LOCAL_RANK"),
      Picks("torchrun inside mpirun: LOCAL_RANK over OMPI_COMM_WORLD_LOCAL_RANK",
            {{"LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}}, 4, 0, 0, "LOCAL_RANK"),
      Fails("local rank beyond the visible devices",
            {{"SLURM_LOCALID", "4"}, {"CUDA_VISIBLE_DEVICES", "0,1,2,3"}}, 4,
            {"local rank 4 (SLURM_LOCALID=4) needs cuda:4", "sees 4 CUDA devices",
             "CUDA_VISIBLE_DEVICES=\"0,1,2,3\"", "start at most 4 processes",
             "srun --gpus-per-task=1"}),
      Fails("two ranks on a host of one GPU", {{"LOCAL_RANK", "1"}}, 1,
            {"LOCAL_RANK=1", "sees 1 CUDA device (CUDA_VISIBLE_DEVICES unset)",
             "start at most 1 process on this host", "a GPU of its own"}),
      Fails("CUDA_VISIBLE_DEVICES names two devices but one exists",
            {{"SLURM_LOCALID", "1"}, {"CUDA_VISIBLE_DEVICES", "0,7"}}, 1,
            {"SLURM_LOCALID=1", "CUDA_VISIBLE_DEVICES=\"0,7\""}),
      Fails("two GPUs per task, local rank 2",
            {{"SLURM_LOCALID", "2"}, {"CUDA_VISIBLE_DEVICES", "4,5"}}, 2,
            {"SLURM_LOCALID=2", "sees 2 CUDA devices", "CUDA_VISIBLE_DEVICES=\"4,5\""}),
      Fails("non-numeric LOCAL_RANK", {{"LOCAL_RANK", "abc"}}, 4,
            {"LOCAL_RANK=\"abc\" is not a local rank", "torchrun", "fix it or unset it"}),
      Fails("empty SLURM_LOCALID", {{"SLURM_LOCALID", ""}}, 4,
            {"SLURM_LOCALID=\"\" is not a local rank", "srun"}),
      Fails("negative OMPI_COMM_WORLD_LOCAL_RANK", {{"OMPI_COMM_WORLD_LOCAL_RANK", "-1"}}, 4,
            {"OMPI_COMM_WORLD_LOCAL_RANK=\"-1\" is not a local rank"}),
      // A bad variable is reported, not skipped for the next one.
      Fails("non-numeric LOCAL_RANK with a valid SLURM_LOCALID",
            {{"LOCAL_RANK", "1x"}, {"SLURM_LOCALID", "1"}}, 4, {"LOCAL_RANK=\"1x\""}),
      Picks("shared GPU: three ranks on one GPU, the third",
            {{"LOCAL_RANK", "2"}, {"CPPTRAIN_SHARED_GPU", "1"}}, 1, 2, 0, "LOCAL_RANK"),
      Picks("shared GPU: four ranks on two GPUs, the fourth",
            {{"LOCAL_RANK", "3"}, {"CPPTRAIN_SHARED_GPU", "1"}}, 2, 3, 1, "LOCAL_RANK"),
      Fails("CPPTRAIN_SHARED_GPU not 0 or 1", {{"LOCAL_RANK", "1"}, {"CPPTRAIN_SHARED_GPU", "yes"}},
            1, {"CPPTRAIN_SHARED_GPU=\"yes\" is neither 0 nor 1"}),
      Fails("no CUDA device", {{"CUDA_VISIBLE_DEVICES", ""}}, 0,
            {"local rank 0", "sees no CUDA device (CUDA_VISIBLE_DEVICES=\"\")", "run on the CPU"}),
  };
}

TEST(LocalDeviceTest, Launchers) {
  for (const Case& c : LauncherCases()) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<LocalDevice> device = FromEnv(c.env, c.visible_devices);
    if (!c.error.empty()) {
      ASSERT_FALSE(device.ok()) << "got cuda:" << device->cuda_index;
      for (const std::string& part : c.error) {
        EXPECT_THAT(std::string(device.status().message()), HasSubstr(part));
      }
      continue;
    }
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(device->local_rank, c.local_rank);
    EXPECT_EQ(device->cuda_index, c.cuda_index);
    EXPECT_EQ(device->local_rank_variable, c.variable);
    EXPECT_EQ(device->shared_gpu, c.env.count("CPPTRAIN_SHARED_GPU") > 0);
  }
}

TEST(LocalDeviceTest, SameLocalRankAsTheLauncher) {
  struct Check {
    std::string name;
    Env env;
    int launcher_local_rank;
    std::string launcher;
    std::string error;  // empty: agrees
  };
  const std::vector<Check> checks = {
      {"srun", {{"SLURM_LOCALID", "1"}}, 1, "slurm", ""},
      {"torchrun inside srun", {{"LOCAL_RANK", "2"}, {"SLURM_LOCALID", "0"}}, 2, "torchrun", ""},
      {"LOCAL_RANK exported by a job script under srun",
       {{"LOCAL_RANK", "0"}, {"SLURM_LOCALID", "1"}},
       1,
       "slurm",
       "local rank 0 (LOCAL_RANK=0) picks the GPU but the slurm variables give local rank 1"},
      {"LOCAL_RANK exported under mpirun",
       {{"LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}},
       2,
       "mpirun",
       "local rank 3 (LOCAL_RANK=3) picks the GPU but the mpirun variables give local rank 2"},
  };
  for (const Check& c : checks) {
    SCOPED_TRACE(c.name);
    absl::StatusOr<LocalDevice> device = FromEnv(c.env, 8);
    ASSERT_TRUE(device.ok()) << device.status();
    const absl::Status status = CheckSameLocalRank(*device, c.launcher_local_rank, c.launcher);
    if (c.error.empty()) {
      EXPECT_TRUE(status.ok()) << status;
    } else {
      EXPECT_THAT(std::string(status.message()), HasSubstr(c.error));
    }
  }
}

}  // namespace
}  // namespace cpptrain
