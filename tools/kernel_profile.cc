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

using Span = std::pair<uint64_t, uint64_t>;

// An event's start and end in ns: LibTorch 2.x reports startNs and durationNs, 1.13 startUs
// and durationUs.
template <typename Event>
auto SpanNs(const Event& e, int) -> decltype(e.startNs() + e.durationNs(), Span()) {
  return {e.startNs(), e.startNs() + e.durationNs()};
}
template <typename Event>
Span SpanNs(const Event& e, long) {
  return {e.startUs() * 1000, (e.startUs() + e.durationUs()) * 1000};
}

// A total over `steps` steps, per step; MsPerStep from ns.
double PerStep(double total, int64_t steps) {
  return total / static_cast<double>(std::max<int64_t>(steps, 1));
}
double MsPerStep(double ns, int64_t steps) { return PerStep(ns, steps) / 1e6; }

// Kineto's activity types of host operations: CPU_OP (0) and USER_ANNOTATION (1), whose
// correlation ids are the ones kernels link to. CUDA runtime calls (7) count apart, so their
// ids could collide with an op's. (Debian's LibTorch ships no kineto/ActivityType.h.)
bool IsHostOp(uint8_t activity_type) { return activity_type <= 1; }

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
  std::string out = absl::StrFormat(
      "profile: device busy %.1f of %.1f ms per step from first kernel to last: idle %.1f ms\n",
      MsPerStep(static_cast<double>(busy), steps), MsPerStep(span, steps),
      MsPerStep(span - static_cast<double>(busy), steps));
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

constexpr char kNodePrefix[] = "autograd::engine::evaluate_function: ";

// A backward node's name without the engine's prefix; a C++ custom function's
// "torch::autograd::CppNode<ns::Name>" becomes "Name".
std::string NodeName(std::string name) {
  if (absl::StartsWith(name, kNodePrefix)) name = name.substr(sizeof(kNodePrefix) - 1);
  const size_t open = name.find("CppNode<");
  if (open != std::string::npos) {
    name = name.substr(open + 8);
    if (!name.empty() && name.back() == '>') name.pop_back();
    const size_t last = name.rfind("::");
    if (last != std::string::npos) name = name.substr(last + 2);
  }
  return name.substr(0, 60);
}

using HostOp = KernelProfile::HostOp;

// The backward nodes' evaluations per thread, by start: where an op ran inside the engine.
class BackwardNodes {
 public:
  explicit BackwardNodes(const std::vector<HostOp>& ops) {
    for (const HostOp& op : ops) {
      if (absl::StartsWith(op.name, kNodePrefix)) by_thread_[op.thread].push_back(&op);
    }
    for (auto& [thread, nodes] : by_thread_) {
      std::sort(nodes.begin(), nodes.end(),
                [](const HostOp* a, const HostOp* b) { return a->start < b->start; });
    }
  }

  // The innermost node on op's thread whose evaluation encloses op; nullptr in the forward.
  const HostOp* Enclosing(const HostOp& op) const {
    const auto found = by_thread_.find(op.thread);
    if (found == by_thread_.end()) return nullptr;
    const std::vector<const HostOp*>& nodes = found->second;
    auto it = std::upper_bound(nodes.begin(), nodes.end(), op.start,
                               [](uint64_t t, const HostOp* n) { return t < n->start; });
    while (it != nodes.begin()) {
      --it;
      if ((*it)->end >= op.end) return *it;
    }
    return nullptr;
  }

 private:
  std::map<uint64_t, std::vector<const HostOp*>> by_thread_;
};

