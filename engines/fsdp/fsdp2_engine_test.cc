// Fsdp2Engine with ranks as threads (Gloo over a HashStore): a weight tied across units steps
// once; ZeroGrad drops what an unsynchronized pass accumulated; a model sharded at load time
// is refused when the fsdp block asks for other sharding, naming each field.
#include "engines/fsdp/fsdp2_engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>

#include "base/status.h"
#include "base/torch_status.h"
#include "engines/gradient_scaling.h"
#include "engines/testing/engine_testing.h"
#include "module/testing/tied_blocks.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using multi_rank::RunRanksAsThreads;
using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::TiedBlocks;

constexpr int kWorld = 2;

absl::StatusOr<ShardMesh> Mesh(int rank, c10::intrusive_ptr<c10d::Store> store) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                      GlooCommunicator::Create(store, rank, kWorld, std::chrono::seconds(30)));
  return ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr};
}

absl::StatusOr<std::unique_ptr<Fsdp2Engine>> MakeEngine(int rank,
                                                        c10::intrusive_ptr<c10d::Store> store) {
  CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, store));
  return Fsdp2Engine::Create(proto::FsdpConfig(), MixedPrecision::kNone, c10::Device(c10::kCPU),
                             std::move(mesh));
}

absl::Status TrainStep(Engine& engine, TiedBlocks& model, const Batch& batch) {
  torch::Tensor loss;
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    std::unique_ptr<ForwardScope> scope = engine.EnterForward();
    loss = model.LossSum(model.Forward(batch), batch);
  }));
  return engine.Backward(loss);
}

// Each rank's chunk of every parameter equals its rows of `want`.
void ExpectChunksOf(const testing::SgdReference& want, Fsdp2Engine& engine, TiedBlocks& model,
                    int rank) {
  for (const auto& item : model.named_parameters()) {
    const ShardInfo* info = engine.sharded()->Find(item.value());
    ASSERT_NE(info, nullptr) << item.key();
    const at::Tensor rows = want.params.at(item.key()).narrow(0, info->row_begin, info->local_rows);
    EXPECT_TRUE(torch::allclose(item.value(), rows, 1e-5, 1e-6))
        << "rank " << rank << " " << item.key() << ": " << item.value() << " vs " << rows;
  }
}

TEST(Fsdp2EngineTest, TiedWeightsAcrossUnitsAreSteppedOnce) {
  const std::vector<Batch> batches = {TiedBlocks::Inputs(3, 30), TiedBlocks::Inputs(3, 31)};
  const testing::SgdReference want = testing::TiedBlocksSgdStep(batches, 0.5, 0);
  std::vector<std::shared_ptr<TiedBlocks>> models = {std::make_shared<TiedBlocks>(1),
                                                     std::make_shared<TiedBlocks>(1)};
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto engine, MakeEngine(rank, store));
    int given = 0;
    CT_RETURN_IF_ERROR(engine->PrepareForTraining(models[rank], testing::SgdFactory(0.5, &given)));
    EXPECT_EQ(given, 3);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *models[rank], batches[rank]));
    CT_ASSIGN_OR_RETURN(torch::Tensor norm_tensor, engine->ClipGradNorm(0));
    const double norm = norm_tensor.item<double>();
    EXPECT_NEAR(norm, want.norm, 1e-5 * want.norm);
    CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
    ExpectChunksOf(want, *engine, *models[rank], rank);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// An unsynchronized pass (the first micro-batch of an accumulation), then ZeroGrad (an
// out-of-memory retry drops the step): the next step must see only its own batch.
// Untied, so only the accumulation is under test.
TEST(Fsdp2EngineTest, ZeroGradDropsWhatAnUnsyncedPassAccumulated) {
  const std::vector<Batch> batches = {TiedBlocks::Inputs(3, 40), TiedBlocks::Inputs(3, 41)};
  const testing::SgdReference want = testing::TiedBlocksSgdStep(batches, 0.5, 0, /*tied=*/false);
  std::vector<std::shared_ptr<TiedBlocks>> models = {std::make_shared<TiedBlocks>(1, false),
                                                     std::make_shared<TiedBlocks>(1, false)};
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto engine, MakeEngine(rank, store));
    CT_RETURN_IF_ERROR(engine->PrepareForTraining(models[rank], testing::SgdFactory(0.5)));
    engine->SetGradientSync(false);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *models[rank], TiedBlocks::Inputs(3, 99)));
    engine->ZeroGrad();
    engine->SetGradientSync(true);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *models[rank], batches[rank]));
    CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
    ExpectChunksOf(want, *engine, *models[rank], rank);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// SGD that reads bf16 gradients of its fp32 parameters as they are (ScalesGradientsInStep), as
// the Trainer's AdamW does on CUDA.
class Bf16ReadingSgd : public torch::optim::SGD, public ScalesGradientsInStep {
 public:
  Bf16ReadingSgd(std::vector<torch::Tensor> params, double lr)
      : torch::optim::SGD(std::move(params), torch::optim::SGDOptions(lr)) {}
  torch::Tensor step(LossClosure closure) override {
    for (auto& p : param_groups()[0].params()) {
      if (p.grad().defined()) p.mutable_grad() = p.grad().to(at::kFloat);
    }
    return torch::optim::SGD::step(std::move(closure));
  }
  bool ScaleGradientsInNextStep(const at::Tensor& scale) override { return !scale.defined(); }
  bool ReadsBf16Gradients() override { return true; }
};

