#include "tools/bench_verification.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <unordered_set>

#include "base/status.h"
#include "sharding/flat_shard.h"
#include "sharding/fully_shard.h"

namespace cpptrain {
namespace {

at::Generator SampleGenerator(int64_t index) {
  return at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(index));
}

}  // namespace

RandomTokens::RandomTokens(int64_t size, int64_t seq_len, int64_t vocab)
    : size_(size), seq_len_(seq_len), vocab_(vocab) {}

Example RandomTokens::Get(int64_t index) const {
  return {at::randint(vocab_, {seq_len_}, SampleGenerator(index), at::kLong), at::Tensor()};
}

MarkovTokens::MarkovTokens(int64_t size, int64_t seq_len, int64_t vocab)
    : size_(size), seq_len_(seq_len) {
  const int64_t states = std::min(vocab, kStates);
  // The same chain for every sample and every run: a fixed seed, not the sample's.
  const at::Tensor order = at::randperm(states, SampleGenerator(-1), at::kLong);
  const int64_t* ids = order.data_ptr<int64_t>();
  successor_.assign(ids, ids + states);
}

Example MarkovTokens::Get(int64_t index) const {
  const int64_t states = static_cast<int64_t>(successor_.size());
  at::Generator generator = SampleGenerator(index);
  const at::Tensor uniform = at::randint(states, {seq_len_}, generator, at::kLong);
  const at::Tensor coins = at::rand({seq_len_}, generator, at::kDouble);
  at::Tensor tokens = uniform.clone();
  int64_t* out = tokens.data_ptr<int64_t>();
  const double* coin = coins.data_ptr<double>();
  for (int64_t t = 1; t < seq_len_; ++t) {
    if (coin[t] < kFollow) out[t] = successor_[out[t - 1]];
  }
  return {tokens, at::Tensor()};
}

absl::StatusOr<double> ParameterSquareSum(TrainableModel& model, Engine& engine) {
  CT_RETURN_IF_ERROR(engine.ExposeMasterWeights());
  FullyShardedModel* per_param = FullyShardedOf(model);
  FlatShardedModel* flat = FlatShardedOf(model);
  std::unordered_set<const void*> seen;  // tied parameters count once, as PyTorch lists them
  double sum = 0;
  absl::Status status = absl::OkStatus();
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const bool sharded = per_param ? per_param->Find(p) != nullptr
                                   : flat != nullptr && flat->FindPiece(p) != nullptr;
    absl::StatusOr<at::Tensor> whole = p.detach();
    if (sharded) {
      whole = per_param ? per_param->GatherFull(p) : flat->GatherFull(p);  // every rank
    }
    if (!whole.ok()) {
      status = whole.status();
      break;
    }
    sum += at::sum(whole->to(at::kFloat).square(), at::kDouble).item<double>();
  }
  CT_RETURN_IF_ERROR(engine.RestoreWorkingWeights());
  CT_RETURN_IF_ERROR(status);
  return sum;
}

}  // namespace cpptrain
