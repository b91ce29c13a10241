// Peak device memory by phase of a training run, from an allocator's peak counter (on CUDA,
// base/torch_compat.h's PeakAllocatedBytes and ResetPeakMemory): Begin ends the phase running
// (its peak: the counter's since the last Begin) and resets the counter for the next one, so
// the largest of the phases is the run's peak, as one reading of the counter at the end would
// give it.
//
//   PhasePeaks peaks([&] { return PeakAllocatedBytes(device); },
//                    [&] { ResetPeakMemory(device); });   // "setup" runs from here
//   peaks.Begin("forward"); ... peaks.Begin("backward"); ... peaks.Begin("step"); ...
//   peaks.Finish();   // ends the last phase
//   peaks.by_phase()  // {"backward": ..., "forward": ..., "setup": ..., "step": ...}
//
// A phase begun several times keeps its largest peak. A reader that returns -1 (no CUDA) leaves
// every peak -1.
#ifndef CPPTRAIN_TOOLS_PHASE_PEAKS_H_
#define CPPTRAIN_TOOLS_PHASE_PEAKS_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>

namespace cpptrain {

class PhasePeaks {
 public:
  PhasePeaks(std::function<int64_t()> read_peak, std::function<void()> reset_peak)
      : read_peak_(std::move(read_peak)), reset_peak_(std::move(reset_peak)) {}

  void Begin(const std::string& phase) {
    Finish();
    current_ = phase;
  }
  void Finish() {
    const int64_t peak = read_peak_();
    auto [it, added] = by_phase_.emplace(current_, peak);
    if (!added) it->second = std::max(it->second, peak);
    reset_peak_();
  }

  const std::map<std::string, int64_t>& by_phase() const { return by_phase_; }
  // The largest phase's peak: the run's.
  int64_t overall() const {
    int64_t most = -1;
    for (const auto& [phase, peak] : by_phase_) most = std::max(most, peak);
    return most;
  }

 private:
  std::function<int64_t()> read_peak_;
  std::function<void()> reset_peak_;
  std::string current_ = "setup";
  std::map<std::string, int64_t> by_phase_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_PHASE_PEAKS_H_
