// The optimizer ZeRO stages 1 and 2 hand to the Trainer and the checkpointer. The real
// optimizer (built by the Trainer's factory) steps 1-d pieces: each rank's owned range of
// each parameter (engines/zero/zero_layout.h). This wrapper keeps the Trainer's view: its
// parameter groups mirror the inner optimizer's (engines/wrapping_optimizer.h), and as a
// CheckpointableOptimizer it exports and imports state per *model* parameter at the
// parameter's full shape, so a ZeRO checkpoint is the one a local or DDP run writes (rank 0
// writes it whole) and any engine at any world size reads it.
//
// Export is collective over `comm`: each rank's piece goes into a zeroed full tensor and one
// all-reduce sums them (import is not). Every rank must call them for the same parameters in
// the same order (the checkpointer does: it walks the model's parameters on every rank). The
// inner optimizer's own state must be reachable as a CheckpointableOptimizer (the Trainer's
// AdamW is); for others the checkpoint holds no optimizer state (a warning says so).
//
//   auto wrapped = std::make_unique<ZeroOptimizer>(std::move(inner), pieces, comm);
//   SetLearningRate(*wrapped, lr);   // reaches the inner optimizer at the next step()
//   wrapped->step();
#ifndef CPPTRAIN_ENGINES_ZERO_ZERO_OPTIMIZER_H_
#define CPPTRAIN_ENGINES_ZERO_ZERO_OPTIMIZER_H_

#include <torch/optim/optimizer.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engines/wrapping_optimizer.h"
#include "module/checkpointable_optimizer.h"
#include "sharding/communicator.h"

namespace cpptrain {

class ZeroOptimizer : public WrappingOptimizer, public CheckpointableOptimizer {
 public:
  struct Piece {
    at::Tensor param;   // the model's (replicated) parameter
    at::Tensor piece;   // the 1-d tensor the inner optimizer steps
    int64_t begin = 0;  // its first element in the flattened parameter
  };

  // `comm` (not owned) serves tensors on `device`; it must outlive this.
  ZeroOptimizer(std::unique_ptr<torch::optim::Optimizer> inner, std::vector<Piece> pieces,
                Communicator* comm, c10::Device device);

  // Full-shaped state of a model parameter (collective); empty before the first step.
  std::map<std::string, at::Tensor> ExportState(const at::Tensor& param) override;
  // ExportState's names, from this rank's piece (not collective).
  std::vector<std::string> StateNames(const at::Tensor& param) override;
  // Not itself collective: `collective` is true on every rank (false on every rank when the
  // inner optimizer keeps no checkpointable state), `bytes` those of the largest full-shaped
  // state tensor, on the engine's device. ExportState gathers through views of the lent
  // scratch (a save lends it, agreed on every rank) and allocates its own tensor only when
  // none is lent.
  ExportScratch ExportScratchNeeded() override;
  void UseExportScratch(const at::Tensor& scratch) override { scratch_ = scratch; }
  // Takes this rank's range of full-shaped state (not collective).
  absl::Status ImportState(const at::Tensor& param,
                           const std::map<std::string, at::Tensor>& state) override;

  // Bytes of the inner optimizer's state shaped like its pieces (exp_avg, exp_avg_sq; not the
  // step counters) on this rank, for memory reports.
  int64_t StateBytes();

 private:
  const Piece* Find(const at::Tensor& param) const;

  std::vector<Piece> pieces_;
  std::unordered_map<const c10::TensorImpl*, size_t> by_param_;
  CheckpointableOptimizer* checkpointable_ = nullptr;  // inner_, when it is one
  Communicator* comm_;
  c10::Device device_;
  at::Tensor scratch_;  // lent by UseExportScratch; undefined when none is
};

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_ZERO_ZERO_OPTIMIZER_H_
