#include "tests/sharding/shard_test_setup.h"

#include <torch/utils.h>

#include <map>
#include <utility>

#include "base/status.h"
#include "base/torch_status.h"
#include "models/configs.h"
#include "sharding/gloo_communicator.h"

namespace cpptrain {
namespace shard_test {

std::shared_ptr<DecoderLM> Decoder(int layers) {
  proto::DecoderConfig config = *NamedDecoderConfig("tiny");
  config.set_num_hidden_layers(layers);
  return *BuildDecoder(config);
}

std::vector<std::shared_ptr<DecoderLM>> Replicas(int world, int layers) {
  std::vector<std::shared_ptr<DecoderLM>> out;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(3);
    out.push_back(Decoder(layers));
  }
  return out;
}

absl::StatusOr<ShardMesh> Mesh(int rank, int world, c10::intrusive_ptr<c10d::Store> store) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                      GlooCommunicator::Create(store, rank, world, kTimeout));
  return ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr};
}

absl::Status RunPasses(DecoderLM& model, ShardingCore& sharded, const Batch& batch,
                       const std::vector<bool>& syncs) {
  for (const auto& item : model.named_parameters()) item.value().mutable_grad() = torch::Tensor();
  for (const bool sync : syncs) {
    sharded.SetGradientSync(sync);
    CT_RETURN_IF_ERROR(sharded.BeginForward());
    torch::Tensor loss = model.LossSum(model.Forward(batch), batch);
    CT_RETURN_IF_ERROR(sharded.EndForward());
    CT_RETURN_IF_ERROR(sharded.BeginBackward());
    CT_RETURN_IF_ERROR(CatchTorch([&] { loss.backward(); }));
    CT_RETURN_IF_ERROR(sharded.FinishBackward());
  }
  return absl::OkStatus();
}

namespace {

// The sums of `patterns` of passes are k times the first gradients, in fp32.
absl::Status ExpectSums(DecoderLM& model, ShardingCore& sharded, const Batch& batch,
                        const std::map<std::string, torch::Tensor>& first) {
  const std::vector<std::vector<bool>> patterns = {
      {true, true}, {false, true}, {true, false, true}};
  for (const std::vector<bool>& syncs : patterns) {
    CT_RETURN_IF_ERROR(RunPasses(model, sharded, batch, syncs));
    const double passes = static_cast<double>(syncs.size());
    for (const auto& item : model.named_parameters()) {
      const torch::Tensor& grad = item.value().grad();
      CT_RETURN_IF_ERROR(Check(grad.scalar_type() == at::kFloat,
                               "the sum of passes of " + item.key() + " is not fp32"));
      CT_RETURN_IF_ERROR(Check(torch::equal(grad, passes * first.at(item.key())),
                               "the sum of " + std::to_string(syncs.size()) + " passes of " +
                                   item.key() + " differs"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ExpectOneRankHandsBf16Gradients(const ShardBf16& shard, const Batch& batch) {
  auto models = Replicas(2, /*layers=*/2);  // one per setting, both one-rank worlds
  std::vector<std::map<std::string, torch::Tensor>> first(2);
  std::vector<int64_t> peaks(2);
  int64_t numel = 0;
  for (const auto& item : models[0]->named_parameters()) numel += item.value().numel();
  for (int hold = 0; hold < 2; ++hold) {
    CT_RETURN_IF_ERROR(multi_rank::RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
      CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, 1, store));
      DecoderLM& model = *models[hold];
      CT_ASSIGN_OR_RETURN(ShardingCore * sharded, shard(model, mesh));
      sharded->HoldBf16Gradients(hold == 1);
      sharded->ResetPeakUnsharded();
      CT_RETURN_IF_ERROR(RunPasses(model, *sharded, batch, {true}));
      peaks[hold] = sharded->peak_gradient_bytes();
      for (const auto& item : model.named_parameters()) {
        const torch::Tensor& grad = item.value().grad();
        const at::ScalarType want = hold == 1 ? at::kBFloat16 : at::kFloat;
        CT_RETURN_IF_ERROR(Check(grad.defined() && grad.scalar_type() == want &&
                                     item.value().scalar_type() == at::kFloat,
                                 "gradient of " + item.key() + " has the wrong dtype"));
        first[hold][item.key()] = grad.to(at::kFloat).clone();  // fp32: not its own copy
      }
      return ExpectSums(model, *sharded, batch, first[hold]);
    }));
  }
  for (const auto& [name, grad] : first[0]) {
    CT_RETURN_IF_ERROR(Check(torch::equal(grad, first[1].at(name)),
                             name + ": held and widened gradients differ"));
  }
  // Held: the bf16 gradients, at most all of them at once; widened: fp32 ones beside them.
  CT_RETURN_IF_ERROR(Check(peaks[1] <= 2 * numel, "held bf16 gradients peaked at " +
                                                      std::to_string(peaks[1]) + " bytes"));
  return Check(peaks[0] >= 4 * numel,
               "widened gradients peaked at only " + std::to_string(peaks[0]) + " bytes");
}

}  // namespace shard_test
}  // namespace cpptrain
