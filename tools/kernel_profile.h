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
// (residual and gradient sums), elementwise, optimizer, fused (this project's kernels,
// kernels/), memcpy/memset, other. Kernels only exist on CUDA: elsewhere the table says so.
// After the table:
// - each family's time by the operation that launched it: the op Kineto links the kernel to,
//   and the backward node it ran in ("aten::add in AddBackward0"). kernels/ launches outside
//   any op and a replayed CUDA graph's kernels have no op, so profile without graphs;
// - how long the device sat idle between the window's first and last kernel, and the longest
//   idle gaps with the host calls that overlapped each (where a step waits for the host: a
//   synchronization, a pageable copy, the host's own work).
#ifndef CPPTRAIN_TOOLS_KERNEL_PROFILE_H_
#define CPPTRAIN_TOOLS_KERNEL_PROFILE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace cpptrain {

class KernelProfile {
 public:
  // Starts collecting CPU and CUDA activity.
  void Start();
  // Stops, and returns the table: per family ms per step, share and kernels per step, the 15
  // kernels with most time, LaunchReport's lines and the idle report. `steps` divides the
  // totals.
  std::string StopAndFormat(int64_t steps);

  // The family of a kernel named `name` (exposed for tests).
  static std::string Family(const std::string& name);

  // What LaunchReport reads from the profiler's events (exposed for tests).
  struct HostOp {        // a host operation (Kineto CPU op)
    uint64_t correlation = 0;  // its correlation id, which its kernels link to
    uint64_t thread = 0;
    uint64_t start = 0, end = 0;  // ns
    std::string name;
  };
  struct DeviceKernel {
    uint64_t linked = 0;  // the launching op's correlation id; 0 when none
    double ns = 0;
    std::string name;
  };
  // Per family (largest first) the `per_family` launching ops with most device time: ms and
  // kernels per step over `steps`, labelled "op in BackwardNode" inside the autograd engine.
  static std::string LaunchReport(const std::vector<DeviceKernel>& kernels,
                                  const std::vector<HostOp>& ops, int64_t steps,
                                  int per_family = 3);

 private:
  bool started_ = false;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_KERNEL_PROFILE_H_
