#include "trainer/internal/divergence_watch.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"

namespace cpptrain {
namespace trainer_internal {

namespace {

// 0 where `x` is finite, else 1 (NaN), 2 (+inf) or 3 (-inf); float64 on x's device.
torch::Tensor Kind(const torch::Tensor& x) {
  const torch::Tensor v = x.detach().reshape({}).to(torch::kFloat64);
  const torch::Tensor inf_kind = torch::where(v > 0, torch::full_like(v, 2), torch::full_like(v, 3));
  const torch::Tensor kind = torch::where(torch::isnan(v), torch::ones_like(v), inf_kind);
  return torch::where(torch::isfinite(v), torch::zeros_like(v), kind);
}

const char* KindName(double kind) {
  if (kind == 1) return "nan";
  return kind == 2 ? "inf" : "-inf";
}

}  // namespace

void DivergenceWatch::Record(int64_t step, const torch::Tensor& loss,
                             const torch::Tensor& grad_norm) {
  const torch::Device device = loss.device();
  if (!first_bad_.defined()) {
    first_bad_ = torch::zeros({4}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  }
  const torch::Tensor zero = torch::zeros({}, first_bad_.options());
  const torch::Tensor kinds = torch::stack(
      {Kind(loss), grad_norm.defined() ? Kind(grad_norm.to(device)) : zero});
  const torch::Tensor first = first_bad_.view({2, 2});
  // Keep the first bad step of each value: only a slot still at step 0 takes this step.
  const torch::Tensor take = (first.select(1, 0) == 0) & (kinds != 0);
  const torch::Tensor steps = torch::full({2}, static_cast<double>(step), first_bad_.options());
  first.select(1, 0).copy_(torch::where(take, steps, first.select(1, 0)));
  first.select(1, 1).copy_(torch::where(take, kinds, first.select(1, 1)));
}

void DivergenceWatch::RecordParameters(
    int64_t step, const std::vector<std::pair<std::string, torch::Tensor>>& params) {
  if (weights_step_ > 0 || params.empty()) return;
  // One flag a parameter, gathered on the first one's device (a parameter offloaded to the
  // host, or one a sharding engine left empty or undefined, counts as finite or moves there).
  const torch::Device device = params.front().second.defined() ? params.front().second.device()
                                                               : torch::Device(torch::kCPU);
  std::vector<torch::Tensor> finite;
  finite.reserve(params.size());
  for (const auto& [name, p] : params) {
    finite.push_back(!p.defined() || p.numel() == 0
                         ? torch::ones({}, torch::TensorOptions().dtype(torch::kBool).device(device))
                         : torch::isfinite(p.detach()).all().to(device));
  }
  const torch::Tensor ok = torch::stack(finite).cpu();
  const bool* flags = ok.data_ptr<bool>();
  for (size_t i = 0; i < params.size(); ++i) {
    if (flags[i]) continue;
    weights_step_ = step;
    weights_index_ = static_cast<int64_t>(i);
    break;
  }
  names_.clear();
  for (const auto& entry : params) names_.push_back(entry.first);
}

absl::Status DivergenceWatch::Check(HostGroup& group) const {
  const int world = group.world_size();
  constexpr int kWidth = 6;
  torch::Tensor all = torch::zeros({world, kWidth}, torch::kFloat64);
  if (first_bad_.defined()) all[group.rank()].narrow(0, 0, 4).copy_(first_bad_.cpu());
  all[group.rank()][4] = static_cast<double>(weights_step_);
  all[group.rank()][5] = static_cast<double>(weights_index_);
  CT_ASSIGN_OR_RETURN(all, group.AllReduceSum(all.reshape({-1})));
  all = all.reshape({world, kWidth}).contiguous();
  const double* r = all.data_ptr<double>();
  // The earliest bad loss over the ranks and the ranks that saw it then; the norm is global,
  // so every rank recorded the same.
  int64_t loss_step = 0;
  double loss_kind = 0;
  std::vector<int> loss_ranks;
  int64_t norm_step = 0;
  double norm_kind = 0;
  int64_t weights_step = 0;
  int64_t weights_index = 0;
  std::vector<int> weights_ranks;
  for (int rank = 0; rank < world; ++rank) {
    const double* row = r + kWidth * rank;
    const int64_t wstep = static_cast<int64_t>(row[4]);
    if (wstep > 0 && (weights_step == 0 || wstep < weights_step)) {
      weights_step = wstep;
      weights_index = static_cast<int64_t>(row[5]);
      weights_ranks.clear();
    }
    if (wstep > 0 && wstep == weights_step) weights_ranks.push_back(rank);
    const int64_t step = static_cast<int64_t>(row[0]);
    if (step > 0 && (loss_step == 0 || step < loss_step)) {
      loss_step = step;
      loss_kind = row[1];
      loss_ranks.clear();
    }
    if (step > 0 && step == loss_step) loss_ranks.push_back(rank);
    const int64_t nstep = static_cast<int64_t>(row[2]);
    if (nstep > 0 && (norm_step == 0 || nstep < norm_step)) {
      norm_step = nstep;
      norm_kind = row[3];
    }
  }
  if (loss_step == 0 && norm_step == 0 && weights_step == 0) return absl::OkStatus();
  std::vector<std::string> seen;
  if (loss_step > 0) {
    seen.push_back(absl::StrCat("the loss was ", KindName(loss_kind), " at step ", loss_step,
                                world > 1 ? absl::StrCat(" on rank(s) ",
                                                         absl::StrJoin(loss_ranks, ", "))
                                          : ""));
  }
  if (norm_step > 0) {
    seen.push_back(absl::StrCat("the gradient norm was ", KindName(norm_kind), " at step ",
                                norm_step));
  }
  if (weights_step > 0) {
    // Every rank holds the same parameter names in the same order.
    const std::string name = weights_index < static_cast<int64_t>(names_.size())
                                 ? names_[weights_index]
                                 : absl::StrCat("#", weights_index);
    seen.push_back(absl::StrCat(
        "parameter ", name, " held NaN or infinite values after step ", weights_step,
        world > 1 ? absl::StrCat(" on rank(s) ", absl::StrJoin(weights_ranks, ", ")) : ""));
  }
  int64_t first = 0;
  for (const int64_t step : {loss_step, norm_step, weights_step}) {
    if (step > 0 && (first == 0 || step < first)) first = step;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "training diverged: ", absl::StrJoin(seen, "; "), ". The optimizer applied those steps, "
      "so the weights are no longer finite; stopping without saving a checkpoint from step ",
      first, " on. Lower learning_rate, lengthen warmup_steps or set max_grad_norm, and resume "
      "from a checkpoint saved before step ", first, " (resume_from_checkpoint: latest skips "
      "non-finite ones)"));
}

}  // namespace trainer_internal
}  // namespace cpptrain
