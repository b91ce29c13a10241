// StepGraph's schedule (warm-up, capture, replay, eager fallbacks) on any machine, and its
// capture and replay of real device work on a CUDA device.
#include "trainer/internal/step_graph.h"

#include <array>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

namespace cpptrain {
namespace trainer_internal {
namespace {

Batch Tokens(int64_t rows, int64_t cols, int64_t start) {
  at::Tensor ids = torch::arange(start, start + rows * cols, torch::kLong).view({rows, cols});
  return Batch{ids, ids.clone(), at::Tensor()};
}

TEST(StepGraphTest, SignatureNamesShapesDtypesAndKey) {
  const std::string base = StepSignature({Tokens(2, 8, 0), Tokens(2, 8, 100)}, "n 30");
  EXPECT_EQ(base, StepSignature({Tokens(2, 8, 7), Tokens(2, 8, 9)}, "n 30")) << "values differ";
  EXPECT_NE(base, StepSignature({Tokens(2, 8, 0), Tokens(2, 9, 0)}, "n 30"));
  EXPECT_NE(base, StepSignature({Tokens(2, 8, 0)}, "n 30"));
  EXPECT_NE(base, StepSignature({Tokens(2, 8, 0), Tokens(2, 8, 0)}, "n 31"));
  Batch masked = Tokens(2, 8, 0);
  masked.attention_mask = torch::ones({2, 8}, torch::kLong);
  EXPECT_NE(base, StepSignature({masked, Tokens(2, 8, 0)}, "n 30"));
  Batch half = Tokens(2, 8, 0);
  half.inputs = half.inputs.to(torch::kInt);
  EXPECT_NE(base, StepSignature({half, Tokens(2, 8, 0)}, "n 30"));
}

// Counts what the schedule asked for. The work sums the inputs, so outputs show what it read.
struct Recorder {
  int work = 0, prepared = 0, prepared_capture = 0, discarded = 0, replayed = 0;
  std::string blocker;
  StepGraph::Functions Functions() {
    StepGraph::Functions f;
    f.blocker = [this] { return blocker; };
    f.prepare_capture = [this] {
      ++prepared_capture;
      return absl::OkStatus();
    };
    f.prepare_replay = [this] {
      ++prepared;
      return absl::OkStatus();
    };
    f.work = [this](const std::vector<Batch>& batches) -> absl::StatusOr<StepGraph::Outputs> {
      ++work;
      at::Tensor loss = torch::zeros({}, batches[0].inputs.options().dtype(torch::kDouble));
      for (const Batch& b : batches) loss += b.inputs.sum().to(torch::kDouble);
      return StepGraph::Outputs{loss, at::Tensor()};
    };
    f.discard = [this] { ++discarded; };
    f.replayed = [this] {
      ++replayed;
      return absl::OkStatus();
    };
    return f;
  }
};

double Sum(const std::vector<Batch>& batches) {
  double sum = 0;
  for (const Batch& b : batches) sum += b.inputs.sum().item<double>();
  return sum;
}

// One process's step: its own vote decides.
absl::StatusOr<StepGraph::Outputs> Step(StepGraph& graph, const std::vector<Batch>& batches,
                                        const std::string& key, const StepGraph::Functions& f) {
  const StepGraph::Vote vote = graph.Propose(batches, key, f);
  return graph.Run(batches, key, f, /*non_blocking=*/false, StepGraph::Agreed(vote, 1));
}

StepGraph::Vote Sum(const StepGraph::Vote& a, const StepGraph::Vote& b) {
  const auto x = a.Values(), y = b.Values();
  std::array<double, StepGraph::Vote::kValues> sum{};
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = x[i] + y[i];
  return StepGraph::Vote::FromValues(sum.data());
}

// On the CPU nothing can be captured: after the warm-up the capture fails, what it left is
// discarded, the step runs eagerly (once) and so does every later one.
TEST(StepGraphTest, FailedCaptureRunsTheStepEagerlyFromThenOn) {
  StepGraph graph(c10::Device(c10::kCPU), /*warmup=*/2);
  Recorder r;
  for (int step = 0; step < 5; ++step) {
    const std::vector<Batch> batches = {Tokens(2, 4, step), Tokens(2, 4, 10 * step)};
    auto out = Step(graph, batches, "key", r.Functions());
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->loss.item<double>(), Sum(batches)) << "step " << step;
    EXPECT_EQ(r.work, step + 1) << "each step's work ran once";
  }
  EXPECT_EQ(r.prepared, 1) << "prepared for the one capture attempt";
  EXPECT_EQ(r.prepared_capture, 2) << "before the first step and before the capture";
  EXPECT_EQ(r.discarded, 1);
  EXPECT_EQ(r.replayed, 0);
  EXPECT_EQ(graph.captures(), 0);
  EXPECT_EQ(graph.replays(), 0);
  EXPECT_NE(graph.disabled_reason(), "");
}

// While the engine says the step cannot be captured, steps run eagerly and nothing is tried;
// once it can, the warm-up starts again and the step after it is captured.
TEST(StepGraphTest, BlockedStepsRunEagerlyWithoutTrying) {
  StepGraph graph(c10::Device(c10::kCPU), /*warmup=*/1);
  Recorder r;
  r.blocker = "fp16 loss scaling decides on the host whether to step";
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(Step(graph, {Tokens(1, 4, step)}, "k", r.Functions()).ok());
  }
  EXPECT_EQ(r.work, 4);
  EXPECT_EQ(r.prepared, 0);
  EXPECT_EQ(graph.disabled_reason(), "") << "a blocker is not a failure";
  r.blocker.clear();
  ASSERT_TRUE(Step(graph, {Tokens(1, 4, 9)}, "k", r.Functions()).ok());
  EXPECT_EQ(r.prepared, 0) << "a blocked step restarts the warm-up";
  ASSERT_TRUE(Step(graph, {Tokens(1, 4, 10)}, "k", r.Functions()).ok());
  EXPECT_EQ(r.prepared, 1) << "tried after the warm-up (and failed: this is the CPU)";
}

// A change of shape (or key) restarts the warm-up: alternating shapes never get captured.
// A failure to prepare (the engine cannot move its step to the graph's stream) only turns the
// graph off: every step still runs, eagerly.
TEST(StepGraphTest, FailedPreparationRunsEveryStepEagerly) {
  StepGraph graph(c10::Device(c10::kCPU), /*warmup=*/1);
  Recorder r;
  StepGraph::Functions f = r.Functions();
  f.prepare_capture = [] { return absl::FailedPreconditionError("accumulators held elsewhere"); };
  for (int step = 0; step < 4; ++step) {
    ASSERT_TRUE(Step(graph, {Tokens(1, 4, step)}, "k", f).ok());
  }
  EXPECT_EQ(r.work, 4);
  EXPECT_EQ(r.prepared, 0) << "no capture was tried";
  EXPECT_EQ(graph.disabled_reason(), "accumulators held elsewhere");
}

TEST(StepGraphTest, ChangingSignaturesRestartTheWarmup) {
  StepGraph graph(c10::Device(c10::kCPU), /*warmup=*/2);
  Recorder r;
  for (int step = 0; step < 6; ++step) {
    const int64_t cols = step % 2 == 0 ? 4 : 5;
    ASSERT_TRUE(Step(graph, {Tokens(1, cols, step)}, "k", r.Functions()).ok());
  }
  EXPECT_EQ(r.prepared, 0);
  EXPECT_EQ(r.work, 6);
}

// Two ranks, each its own graph, their votes summed as the Trainer's all-reduce sums them. While
// rank 1's engine cannot capture, rank 0 does not try either (alone, it would have tried at its
// third step); once both can, both warm up again and try at the same step (both fail on the
// CPU, agree on it, and run eagerly from then on).
TEST(StepGraphTest, RanksCaptureOnlyWhenAllCan) {
  StepGraph rank0(c10::Device(c10::kCPU), /*warmup=*/2), rank1(c10::Device(c10::kCPU), 2);
  Recorder r0, r1;
  std::vector<bool> asked;  // what each rank's all_ranks was told, in order
  auto functions = [&](Recorder& r) {
    StepGraph::Functions f = r.Functions();
    f.all_ranks = [&asked](bool ok) -> absl::StatusOr<bool> {
      asked.push_back(ok);
      return ok;  // both ranks fail alike here; a collective would say the same
    };
    return f;
  };
  r1.blocker = "the optimizer has not made its state yet";
  for (int step = 0; step < 8; ++step) {
    if (step == 4) r1.blocker.clear();
    const std::vector<Batch> batches = {Tokens(2, 4, step)};
    const StepGraph::Functions f0 = functions(r0), f1 = functions(r1);
    const bool agreed = StepGraph::Agreed(
        Sum(rank0.Propose(batches, "k", f0), rank1.Propose(batches, "k", f1)), 2);
    ASSERT_TRUE(rank0.Run(batches, "k", f0, false, agreed).ok());
    ASSERT_TRUE(rank1.Run(batches, "k", f1, false, agreed).ok());
    EXPECT_EQ(r0.prepared, r1.prepared) << "step " << step << ": one rank tried alone";
    EXPECT_EQ(rank0.disabled_reason().empty(), rank1.disabled_reason().empty()) << step;
    if (step < 6) EXPECT_EQ(r0.prepared, 0) << "step " << step;
  }
  EXPECT_EQ(r0.prepared, 1) << "both tried at step 6, after steps 4 and 5 warmed up";
  EXPECT_EQ(asked, (std::vector<bool>{false, false}));
  EXPECT_EQ(r0.work, 8);
  EXPECT_EQ(r1.work, 8);
}

// A step whose shapes differ between the ranks (a shorter last batch on one, say) never counts
// towards a capture: the ranks' signatures disagree, so both run it eagerly.
TEST(StepGraphTest, RanksWithOtherShapesRunEagerly) {
  StepGraph rank0(c10::Device(c10::kCPU), /*warmup=*/1), rank1(c10::Device(c10::kCPU), 1);
  Recorder r0, r1;
  for (int step = 0; step < 5; ++step) {
    const std::vector<Batch> mine = {Tokens(2, 4, step)};
    const std::vector<Batch> theirs = {Tokens(2, step % 2 == 0 ? 4 : 3, step)};
    const StepGraph::Functions f0 = r0.Functions(), f1 = r1.Functions();
    const StepGraph::Vote sum = Sum(rank0.Propose(mine, "k", f0), rank1.Propose(theirs, "k", f1));
    EXPECT_EQ(StepGraph::Agreed(sum, 2), step % 2 == 0) << "step " << step;
    ASSERT_TRUE(rank0.Run(mine, "k", f0, false, StepGraph::Agreed(sum, 2)).ok());
    ASSERT_TRUE(rank1.Run(theirs, "k", f1, false, StepGraph::Agreed(sum, 2)).ok());
  }
  EXPECT_EQ(r0.prepared, 0) << "no two agreed steps in a row: nothing tried";
  EXPECT_EQ(r1.prepared, 0);
}

// Votes built by hand: each of the hash's three pieces must agree, so two ranks whose hashes
// share the low 16 bits (all that the vote once compared) still disagree.
TEST(StepGraphTest, EveryPieceOfTheSignatureMustAgree) {
  auto vote = [](double not_ready, std::array<double, StepGraph::Vote::kPieces> pieces) {
    StepGraph::Vote v;
    v.not_ready = not_ready;
    for (int i = 0; i < StepGraph::Vote::kPieces; ++i) {
      v.signature[i] = pieces[i];
      v.signature_squared[i] = pieces[i] * pieces[i];
    }
    return v;
  };
  EXPECT_TRUE(StepGraph::Agreed(Sum(vote(0, {3, 7, 9}), vote(0, {3, 7, 9})), 2));
  EXPECT_FALSE(StepGraph::Agreed(Sum(vote(0, {3, 7, 9}), vote(0, {3, 8, 9})), 2));
  EXPECT_FALSE(StepGraph::Agreed(Sum(vote(0, {3, 7, 9}), vote(0, {3, 7, 65535})), 2));
  EXPECT_FALSE(StepGraph::Agreed(Sum(vote(0, {1, 7, 9}), vote(0, {2, 7, 9})), 2));
  EXPECT_FALSE(StepGraph::Agreed(Sum(vote(1, {3, 7, 9}), vote(0, {3, 7, 9})), 2))
      << "a rank not ready";
  // Values() and FromValues() carry a vote through the Trainer's all-reduce unchanged.
  const StepGraph::Vote v = vote(1, {4, 5, 6});
  const StepGraph::Vote back = StepGraph::Vote::FromValues(v.Values().data());
  EXPECT_EQ(back.Values(), v.Values());
}

// On a GPU: the third step of one shape is captured, later ones replay it with their own
// micro-batches (copied into the graph's buffers), and a step of another shape runs eagerly.
TEST(StepGraphTest, CapturesThenReplaysWithNewInputsOnCuda) {
  if (!torch::cuda::is_available() || !SideStreamGraph::Supported()) {
    GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
  }
  StepGraph graph(c10::Device(c10::kCUDA, 0), /*warmup=*/2);
  Recorder r;
  for (int step = 0; step < 8; ++step) {
    const int64_t cols = step == 6 ? 5 : 4;  // step 6 has another shape
    const std::vector<Batch> batches = {Tokens(2, cols, 3 * step), Tokens(2, cols, 7 * step)};
    auto out = Step(graph, batches, "key", r.Functions());
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_TRUE(out->loss.is_cuda());
    EXPECT_EQ(out->loss.item<double>(), Sum(batches)) << "step " << step;
  }
  EXPECT_EQ(graph.disabled_reason(), "");
  EXPECT_EQ(graph.captures(), 1);
  EXPECT_EQ(graph.replays(), 4) << "steps 3, 4, 5 and 7";
  EXPECT_EQ(r.work, 4) << "2 warm-up steps, the capture, the other shape";
  EXPECT_EQ(r.prepared, 6) << "before the capture, then in each later Propose (step 6's too)";
  EXPECT_EQ(r.replayed, 5) << "after each replay, the one that ran the captured step included";
  EXPECT_EQ(r.prepared_capture, 2);
}

// A capture that succeeded on this rank but failed on another (all_ranks says false): the graph
// is never run, what the capture left is discarded, the step runs eagerly with the right
// result, and so does every later one.
TEST(StepGraphTest, CaptureGivenUpWhenAnotherRankFailedOnCuda) {
  if (!torch::cuda::is_available() || !SideStreamGraph::Supported()) {
    GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
  }
  StepGraph graph(c10::Device(c10::kCUDA, 0), /*warmup=*/1);
  Recorder r;
  StepGraph::Functions f = r.Functions();
  std::vector<bool> asked;
  f.all_ranks = [&asked](bool ok) -> absl::StatusOr<bool> {
    asked.push_back(ok);
    return false;
  };
  for (int step = 0; step < 4; ++step) {
    const std::vector<Batch> batches = {Tokens(2, 4, 5 * step)};
    auto out = Step(graph, batches, "key", f);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->loss.item<double>(), Sum(batches)) << "step " << step;
  }
  EXPECT_EQ(asked, std::vector<bool>{true}) << "captured here, once";
  EXPECT_EQ(graph.captures(), 0);
  EXPECT_EQ(graph.replays(), 0);
  EXPECT_EQ(r.discarded, 1);
  EXPECT_EQ(graph.disabled_reason(), "another rank could not capture the step");
  EXPECT_EQ(r.work, 5) << "the captured (never run) work, then every step eagerly";
}

