// The Trainer's optimizer step replayed as a CUDA graph (training argument cuda_graphs). Steps
// run eagerly on the graph's side stream until `warmup` of them in a row had the same signature
// (the micro-batches' shapes and dtypes, and whatever else the caller puts in the key, such as
// the loss normalizer); the next one with that signature is captured, then replayed, and every
// later one with it copies its micro-batches into the captured input buffers and replays. Steps
// with another signature run eagerly. When the engine says its step cannot be captured, or a
// capture fails, the reason is logged once and every later step runs eagerly (also when
// preparing a capture or a replay fails: a failure of the graph never ends the training).
//
// Every rank decides alike: a replayed step issues its collectives from the graph and an eager
// one from the host, and NCCL needs the same ones on every rank. Before each step every rank
// proposes (ready or not, and a hash of its step's signature); the caller sums the votes over
// the ranks in an all-reduce it makes anyway (the Trainer's per-step token count) and passes
// Agreed(sum) to Run. A step any rank cannot capture or replay, or whose signature differs
// between ranks, runs eagerly everywhere and restarts the warm-up; a capture that fails on one
// rank is given up on all (Functions::all_ranks, one collective at the capture).
//
//   StepGraph graph(device, /*warmup=*/2);
//   StepGraph::Functions f{blocker, prepare_capture, prepare_replay, work, replayed, discard};
//   StepGraph::Vote sum = ... every rank's graph.Propose(host_batches, vote_key, f), summed ...;
//   CT_ASSIGN_OR_RETURN(StepGraph::Outputs out,
//                       graph.Run(host_batches, key, f, non_blocking, StepGraph::Agreed(sum, n)));
//
// A replay runs none of the step's host code: `work` (forward, backward, clipping, optimizer
// step) runs when the step is captured and for eager steps only, always with the micro-batches
// already on the device. Outputs are device tensors of the step's own (copies of the graph's).
#ifndef CPPTRAIN_TRAINER_INTERNAL_STEP_GRAPH_H_
#define CPPTRAIN_TRAINER_INTERNAL_STEP_GRAPH_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "absl/status/statusor.h"
#include "base/cuda_graph.h"
#include "module/batch.h"

namespace cpptrain {
namespace trainer_internal {

// A rank's say in the next step, as numbers to sum over the ranks (StepGraph::Propose). The
// signature's 64-bit hash goes in as three 16-bit pieces, each with its square: sums of 16-bit
// values and their squares stay exact in a double up to 2^10 ranks, and ranks whose signatures
// differ pass as equal only if 48 bits of their hashes collide (one piece alone: 16 bits, a
// 1 in 65,536 chance that one rank replays while another runs eagerly).
struct StepVote {
  static constexpr int kPieces = 3;
  static constexpr int kValues = 1 + 2 * kPieces;

  double not_ready = 0;  // 1 when this rank cannot capture or replay the step
  std::array<double, kPieces> signature{};          // the hash's pieces
  std::array<double, kPieces> signature_squared{};  // and their squares

  // not_ready, the pieces, then their squares: the numbers to sum over the ranks.
  std::array<double, kValues> Values() const;
  // The vote whose Values() are values[0, kValues).
  static StepVote FromValues(const double* values);
};

class StepGraph {
 public:
  using Vote = StepVote;

  struct Outputs {
    at::Tensor loss;       // this rank's share of the step's loss, a device scalar
    at::Tensor grad_norm;  // undefined when the step does not clip
  };
  struct Functions {
    // Why the step cannot be captured now ("" when it can); asked before a capture.
    std::function<std::string()> blocker;
    // With the side stream current, before the first step and before a capture
    // (CapturableStep's PrepareForCapture).
    std::function<absl::Status()> prepare_capture;
    // Outside the graph, before a capture and, once a step is captured, in every Propose
    // (CapturableStep's PrepareStepReplay): before the ranks decide, so its failure is known.
    std::function<absl::Status()> prepare_replay;
    // The step's device work for micro-batches already on the device.
    std::function<absl::StatusOr<Outputs>(const std::vector<Batch>&)> work;
    // After every replay, on the current stream (which follows the replay): CapturableStep's
    // StepReplayed. Optional; a failure ends the step with that error.
    std::function<absl::Status()> replayed;
    // After a capture failed: drops what the captured (never run) work left behind, so the step
    // can run eagerly from the start (the engine's ZeroGrad).
    std::function<void()> discard;
    // After a capture attempt, collective: whether it succeeded on every rank, given whether
    // it did on this one. Unset for one process.
    std::function<absl::StatusOr<bool>(bool)> all_ranks;
  };

  StepGraph(c10::Device device, int64_t warmup);

  // Before each Run: this rank's vote for `batches` under `vote_key` (Run's key without what
  // only the all-reduce tells, such as a global normalizer). Not ready when the graph is off, or,
  // before a capture, when f.blocker names a reason (logged when it changes), or, once a step is
  // captured, when f.prepare_replay fails (which turns the graph off).
  Vote Propose(const std::vector<Batch>& batches, const std::string& vote_key,
               const Functions& f);
  // Whether `world` ranks' summed votes agree: every rank ready, one signature.
  static bool Agreed(const Vote& sum, int world);

  // One step of `batches` (on the host, or anywhere): eager, captured and replayed, or replayed;
  // eager when not `agreed` (every rank's Propose summed: Agreed), which restarts the warm-up.
  absl::StatusOr<Outputs> Run(const std::vector<Batch>& batches, const std::string& key,
                              const Functions& f, bool non_blocking, bool agreed);

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  // Why steps stopped being captured ("" while they may be).
  const std::string& disabled_reason() const { return disabled_reason_; }

 private:
  absl::StatusOr<Outputs> RunEager(const std::vector<Batch>& batches, const Functions& f,
                                   bool non_blocking);
  // Captures the step into a new graph and runs it once; on a failed capture, disables
  // capturing and runs the step eagerly instead.
  absl::StatusOr<Outputs> CaptureAndRun(const std::vector<Batch>& batches,
                                        const std::string& signature, const Functions& f,
                                        bool non_blocking);
  absl::StatusOr<Outputs> Replay(const std::vector<Batch>& batches, const Functions& f,
                                 bool non_blocking);
  // Propose's readiness (see there).
  bool Ready(const Functions& f);
  void Disable(const std::string& reason);

  c10::Device device_;
  int64_t warmup_;
  SideStreamGraph graph_;
  std::string candidate_;  // the signature of the agreed eager steps counted towards a capture
  int64_t candidate_steps_ = 0;
  std::string captured_;  // the signature of the captured step; "" before a capture
  std::vector<Batch> inputs_;  // the captured step's micro-batches (device buffers it reads)
  Outputs outputs_;            // the captured step's outputs (device buffers it writes)
  std::string disabled_reason_;
  std::string logged_blocker_;  // the last reason not to capture that was logged
  bool prepared_ = false;       // prepare_capture ran before the first step
  int64_t captures_ = 0;
  int64_t replays_ = 0;
};

// The shapes and dtypes of every tensor of `batches`, then `key`: steps with equal signatures
// can share one captured graph.
std::string StepSignature(const std::vector<Batch>& batches, const std::string& key);

}  // namespace trainer_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_INTERNAL_STEP_GRAPH_H_
