// Device time per kernel family over a window of training steps, from LibTorch's profiler
// (Kineto), as tools/bench --profile_steps prints it:
//
//   KernelProfile profile;
//   profile.Start();                  // after a device sync
//   ... N steps ...
//   std::string table = profile.StopAndFormat(N);   // after a device sync
//
// Families (by kernel name): matmul (cuBLAS/CUTLASS), attention (flash/cuDNN/efficient SDPA),
// cross-entropy/softmax, cast/copy (conversions, transposes, cat), norm/reduction, add
// (residual and gradient sums), elementwise, optimizer, fused (this
// project's kernels, kernels/), memcpy/memset, other. Kernels only exist on CUDA: elsewhere
// the table says so. After the table, how long the device sat idle between the window's first
// and last kernel, and the longest idle gaps with the host calls that overlapped each (where a
// step waits for the host: a synchronization, a pageable copy, the host's own work).
#ifndef CPPTRAIN_TOOLS_KERNEL_PROFILE_H_
#define CPPTRAIN_TOOLS_KERNEL_PROFILE_H_

#include <cstdint>
#include <string>

namespace cpptrain {

class KernelProfile {
 public:
  // Starts collecting CPU and CUDA activity.
  void Start();
  // Stops, and returns the table: per family ms per step, share and kernels per step, then
  // the 15 kernels with most time. `steps` divides the totals.
  std::string StopAndFormat(int64_t steps);

  // The family of a kernel named `name` (exposed for tests).
  static std::string Family(const std::string& name);

 private:
  bool started_ = false;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_KERNEL_PROFILE_H_