// "aten::add in AddBackward0", "aten::mm" (forward), "in Node" (launched by the node's own
// code outside any op: the engine records the node's evaluation, and inside it the node under
// its bare name), or why there is no op.
std::string LaunchLabel(const HostOp* op, const BackwardNodes& nodes) {
  if (op == nullptr) {
    return "(no launching op: a kernels/ launch outside any op, or a replayed CUDA graph)";
  }
  if (absl::StartsWith(op->name, kNodePrefix)) return "in " + NodeName(op->name);
  const HostOp* node = nodes.Enclosing(*op);
  if (node == nullptr) return op->name.substr(0, 60);
  if (node->name.substr(sizeof(kNodePrefix) - 1) == op->name) return "in " + NodeName(op->name);
  return absl::StrCat(op->name.substr(0, 60), " in ", NodeName(node->name));
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

std::string KernelProfile::LaunchReport(const std::vector<DeviceKernel>& kernels,
                                        const std::vector<HostOp>& ops, int64_t steps,
                                        int per_family) {
  std::map<uint64_t, const HostOp*> by_correlation;
  for (const HostOp& op : ops) by_correlation[op.correlation] = &op;
  const BackwardNodes nodes(ops);
  // family -> (total ns, label -> (ns, kernels))
  std::map<std::string, std::pair<double, std::map<std::string, std::pair<double, int64_t>>>>
      families;
  for (const DeviceKernel& k : kernels) {
    const auto op = by_correlation.find(k.linked);
    const std::string label =
        LaunchLabel(k.linked == 0 || op == by_correlation.end() ? nullptr : op->second, nodes);
    auto& family = families[Family(k.name)];
    family.first += k.ns;
    auto& entry = family.second[label];
    entry.first += k.ns;
    entry.second += 1;
  }
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, family] : families) order.push_back({family.first, name});
  std::sort(order.rbegin(), order.rend());
  std::string out = "profile: by op | family | launching op | ms/step | kernels/step |\n";
  for (const auto& [ns, family] : order) {
    std::vector<std::pair<double, std::pair<std::string, int64_t>>> top;
    for (const auto& [label, entry] : families[family].second) {
      top.push_back({entry.first, {label, entry.second}});
    }
    std::sort(top.rbegin(), top.rend());
    for (size_t i = 0; i < top.size() && i < static_cast<size_t>(per_family); ++i) {
      absl::StrAppendFormat(&out, "profile: by op | %s | %s | %.2f | %.1f |\n", family,
                            top[i].second.first, MsPerStep(top[i].first, steps),
                            PerStep(static_cast<double>(top[i].second.second), steps));
    }
  }
  return out;
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
  std::vector<DeviceKernel> launched;
  std::vector<HostOp> ops;
  for (const auto& event : result->events()) {
    const auto [start, end] = SpanNs(event, 0);
    if (event.deviceType() != c10::DeviceType::CUDA) {
      host_intervals.push_back({start, end, event.name()});
      if (IsHostOp(event.activityType())) {
        ops.push_back({event.correlationId(), event.startThreadId(), start, end, event.name()});
      }
      continue;
    }
    device_intervals.push_back({start, end, event.name()});
    const double ns = static_cast<double>(end - start);
    launched.push_back({event.linkedCorrelationId(), ns, event.name()});
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
  std::vector<std::pair<double, std::string>> order;
  for (const auto& [name, value] : families) order.push_back({value.first, name});
  std::sort(order.rbegin(), order.rend());
  std::string out = absl::StrFormat("profile: device time per step over %d steps: %.1f ms\n", steps,
                                    MsPerStep(total, steps));
  out += "profile: | family | ms/step | share | kernels/step |\n";
  for (const auto& [ns, name] : order) {
    absl::StrAppendFormat(&out, "profile: | %s | %.2f | %.1f%% | %.0f |\n", name,
                          MsPerStep(ns, steps), 100 * ns / total,
                          PerStep(static_cast<double>(families[name].second), steps));
  }
  std::vector<std::pair<double, std::string>> top;
  for (const auto& [name, ns] : kernels) top.push_back({ns, name});
  std::sort(top.rbegin(), top.rend());
  // Forty, so the smaller kernels of the fused family show one by one, not only in its sum.
  constexpr size_t kTopKernels = 40;
  out += "profile: top kernels (ms/step, family, name):\n";
  for (size_t i = 0; i < top.size() && i < kTopKernels; ++i) {
    absl::StrAppendFormat(&out, "profile:   %7.2f  %-22s %s\n", MsPerStep(top[i].first, steps),
                          Family(top[i].second), top[i].second.substr(0, 110));
  }
  out += LaunchReport(launched, ops, steps);
  return out + IdleReport(std::move(device_intervals), host_intervals, steps);
}

}  // namespace cpptrain
