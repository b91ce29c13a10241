#include "engines/working_parameters.h"

#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/accumulate_gradient.h"

namespace cpptrain {
namespace {

absl::Status CheckOrder(const std::vector<int>& order, size_t n) {
  std::vector<char> seen(n, 0);
  for (int i : order) {
    if (i < 0 || static_cast<size_t>(i) >= n || seen[i]) {
      return absl::InvalidArgumentError(absl::StrCat("WorkingParameters: order holds ", i,
                                                     ", which is not a new index below ", n,
                                                     ": give each parameter's index once"));
    }
    seen[i] = 1;
  }
  if (order.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("WorkingParameters: order has ", order.size(),
                                                   " indices for ", n, " parameters"));
  }
  return absl::OkStatus();
}

// For each of `names`, the index of its set in the returned sets, or -1: the sets of `adjacent`
// as indices, each name in at most one set, sets of fewer than two left out.
std::vector<std::vector<int>> AdjacentSets(const std::vector<std::string>& names,
                                           const std::vector<std::vector<std::string>>& adjacent,
                                           std::vector<int>& set_of) {
  std::unordered_map<std::string, int> index;
  for (size_t i = 0; i < names.size(); ++i) index.emplace(names[i], static_cast<int>(i));
  set_of.assign(names.size(), -1);
  std::vector<std::vector<int>> sets;
  for (const std::vector<std::string>& set : adjacent) {
    const int id = static_cast<int>(sets.size());
    std::vector<int> members;
    for (const std::string& name : set) {
      auto it = index.find(name);
      if (it == index.end() || set_of[it->second] >= 0) continue;
      set_of[it->second] = id;
      members.push_back(it->second);
    }
    if (members.size() >= 2) {
      sets.push_back(std::move(members));
    } else {
      for (int i : members) set_of[i] = -1;
    }
  }
  return sets;
}

}  // namespace

std::vector<std::vector<int>> FlatOrderUnits(const std::vector<std::string>& names,
                                             const std::vector<std::vector<std::string>>& adjacent,
                                             bool reversed) {
  std::vector<int> set_of;
  const std::vector<std::vector<int>> sets = AdjacentSets(names, adjacent, set_of);
  const int n = static_cast<int>(names.size());
  std::vector<char> placed(n, 0);
  std::vector<std::vector<int>> units;
  for (int k = 0; k < n; ++k) {
    const int i = reversed ? n - 1 - k : k;
    if (placed[i]) continue;
    units.push_back(set_of[i] < 0 ? std::vector<int>{i} : sets[set_of[i]]);
    for (int j : units.back()) placed[j] = 1;
  }
  return units;
}

absl::StatusOr<std::unique_ptr<WorkingParameters>> WorkingParameters::Create(
    Named params, std::vector<int> order, bool flat_gradients) {
  if (order.empty()) {
    for (size_t i = 0; i < params.size(); ++i) order.push_back(static_cast<int>(i));
  }
  if (absl::Status status = CheckOrder(order, params.size()); !status.ok()) return status;
  for (const auto& [name, p] : params) {
    if (p.scalar_type() != at::kFloat || p.device() != params[0].second.device()) {
      return absl::InvalidArgumentError(
          absl::StrCat("bf16 working copies: parameter ", name, " is ",
                       c10::toString(p.scalar_type()), " on ", p.device().str(),
                       " but the masters are the fp32 model on one device: build "
                       "the model in fp32, or turn bf16_working_copies off"));
    }
  }
  std::unique_ptr<WorkingParameters> w(new WorkingParameters());
  w->offsets_.assign(params.size(), 0);
  int64_t total = 0;
  for (int i : order) {
    w->offsets_[i] = total;
    total += params[i].second.numel();
  }
  torch::NoGradGuard no_grad;
  const auto options = torch::TensorOptions().device(params.empty() ? c10::Device(c10::kCPU)
                                                                    : params[0].second.device());
  w->master_ = torch::empty({total}, options.dtype(at::kFloat));
  if (flat_gradients) w->gradients_ = torch::zeros({total}, options.dtype(at::kFloat));
  w->working_ = torch::empty({total}, options.dtype(at::kBFloat16));
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i].second;
    at::Tensor master = w->master_.narrow(0, w->offsets_[i], p.numel()).view(p.sizes());
    master.copy_(p.detach());
    at::Tensor leaf = torch::empty({0}, master.options());
    leaf.set_data(master);
    leaf.set_requires_grad(true);
    w->index_of_master_[leaf.unsafeGetTensorImpl()] = static_cast<int>(i);
    w->masters_.emplace_back(params[i].first, leaf);
    w->params_.push_back(p);
  }
  w->working_.copy_(w->master_);
  w->PointParametersAt(w->working_);
  w->fresh_.assign(params.size(), 1);
  w->RecordVersions();
  return w;
}