// A step that reads a device value on the host cannot be captured: it runs eagerly, with the
// right result, and so does every later step.
TEST(StepGraphTest, HostSyncInTheStepFallsBackOnCuda) {
  if (!torch::cuda::is_available() || !SideStreamGraph::Supported()) {
    GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
  }
  StepGraph graph(c10::Device(c10::kCUDA, 0), /*warmup=*/1);
  Recorder r;
  StepGraph::Functions f = r.Functions();
  auto work = f.work;
  f.work = [&](const std::vector<Batch>& batches) -> absl::StatusOr<StepGraph::Outputs> {
    if (batches[0].inputs.sum().item<int64_t>() < 0) return absl::InternalError("unreachable");
    return work(batches);
  };
  for (int step = 0; step < 4; ++step) {
    const std::vector<Batch> batches = {Tokens(2, 4, step)};
    auto out = Step(graph, batches, "key", f);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(out->loss.item<double>(), Sum(batches)) << "step " << step;
  }
  EXPECT_EQ(graph.captures(), 0);
  EXPECT_EQ(r.discarded, 1);
  EXPECT_NE(graph.disabled_reason(), "");
  EXPECT_EQ(r.work, 4) << "the failed capture's work never ran: the step ran once, eagerly";
}

}  // namespace
}  // namespace trainer_internal
}  // namespace cpptrain