// On one rank under bf16, PrepareForTraining tells the core whether its optimizer reads bf16
// gradients: the local parts' gradients are bf16 for one that does, fp32 for one that does not,
// and both step to the same parameters.
TEST(Fsdp2EngineTest, OneRankHandsBf16GradientsToAnOptimizerThatReadsThem) {
  const Batch batch = TiedBlocks::Inputs(3, 50);
  std::vector<std::shared_ptr<TiedBlocks>> models = {std::make_shared<TiedBlocks>(1, false),
                                                     std::make_shared<TiedBlocks>(1, false)};
  for (int reads = 0; reads < 2; ++reads) {
    absl::Status s = RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
      CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                          GlooCommunicator::Create(store, rank, 1, std::chrono::seconds(30)));
      ShardMesh mesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr};
      CT_ASSIGN_OR_RETURN(auto engine,
                          Fsdp2Engine::Create(proto::FsdpConfig(), MixedPrecision::kBf16,
                                              c10::Device(c10::kCPU), std::move(mesh)));
      OptimizerFactory factory = testing::SgdFactory(0.5);
      if (reads == 1) {
        factory = [](const NamedParameters& params)
            -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
          std::vector<torch::Tensor> tensors;
          for (const auto& item : params) tensors.push_back(item.second);
          return std::unique_ptr<torch::optim::Optimizer>(new Bf16ReadingSgd(tensors, 0.5));
        };
      }
      CT_RETURN_IF_ERROR(engine->PrepareForTraining(models[reads], factory));
      CT_RETURN_IF_ERROR(TrainStep(*engine, *models[reads], batch));
      for (const auto& item : models[reads]->named_parameters()) {
        EXPECT_EQ(item.value().scalar_type(), at::kFloat) << item.key();
        EXPECT_EQ(item.value().grad().scalar_type(), reads == 1 ? at::kBFloat16 : at::kFloat)
            << item.key();
      }
      return engine->OptimizerStep().status();
    });
    ASSERT_TRUE(s.ok()) << s;
  }
  for (const auto& item : models[0]->named_parameters()) {
    EXPECT_TRUE(torch::equal(item.value(), models[1]->named_parameters()[item.key()]))
        << item.key();
  }
}

// Shards both models with `options`, then asks ForShardedModel for an engine with `config`.
std::vector<absl::Status> AdoptWith(const FullyShardOptions& options,
                                    const proto::FsdpConfig* config, MixedPrecision precision) {
  std::vector<absl::Status> out(kWorld);
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(ShardMesh mesh, Mesh(rank, store));
    TiedBlocks model(1, /*tied=*/false);
    CT_RETURN_IF_ERROR(FullyShard(model, mesh, options).status());
    out[rank] = Fsdp2Engine::ForShardedModel(model, config, precision).status();
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(Fsdp2EngineTest, AShardedModelIsRefusedWhenTheFsdpBlockDisagrees) {
  proto::FsdpConfig config;
  config.set_dp_replicate_size(2);
  config.set_reshard_after_forward(false);
  config.set_offload_params(true);
  config.set_auto_wrap_policy(proto::FsdpConfig::NO_WRAP);
  for (const absl::Status& refused : AdoptWith({}, &config, MixedPrecision::kBf16)) {
    EXPECT_THAT(
        std::string(refused.message()),
        AllOf(HasSubstr("fsdp.dp_replicate_size is 2"),
              HasSubstr("fsdp.param_dtype resolves to BF16 but the model gathers in FP32"),
              HasSubstr("fsdp.reshard_after_forward"), HasSubstr("fsdp.offload_params"),
              HasSubstr("fsdp.auto_wrap_policy"), HasSubstr("FullyShardOptionsFromConfig")));
  }
  // bf16 with no fsdp block: the model's own sharding rules, except its gather dtype.
  for (const absl::Status& refused : AdoptWith({}, nullptr, MixedPrecision::kBf16)) {
    EXPECT_THAT(std::string(refused.message()), HasSubstr("param_dtype resolves to BF16"));
  }
}

TEST(Fsdp2EngineTest, AShardedModelIsAdoptedWhenTheFsdpBlockAgrees) {
  proto::FsdpConfig config;
  config.set_reshard_after_forward(true);
  config.set_activation_checkpointing(true);
  const FullyShardOptions options =
      FullyShardOptionsFromConfig(config, MixedPrecision::kBf16, c10::Device(c10::kCPU));
  for (const absl::Status& adopted : AdoptWith(options, &config, MixedPrecision::kBf16)) {
    EXPECT_TRUE(adopted.ok()) << adopted;
  }
  for (const absl::Status& adopted : AdoptWith({}, nullptr, MixedPrecision::kNone)) {
    EXPECT_TRUE(adopted.ok()) << adopted;
  }
}

}  // namespace
}  // namespace cpptrain
