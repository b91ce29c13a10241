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

// Start times: startNs in 2.x, startUs in 1.13.
template <typename Event>
auto StartNs(const Event& event, int) -> decltype(event.startNs()) {
  return event.startNs();
}
template <typename Event>
uint64_t StartNs(const Event& event, long) {
  return event.startUs() * 1000;
}

struct Interval {
  uint64_t start = 0;
  uint64_t end = 0;
  std::string name;
};

// Where the device waited: the union of the kernels' intervals against the window from the
// first kernel's start to the last one's end, then the longest gaps between kernels, each with
// the kernels on either side and the host calls that overlapped it most (what the device
// waited for: a synchronization, a copy, the host's own work).
std::string IdleReport(std::vector<Interval> kernels, const std::vector<Interval>& host,
                       int64_t steps) {
  if (kernels.empty()) return "";
  std::sort(kernels.begin(), kernels.end(),
            [](const Interval& a, const Interval& b) { return a.start < b.start; });
  struct Gap {
    uint64_t length, start, end;
    std::string before, after;
  };
  std::vector<Gap> gaps;
  uint64_t busy = 0;
  uint64_t covered_to = kernels[0].start;
  std::string last = kernels[0].name;
  for (const Interval& k : kernels) {
    if (k.start > covered_to) {
      gaps.push_back({k.start - covered_to, covered_to, k.start, last, k.name});
      covered_to = k.start;
    }
    if (k.end > covered_to) {
      busy += k.end - covered_to;
      covered_to = k.end;
      last = k.name;
    }
  }
  const double span = static_cast<double>(covered_to - kernels[0].start);
  const double per_step = 1e6 * static_cast<double>(std::max<int64_t>(steps, 1));
  std::string out = absl::StrFormat(
      "profile: device busy %.1f of %.1f ms per step from first kernel to last: idle %.1f ms\n",
      static_cast<double>(busy) / per_step, span / per_step,
      (span - static_cast<double>(busy)) / per_step);
  std::sort(gaps.begin(), gaps.end(),
            [](const Gap& a, const Gap& b) { return a.length > b.length; });
  out += "profile: longest idle gaps (ms; kernel before -> after; host calls overlapping it):\n";
  for (size_t i = 0; i < gaps.size() && i < 5; ++i) {
    const Gap& g = gaps[i];
    std::vector<std::pair<uint64_t, std::string>> during;
    for (const Interval& h : host) {
      const uint64_t from = std::max(h.start, g.start);
      const uint64_t to = std::min(h.end, g.end);
      if (to > from && h.end - h.start < static_cast<uint64_t>(span)) {
        during.push_back({to - from, h.name});
      }
    }
    std::sort(during.rbegin(), during.rend());
    std::string calls;
    for (size_t j = 0; j < during.size() && j < 4; ++j) {
      absl::StrAppendFormat(&calls, "%s%s %.2f", j ? ", " : "", during[j].second.substr(0, 40),
                            static_cast<double>(during[j].first) / 1e6);
    }
    absl::StrAppendFormat(&out, "profile:   %6.2f  %s -> %s; %s\n",
                          static_cast<double>(g.length) / 1e6, g.before.substr(0, 50),
                          g.after.substr(0, 50), calls.empty() ? "no host call" : calls);
  }
  return out;
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
  std::vector<Interval> device_intervals;
  std::vector<Interval> host_intervals;
  for (const auto& event : result->events()) {
    const uint64_t start = StartNs(event, 0);
    const uint64_t end = start + DurationNs(event, 0);
    if (event.deviceType() != c10::DeviceType::CUDA) {
      host_intervals.push_back({start, end, event.name()});
      continue;
    }
    device_intervals.push_back({start, end, event.name()});
    const double ns = static_cast<double>(end - start);
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
  return out + IdleReport(std::move(device_intervals), host_intervals, steps);
}

}  // namespace cpptrain
