#include "engines/zero/zero_optimizer.h"

#include <torch/optim/optimizer.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "sharding/agreed_buffer.h"

namespace cpptrain {
namespace {

// State shaped like the piece (exp_avg, ...), as opposed to scalars (step).
bool ShapedLikePiece(const at::Tensor& value, const at::Tensor& piece) {
  return value.dim() == 1 && value.numel() == piece.numel();
}

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::unique_ptr<torch::optim::Optimizer> inner,
                             std::vector<Piece> pieces, Communicator* comm, c10::Device device)
    : WrappingOptimizer(std::move(inner)),
      pieces_(std::move(pieces)),
      comm_(comm),
      device_(device) {
  for (size_t i = 0; i < pieces_.size(); ++i) {
    by_param_[pieces_[i].param.unsafeGetTensorImpl()] = i;
  }
  checkpointable_ = dynamic_cast<CheckpointableOptimizer*>(inner_.get());
  if (checkpointable_ == nullptr) {
    LOG(WARNING) << "ZeRO: the optimizer does not implement CheckpointableOptimizer, so "
                    "checkpoints will hold no optimizer state (the Trainer's AdamW does)";
  }
}

const ZeroOptimizer::Piece* ZeroOptimizer::Find(const at::Tensor& param) const {
  auto it = by_param_.find(param.unsafeGetTensorImpl());
  return it == by_param_.end() ? nullptr : &pieces_[it->second];
}

std::map<std::string, at::Tensor> ZeroOptimizer::ExportState(const at::Tensor& param) {
  std::map<std::string, at::Tensor> out;
  const Piece* p = Find(param);
  if (p == nullptr || checkpointable_ == nullptr) return out;
  torch::NoGradGuard no_grad;
  for (auto& [name, value] : checkpointable_->ExportState(p->piece)) {
    if (!ShapedLikePiece(value, p->piece)) {
      out[name] = value;
      continue;
    }
    at::Tensor full = scratch_.defined()
                          ? StagingView(scratch_, {param.numel()}, value.scalar_type()).zero_()
                          : torch::zeros({param.numel()}, value.options().device(device_));
    full.narrow(0, p->begin, value.numel()).copy_(value);
    auto work = comm_->AllReduce(full, ReduceOp::kSum);
    TORCH_CHECK(work.ok(), "ZeRO: gathering optimizer state: ", work.status().ToString());
    const absl::Status done = (*work)->Synchronize();
    TORCH_CHECK(done.ok(), "ZeRO: gathering optimizer state: ", done.ToString());
    // A copy even on the CPU: the next state reuses the scratch.
    out[name] = full.view(param.sizes()).to(at::kCPU, full.scalar_type(), false, /*copy=*/true);
  }
  return out;
}

std::vector<std::string> ZeroOptimizer::StateNames(const at::Tensor& param) {
  const Piece* p = Find(param);
  if (p == nullptr || checkpointable_ == nullptr) return {};
  return checkpointable_->StateNames(p->piece);
}

absl::Status ZeroOptimizer::ImportState(const at::Tensor& param,
                                        const std::map<std::string, at::Tensor>& state) {
  const Piece* p = Find(param);
  if (p == nullptr) {
    return absl::InvalidArgumentError("ZeRO: optimizer state for a tensor that is not trained");
  }
  std::map<std::string, at::Tensor> mine;
  for (const auto& [name, value] : state) {
    if (value.sizes() == param.sizes()) {
      mine[name] = value.reshape({-1}).narrow(0, p->begin, p->piece.numel());
    } else {
      mine[name] = value;
    }
  }
  if (checkpointable_ == nullptr) {
    return absl::UnimplementedError(
        "the ZeRO engine restores optimizer state only for optimizers that implement "
        "CheckpointableOptimizer (the Trainer's AdamW does): use it, or save_only_model");
  }
  return checkpointable_->ImportState(p->piece, mine);
}

CheckpointableOptimizer::ExportScratch ZeroOptimizer::ExportScratchNeeded() {
  if (checkpointable_ == nullptr) return {};  // ExportState gathers nothing
  ExportScratch need{/*collective=*/true, /*bytes=*/0, device_};
  for (const Piece& p : pieces_) {
    for (const auto& [name, value] : checkpointable_->ExportState(p.piece)) {
      if (ShapedLikePiece(value, p.piece)) {
        need.bytes = std::max(need.bytes, p.param.numel() * int64_t{value.element_size()});
      }
    }
  }
  return need;
}

int64_t ZeroOptimizer::StateBytes() {
  int64_t bytes = 0;
  if (checkpointable_ == nullptr) return 0;
  for (const Piece& p : pieces_) {
    for (const auto& [name, value] : checkpointable_->ExportState(p.piece)) {
      if (ShapedLikePiece(value, p.piece)) bytes += value.numel() * value.element_size();
    }
  }
  return bytes;
}

}  // namespace cpptrain
