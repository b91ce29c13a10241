#include "trainer/internal/step_graph.h"

#include <cstdint>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"

namespace cpptrain {
namespace trainer_internal {
namespace {

std::string TensorSignature(const at::Tensor& t) {
  if (!t.defined()) return "-";
  return absl::StrCat(c10::toString(t.scalar_type()), c10::str(t.sizes()));
}

// A copy of `batch` on `device` in memory of its own (never the batch's own tensors, which the
// caller may keep), allocated on the current stream.
Batch DeviceCopy(const Batch& batch, const c10::Device& device, bool non_blocking) {
  auto copy = [&](const at::Tensor& t) {
    return t.defined() ? t.to(device, t.scalar_type(), non_blocking, /*copy=*/true) : t;
  };
  Batch out{copy(batch.inputs), copy(batch.labels), copy(batch.attention_mask)};
  out.position_ids = copy(batch.position_ids);
  return out;
}

void CopyInto(at::Tensor& to, const at::Tensor& from, bool non_blocking) {
  if (to.defined()) to.copy_(from, non_blocking);
}

}  // namespace

std::string StepSignature(const std::vector<Batch>& batches, const std::string& key) {
  std::string out;
  for (const Batch& b : batches) {
    absl::StrAppend(&out, TensorSignature(b.inputs), " ", TensorSignature(b.labels), " ",
                    TensorSignature(b.attention_mask), " ", TensorSignature(b.position_ids), "; ");
  }
  absl::StrAppend(&out, key);
  return out;
}

StepGraph::StepGraph(c10::Device device, int64_t warmup)
    : device_(device), warmup_(warmup), graph_(device) {}

std::array<double, StepVote::kValues> StepVote::Values() const {
  std::array<double, kValues> out{};
  out[0] = not_ready;
  for (int i = 0; i < kPieces; ++i) {
    out[1 + i] = signature[i];
    out[1 + kPieces + i] = signature_squared[i];
  }
  return out;
}

StepVote StepVote::FromValues(const double* values) {
  StepVote vote;
  vote.not_ready = values[0];
  for (int i = 0; i < kPieces; ++i) {
    vote.signature[i] = values[1 + i];
    vote.signature_squared[i] = values[1 + kPieces + i];
  }
  return vote;
}

StepGraph::Vote StepGraph::Propose(const std::vector<Batch>& batches,
                                   const std::string& vote_key, const Functions& f) {
  Vote vote;
  const uint64_t hash = std::hash<std::string>{}(StepSignature(batches, vote_key));
  for (int i = 0; i < Vote::kPieces; ++i) {
    const double piece = static_cast<double>((hash >> (16 * i)) & 0xffff);
    vote.signature[i] = piece;
    vote.signature_squared[i] = piece * piece;  // exact: sums stay below 2^53 up to 2^10 ranks
  }
  vote.not_ready = Ready(f) ? 0 : 1;
  return vote;
}

bool StepGraph::Agreed(const Vote& sum, int world) {
  // Every rank's piece is equal exactly when world * sum(h^2) == sum(h)^2 (Cauchy-Schwarz).
  if (sum.not_ready != 0) return false;
  for (int i = 0; i < Vote::kPieces; ++i) {
    if (static_cast<double>(world) * sum.signature_squared[i] !=
        sum.signature[i] * sum.signature[i]) {
      return false;
    }
  }
  return true;
}

bool StepGraph::Ready(const Functions& f) {
  if (!disabled_reason_.empty()) return false;
  if (captured_.empty()) {
    const std::string blocker = f.blocker();
    if (blocker.empty()) return true;
    if (blocker != logged_blocker_) {
      CT_LOG_RANK0(INFO) << "cuda_graphs: this step runs eagerly: " << blocker;
      logged_blocker_ = blocker;
    }
    return false;
  }
  if (const absl::Status prepared = f.prepare_replay(); !prepared.ok()) {
    Disable(std::string(prepared.message()));
    return false;
  }
  return true;
}

absl::StatusOr<StepGraph::Outputs> StepGraph::Run(const std::vector<Batch>& batches,
                                                  const std::string& key, const Functions& f,
                                                  bool non_blocking, bool agreed) {
  if (!agreed || !disabled_reason_.empty()) {
    candidate_.clear();  // every rank restarts the warm-up alike
    candidate_steps_ = 0;
    return RunEager(batches, f, non_blocking);
  }
  const std::string signature = StepSignature(batches, key);
  if (!captured_.empty()) {
    if (signature == captured_) return Replay(batches, f, non_blocking);
    return RunEager(batches, f, non_blocking);
  }
  if (signature != candidate_) {
    candidate_ = signature;
    candidate_steps_ = 0;
  }
  if (candidate_steps_ < warmup_) {
    ++candidate_steps_;
    return RunEager(batches, f, non_blocking);
  }
  return CaptureAndRun(batches, signature, f, non_blocking);
}

absl::StatusOr<StepGraph::Outputs> StepGraph::RunEager(const std::vector<Batch>& batches,
                                                       const Functions& f, bool non_blocking) {
  Outputs out;
  CT_RETURN_IF_ERROR(graph_.RunEager([&]() -> absl::Status {
    if (!prepared_ && disabled_reason_.empty()) {
      const absl::Status prepared = f.prepare_capture();
      if (!prepared.ok()) Disable(std::string(prepared.message()));
    }
    prepared_ = true;
    std::vector<Batch> on_device;
    for (const Batch& b : batches) on_device.push_back(b.To(device_, non_blocking));
    CT_ASSIGN_OR_RETURN(out, f.work(on_device));
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<StepGraph::Outputs> StepGraph::CaptureAndRun(const std::vector<Batch>& batches,
                                                            const std::string& signature,
                                                            const Functions& f,
                                                            bool non_blocking) {
  // The buffers the graph reads its micro-batches from: allocated outside it, so they are not
  // the graph's to reuse, and refilled before every replay.
  inputs_.clear();
  for (const Batch& b : batches) inputs_.push_back(DeviceCopy(b, device_, non_blocking));
  absl::Status status = graph_.RunEager(f.prepare_capture);
  if (status.ok()) status = f.prepare_replay();
  const bool attempted = status.ok();
  Outputs captured;
  if (attempted) {
    status = graph_.Capture([&]() -> absl::Status {
      CT_ASSIGN_OR_RETURN(captured, f.work(inputs_));
      return absl::OkStatus();
    });
  }
  // A graph captured here but not on another rank is never run: all go on eagerly.
  bool everywhere = status.ok();
  if (f.all_ranks) {
    CT_ASSIGN_OR_RETURN(everywhere, f.all_ranks(status.ok()));
  }
  if (!everywhere) {
    captured = Outputs{};  // graph memory: let it go before the step runs again
    if (attempted) f.discard();
    Disable(status.ok() ? "another rank could not capture the step"
                        : std::string(status.message()));
    return RunEager(batches, f, non_blocking);
  }
  outputs_ = std::move(captured);
  captured_ = signature;
  ++captures_;
  CT_LOG_RANK0(INFO) << "cuda_graphs: captured the step (" << batches.size()
                     << " micro-batches); later steps of the same shapes replay it";
  CT_RETURN_IF_ERROR(graph_.Replay());  // the captured step has not run yet
  if (f.replayed) CT_RETURN_IF_ERROR(f.replayed());
  return Outputs{outputs_.loss.clone(),
                 outputs_.grad_norm.defined() ? outputs_.grad_norm.clone() : at::Tensor()};
}

absl::StatusOr<StepGraph::Outputs> StepGraph::Replay(const std::vector<Batch>& batches,
                                                     const Functions& f, bool non_blocking) {
  // On the current stream: the last replay's reads are behind it (Replay orders the current
  // stream after the side stream) and this replay is ahead of it (and the side stream after).
  for (size_t i = 0; i < batches.size(); ++i) {
    CopyInto(inputs_[i].inputs, batches[i].inputs, non_blocking);
    CopyInto(inputs_[i].labels, batches[i].labels, non_blocking);
    CopyInto(inputs_[i].attention_mask, batches[i].attention_mask, non_blocking);
    CopyInto(inputs_[i].position_ids, batches[i].position_ids, non_blocking);
  }
  // f.prepare_replay ran in Propose, before the ranks agreed to replay.
  CT_RETURN_IF_ERROR(graph_.Replay());
  ++replays_;
  if (f.replayed) CT_RETURN_IF_ERROR(f.replayed());
  return Outputs{outputs_.loss.clone(),
                 outputs_.grad_norm.defined() ? outputs_.grad_norm.clone() : at::Tensor()};
}

void StepGraph::Disable(const std::string& reason) {
  disabled_reason_ = reason;
  CT_LOG_RANK0(WARNING) << "cuda_graphs: every later step runs eagerly: " << reason;
  graph_.Reset();
  captured_.clear();
  inputs_.clear();
  outputs_ = Outputs{};
}

}  // namespace trainer_internal
}  // namespace cpptrain
