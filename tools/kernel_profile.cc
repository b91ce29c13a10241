#include "tools/kernel_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace cpptrain {
namespace {

namespace profiler = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

// LibTorch 2.x reports durations in ns (durationNs), 1.13 in us (durationUs).
template <typename Event>
auto DurationNs(const Event& event, int) -> decltype(event.durationNs()) {
  return event.durationNs();
}
template <typename Event>
uint64_t DurationNs(const Event& event, long) {
  return event.durationUs() * 1000;
}

std::string Lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

bool HasAny(const std::string& s, std::initializer_list<const char*> words) {
  for (const char* w : words) {
    if (absl::StrContains(s, w)) return true;
  }
  return false;
}

}  // namespace

std::string KernelProfile::Family(const std::string& name) {
  const std::string n = Lower(name);
  if (HasAny(n, {"cpptrain"})) return "fused (kernels/)";
  if (HasAny(n, {"memcpy", "memset"})) return "memcpy/memset";
  if (HasAny(n, {"flash", "fmha", "attention", "sdpa", "cudnn"})) return "attention";
  if (HasAny(n, {"gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "gemv"})) {
    return "matmul";
  }
  if (HasAny(n, {"adam", "multi_tensor", "foreach"})) return "optimizer";
  if (HasAny(n, {"softmax", "nll_loss", "cross_entropy", "logsumexp"})) {
    return "cross-entropy/softmax";
  }
  // "nocast" in ATen's kernel names means no conversion: those are plain elementwise.
  if (HasAny(n, {"copy_kernel", "catarray", "cat_", "_to_copy"})) return "cast/copy";
  if (HasAny(n, {"reduce", "norm"})) return "norm/reduction";
  if (HasAny(n, {"functor_add", "add_kernel"})) return "add";
  if (HasAny(n, {"elementwise", "vectorized", "unrolled"})) return "elementwise";
  return "other";
}

void KernelProfile::Start() {
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO);
  const std::set<impl::ActivityType> activities = {impl::ActivityType::CPU,
                                                   impl::ActivityType::CUDA};
  profiler::prepareProfiler(config, activities);
  profiler::enableProfiler(config, activities);
  started_ = true;
}

std::string KernelProfile::StopAndFormat(int64_t steps) {
  if (!started_) return "profile: not started\n";
  started_ = false;
  std::unique_ptr<profiler::ProfilerResult> result = profiler::disableProfiler();
  std::map<std::string, std::pair<double, int64_t>> families;  // ns, count
  std::map<std::string, double> kernels;
  double total = 0;
  for (const auto& event : result->events()) {
    if (event.deviceType() != c10::DeviceType::CUDA) continue;
    const double ns = static_cast<double>(DurationNs(event, 0));
    auto& family = families[Family(event.name())];
    family.first += ns;
    family.second += 1;
    kernels[event.name()] += ns;
    total += ns;
  }
  if (total == 0) {
    return "profile: SKIPPED: no CUDA kernels were recorded (device time per kernel needs a "
           "CUDA device and LibTorch's Kineto)\n";
  }
  const double per_step = 1e6 * static_cast<double>(std::max<int64_t>(steps, 1));  // ns -> ms
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, value] : families) order.push_back({value.first, name});
  std::sort(order.rbegin(), order.rend());
  std::string out = absl::StrFormat("profile: device time per step over %d steps: %.1f ms\n", steps,
                                    total / per_step);
  out += "profile: | family | ms/step | share | kernels/step |\n";
  for (const auto& [ns, name] : order) {
    absl::StrAppendFormat(&out, "profile: | %s | %.2f | %.1f%% | %.0f |\n", name, ns / per_step,
                          100 * ns / total,
                          static_cast<double>(families[name].second) / std::max<int64_t>(steps, 1));
  }
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [name, ns] : kernels) top.push_back({ns, name});
  std::sort(top.rbegin(), top.rend());
  out += "profile: top kernels (ms/step, family, name):\n";
  for (size_t i = 0; i < top.size() && i < 15; ++i) {
    absl::StrAppendFormat(&out, "profile:   %7.2f  %-22s %s\n", top[i].first / per_step,
                          Family(top[i].second), top[i].second.substr(0, 110));
  }
  return out;
}

}  // namespace cpptrain