// The model outlives its engine: it gets the masters back as its fp32 parameters (the trained
// values at full precision), and the hooks on the old accumulators find no owner.
WorkingParameters::~WorkingParameters() {
  try {
    if (!exposed_) PointParametersAt(master_);
    for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();
  } catch (const std::exception&) {  // nothing to do about it in a destructor
  }
}

void WorkingParameters::PointParametersAt(const at::Tensor& flat) {
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i].set_data(flat.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes()));
  }
}

void WorkingParameters::RecordVersions() {
  versions_.resize(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) versions_[i] = params_[i]._version();
}

void WorkingParameters::InstallHooks(std::function<void(int)> after_move) {
  after_move_ = std::move(after_move);
  accumulators_ = InstallGradientHooks<WorkingParameters, &WorkingParameters::MoveGradient>(
      params_, hooks_.handle());
}

bool WorkingParameters::RemakeAccumulators() {
  if (!ReleaseAccumulators(accumulators_)) return false;
  InstallHooks(after_move_);
  return true;
}

at::Tensor WorkingParameters::GradientView(int i) {
  return gradients_.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
}

// Runs on the stream autograd ran the accumulation on, so the copy is ordered after it.
void WorkingParameters::MoveGradient(int i) {
  at::Tensor& param = params_[i];
  if (!param.grad().defined()) {  // no gradient reached it, but its accumulation ran
    if (after_move_) after_move_(i);
    return;
  }
  {
    torch::NoGradGuard no_grad;
    at::Tensor master = masters_[i].second;
    // Undefined although not fresh: someone cleared the masters' gradients without
    // BeginAccumulation (optimizer()->zero_grad() by hand).
    const bool first = fresh_[i] || !master.grad().defined();
    if (first && gradients_.defined()) {
      master.mutable_grad() = GradientView(i);
      master.mutable_grad().copy_(param.grad());
    } else {
      if (first) master.mutable_grad() = at::Tensor();  // overwritten, not added to
      AccumulateGradient(master.mutable_grad(), param.grad(), at::kFloat, keep_bf16_);
    }
    fresh_[i] = 0;
  }
  param.mutable_grad() = at::Tensor();
  if (after_move_) after_move_(i);
}

void WorkingParameters::BeginAccumulation() {
  std::fill(fresh_.begin(), fresh_.end(), 1);
  for (at::Tensor& p : params_) p.mutable_grad() = at::Tensor();  // a backward cut short's
}

void WorkingParameters::ZeroUnmoved() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!fresh_[i]) continue;
    at::Tensor master = masters_[i].second;
    if (gradients_.defined()) {
      master.mutable_grad() = GradientView(i);
      master.mutable_grad().zero_();
    } else {
      master.mutable_grad() = torch::zeros_like(master);
    }
    fresh_[i] = 0;
  }
}

void WorkingParameters::AdoptWrittenWorkingCopies() {
  if (exposed_) return;
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i]._version() == versions_[i]) continue;
    masters_[i].second.copy_(params_[i]);
    versions_[i] = params_[i]._version();
  }
}

void WorkingParameters::Refresh() {
  if (exposed_) return;
  torch::NoGradGuard no_grad;
  working_.copy_(master_);
  RecordVersions();
}

void WorkingParameters::MarkRefreshed() {
  if (!exposed_) RecordVersions();
}

at::Tensor WorkingParameters::WorkingCopyOf(const at::Tensor& master) const {
  auto it = index_of_master_.find(master.unsafeGetTensorImpl());
  if (it == index_of_master_.end()) return at::Tensor();
  const int i = it->second;
  return working_.narrow(0, offsets_[i], params_[i].numel());
}

void WorkingParameters::Expose() {
  if (exposed_) return;
  AdoptWrittenWorkingCopies();
  PointParametersAt(master_);
  exposed_ = true;
}

void WorkingParameters::Restore() {
  if (!exposed_) return;
  {
    torch::NoGradGuard no_grad;
    working_.copy_(master_);
  }
  PointParametersAt(working_);
  InstallHooks(after_move_);
  RecordVersions();
  exposed_ = false;  // only now: a throw above leaves it exposed, and Restore can be retried
}

}  // namespace cpptrain
