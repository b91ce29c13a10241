// bf16 working copies of fp32 master parameters, for the engines that keep the whole model on
// every rank (local, DDP) under bf16: the forward reads bf16 weights that were rounded once per
// optimizer step, instead of autocast casting every fp32 weight at every use (in the forward,
// again in a recomputed forward, and the cast's gradient back to fp32). The optimizer steps fp32
// masters; its state is unchanged. Both live in flat buffers in one order, so refreshing the
// working copies after a step is one rounding pass. Gradients reach the masters in fp32: a hook
// on each parameter's gradient accumulator moves the bf16 .grad into its master's fp32 .grad
// (widens it the first time since BeginAccumulation, then adds) and drops the bf16 one, so
// accumulation over micro-batches is in fp32 as before. The master's .grad is undefined until a
// gradient arrives, as a parameter's is, and is its own allocation (freed when the optimizer
// clears it, so the activations' peak does not meet a full gradient), or, with
// `flat_gradients`, a view of one persistent fp32 buffer in the flat order (DDP's buckets).
// With KeepBf16Gradients (for an optimizer that ReadsBf16Gradients, engines/gradient_scaling.h)
// a master's first gradient since BeginAccumulation is the bf16 gradient itself, not widened, and
// a second one widens it then adds: one micro-batch a step costs no widening pass. An optimizer
// that writes the bf16 copies in its own pass (WriteBf16CopiesInNextStep with WorkingCopyOf)
// replaces Refresh by MarkRefreshed.
// DeepSpeed's bf16 and ZeRO stages 1/2 here keep the same layout (engines/zero/zero_engine.h).
//
//   CT_ASSIGN_OR_RETURN(auto working, WorkingParameters::Create(UniqueTrainableParameters(m)));
//   working->InstallHooks(nullptr);              // or a callback after each gradient moved
//   optimizer = factory(working->masters());     // same names and shapes, fp32
//   ... backward ...; optimizer->step(); working->Refresh();   // or MarkRefreshed (above)
//   ClearGradients(*optimizer); working->BeginAccumulation();
// When it is destroyed the model's parameters become the fp32 masters again.
#ifndef CPPTRAIN_ENGINES_WORKING_PARAMETERS_H_
#define CPPTRAIN_ENGINES_WORKING_PARAMETERS_H_

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engines/hook_owner.h"

namespace torch::autograd {
struct Node;
}

namespace cpptrain {

class WorkingParameters {
 public:
  using Named = std::vector<std::pair<std::string, at::Tensor>>;

  // `params`: the trainable parameters, each tensor once, all fp32 on one device. `order`: the
  // indices of `params` in the order the flat buffers hold them (each once); empty means as
  // given. The parameters become bf16 views of the working buffer (their values rounded);
  // the masters keep the fp32 values. Errors: a parameter that is not fp32, a bad order.
  static absl::StatusOr<std::unique_ptr<WorkingParameters>> Create(Named params,
                                                                   std::vector<int> order = {},
                                                                   bool flat_gradients = false);
  ~WorkingParameters();

  // The fp32 masters, under the parameters' names, in the order given to Create.
  const Named& masters() const { return masters_; }
  // The model's parameters (the working copies), in the same order.
  const std::vector<at::Tensor>& parameters() const { return params_; }
  // With flat_gradients, [total numel] fp32: every master's gradient is a view of it, in the
  // flat order; else undefined.
  at::Tensor& gradients() { return gradients_; }
  // Where parameter i (Create's index) starts in the flat buffers.
  int64_t offset(int i) const { return offsets_[i]; }

  // See the top. Without flat_gradients only.
  void KeepBf16Gradients(bool on) { keep_bf16_ = on && !gradients_.defined(); }
  // The working copy of a master (one of masters()) as a flat bf16 view; undefined for any other
  // tensor. Where an optimizer writes a master's rounded value (WriteBf16CopiesInNextStep).
  at::Tensor WorkingCopyOf(const at::Tensor& master) const;

  // Installs the hooks on the parameters' current gradient accumulators; `after_move(i)`, if
  // set, runs after parameter i's gradient moved (on the thread autograd calls it from).
  void InstallHooks(std::function<void(int)> after_move);
  // Makes the gradient accumulators again, with the hooks, while the current stream is the one
  // the backward should run them on (autograd runs an accumulator on the stream that was current
  // when it was made; a CUDA graph is captured on a side stream). False, changing nothing, when
  // an accumulator is held elsewhere too (a graph of a backward that has not run).
  bool RemakeAccumulators();
  // Starts an accumulation: the next gradient of each parameter overwrites its master's (the
  // caller clears the masters' .grad, as the optimizer's zero_grad does); drops any bf16 .grad
  // a failed backward left on a parameter.
  void BeginAccumulation();
  // Gives every master no gradient reached since BeginAccumulation a zero one (DDP sums every
  // bucket, used or not).
  void ZeroUnmoved();
  // Before a step: the masters of working copies someone wrote since the last Refresh (their
  // version counters say so; Refresh writes the flat buffer, which bumps none of them) take
  // those values; the others keep theirs.
  void AdoptWrittenWorkingCopies();
  // After the optimizer stepped the masters: the working copies become their bf16 rounding.
  void Refresh();
  // After an optimizer step that wrote every working copy itself (WorkingCopyOf).
  void MarkRefreshed();
  // Between the two, the parameters are the masters themselves (fp32), for checkpoints; what is
  // written into them is kept, and Restore rounds it into the working copies and reinstalls the
  // hooks (a dtype change gives a parameter a new gradient accumulator).
  void Expose();
  void Restore();
  bool exposed() const { return exposed_; }

  // For the hook.
  void MoveGradient(int i);

 private:
  WorkingParameters() = default;
  void PointParametersAt(const at::Tensor& flat);
  at::Tensor GradientView(int i);
  void RecordVersions();

  Named masters_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> offsets_;
  at::Tensor working_;       // bf16 [total]: the parameters' storage
  at::Tensor master_;        // fp32 [total]: the masters' storage
  at::Tensor gradients_;     // fp32 [total]
  std::vector<char> fresh_;  // per parameter: no gradient moved since BeginAccumulation
  std::function<void(int)> after_move_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<int64_t> versions_;  // per parameter, at the last Refresh
  bool exposed_ = false;
  bool keep_bf16_ = false;
  std::unordered_map<const c10::TensorImpl*, int> index_of_master_;
  HookOwner<WorkingParameters> hooks_{this};  // last: cleared first
};

// The flat buffers' order as units, each to be laid out consecutively: parameter i of `names`
// alone, or a set of `adjacent` (TrainableModel::AdjacentParameterGroups) in its own order, met
// where the walk first reaches one of its members. The walk goes from the first name, or from
// the last (`reversed`: DDP's buckets, roughly the order backward produces gradients). Every
// index appears once; names not in `names`, and a set left with fewer than two, change nothing.
std::vector<std::vector<int>> FlatOrderUnits(const std::vector<std::string>& names,
                                             const std::vector<std::vector<std::string>>& adjacent,
                                             bool reversed);

}  // namespace cpptrain

#endif  // CPPTRAIN_ENGINES_WORKING_PARAMETERS_H_
