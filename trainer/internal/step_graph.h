// The Trainer's optimizer step replayed as a CUDA graph (training argument cuda_graphs). Steps
// run eagerly on the graph's side stream until `warmup` of them in a row had the same signature
// (the micro-batches' shapes and dtypes, and whatever else the caller puts in the key, such as
// the loss normalizer); the next one with that signature is captured, then replayed, and every
// later one with it copies its micro-batches into the captured input buffers and replays. Steps
// with another signature run eagerly. When the engine says its step cannot be captured, or a
// capture fails, the reason is logged once and every later step runs eagerly (also when
// preparing a capture or a replay fails: a failure of the graph never ends the training).
//
//   StepGraph graph(device, /*warmup=*/2);
//   StepGraph::Functions f{blocker, prepare_replay, work, discard};
//   CT_ASSIGN_OR_RETURN(StepGraph::Outputs out, graph.Run(host_batches, key, f, non_blocking));
//
// A replay runs none of the step's host code: `work` (forward, backward, clipping, optimizer
// step) runs when the step is captured and for eager steps only, always with the micro-batches
// already on the device. Outputs are device tensors of the step's own (copies of the graph's).
#ifndef CPPTRAIN_TRAINER_INTERNAL_STEP_GRAPH_H_
#define CPPTRAIN_TRAINER_INTERNAL_STEP_GRAPH_H_

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

class StepGraph {
 public:
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
    // Outside the graph, before a capture and before every replay (CapturableStep's).
    std::function<absl::Status()> prepare_replay;
    // The step's device work for micro-batches already on the device.
    std::function<absl::StatusOr<Outputs>(const std::vector<Batch>&)> work;
    // After every replay, on the current stream (which follows the replay): CapturableStep's
    // StepReplayed. Optional; a failure ends the step with that error.
    std::function<absl::Status()> replayed;
    // After a capture failed: drops what the captured (never run) work left behind, so the step
    // can run eagerly from the start (the engine's ZeroGrad).
    std::function<void()> discard;
  };

  StepGraph(c10::Device device, int64_t warmup);

  // One step of `batches` (on the host, or anywhere): eager, captured and replayed, or replayed.
  absl::StatusOr<Outputs> Run(const std::vector<Batch>& batches, const std::string& key,
                              const Functions& f, bool non_blocking);

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
  void Disable(const std::string& reason);

  c10::Device device_;
  int64_t warmup_;
  SideStreamGraph graph_;
  std::string candidate_;  // the signature of the eager steps counted towards a capture
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
