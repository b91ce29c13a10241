// PhasePeaks over a counter that behaves as the CUDA caching allocator's: allocations raise the
// current bytes and the peak, frees lower the current bytes only, a reset sets the peak to the
// current bytes. (The real counter needs a GPU; tools/bench reads it there.)
#include "tools/phase_peaks.h"

#include <gtest/gtest.h>

#include <cstdint>

namespace cpptrain {
namespace {

struct Counter {
  int64_t current = 0, peak = 0;
  void Allocate(int64_t bytes) {
    current += bytes;
    peak = std::max(peak, current);
  }
  void Free(int64_t bytes) { current -= bytes; }
};

TEST(PhasePeaksTest, EachPhaseGetsItsOwnPeakAndTheLargestIsTheRuns) {
  Counter c;
  PhasePeaks peaks([&] { return c.peak; }, [&] { c.peak = c.current; });
  c.Allocate(100);  // the model: setup
  for (int step = 0; step < 2; ++step) {
    peaks.Begin("forward");
    c.Allocate(51 - step);  // activations, a little less in the second step
    c.Allocate(30);         // a transient
    c.Free(30);
    peaks.Begin("backward");
    c.Allocate(20);  // gradients
    c.Free(51 - step);
    peaks.Begin("step");
    c.Allocate(5);
    c.Free(5);
    c.Free(20);
  }
  peaks.Finish();
  const std::map<std::string, int64_t> want = {
      {"setup", 100}, {"forward", 181}, {"backward", 171}, {"step", 125}};
  EXPECT_EQ(peaks.by_phase(), want);
  EXPECT_EQ(peaks.overall(), 181);
  EXPECT_EQ(peaks.overall(), c.current + 81) << "the whole run's peak, as one reading gives it";
}

TEST(PhasePeaksTest, WithoutACounterEveryPeakIsUnknown) {
  PhasePeaks peaks([] { return int64_t{-1}; }, [] {});
  peaks.Begin("forward");
  peaks.Finish();
  EXPECT_EQ(peaks.by_phase().at("setup"), -1);
  EXPECT_EQ(peaks.by_phase().at("forward"), -1);
  EXPECT_EQ(peaks.overall(), -1);
}

}  // namespace
}  // namespace cpptrain
