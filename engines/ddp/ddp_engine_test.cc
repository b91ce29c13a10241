// DdpEngine with ranks as threads (Gloo over a HashStore): bucket layout, no communication
// without synchronization, the cross-rank overflow decision, and summed gradients.
#include "engines/ddp/ddp_engine.h"

#include <atomic>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include "base/status.h"
#include "engines/testing/engine_testing.h"
#include "models/mlp.h"
#include "module/testing/tied_blocks.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using multi_rank::RunRanksAsThreads;

// Counts the all-reduces that go through to the real communicator.
class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor& t, ReduceOp op) override {
    ++all_reduces;
    return inner_->AllReduce(t, op);
  }
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor& i, at::Tensor& o) override {
    return inner_->AllGather(i, o);
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor& i, at::Tensor& o,
                                                      ReduceOp op) override {
    return inner_->ReduceScatter(i, o, op);
  }
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor& t, int root) override {
    return inner_->Broadcast(t, root);
  }
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor& i, at::Tensor& o,
                                                int root) override {
    return inner_->Scatter(i, o, root);
  }
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>& t,
                                                           ReduceOp op) override {
    return inner_->AllReduceCoalesced(t, op);
  }
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(const std::vector<at::Tensor>& i,
                                                           std::vector<at::Tensor>& o) override {
    return inner_->AllGatherCoalesced(i, o);
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(const std::vector<at::Tensor>& i,
                                                               std::vector<at::Tensor>& o,
                                                               ReduceOp op) override {
    return inner_->ReduceScatterCoalesced(i, o, op);
  }
  absl::Status Barrier() override { return inner_->Barrier(); }

  std::atomic<int> all_reduces{0};

 private:
  std::unique_ptr<Communicator> inner_;
};

proto::MlpConfig SmallConfig() {
  proto::MlpConfig config;
  config.set_input_size(6);
  config.set_hidden_size(8);  // layers.0: 8x6 + 8; layers.1: 8x8 + 8; head: 3x8 + 3
  config.set_num_layers(2);
  config.set_num_classes(3);
  return config;
}

std::shared_ptr<Mlp> SmallMlp(int rank) {
  torch::manual_seed(100 + rank);  // different on purpose: preparation broadcasts rank 0's
  return *Mlp::Create(SmallConfig());
}

// The small MLP whose two hidden weights want to be side by side, as DecoderLM's q/k/v do.
class PairedMlp : public Mlp {
 public:
  PairedMlp() : Mlp(SmallConfig()) {}
  std::vector<std::vector<std::string>> AdjacentParameterGroups() const override {
    return {{"layers.0.linear.weight", "layers.1.linear.weight"}};
  }
};

OptimizerFactory Sgd() {
  return [](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> tensors;
    for (const auto& [name, p] : params) tensors.push_back(p);
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(0.1)));
  };
}

struct Setup {
  std::shared_ptr<Mlp> model;
  std::shared_ptr<CountingCommunicator> comm;
  std::unique_ptr<DdpEngine> engine;
};

absl::StatusOr<Setup> Prepare(int rank, c10::intrusive_ptr<c10d::Store> store, int world,
                              double bucket_cap_mb) {
  Setup s;
  auto gloo = GlooCommunicator::Create(store, rank, world, std::chrono::seconds(30));
  if (!gloo.ok()) return gloo.status();
  s.comm = std::make_shared<CountingCommunicator>(std::move(*gloo));
  proto::DdpConfig config;
  config.set_bucket_cap_mb(bucket_cap_mb);
  auto engine = DdpEngine::Create(config, MixedPrecision::kNone, c10::Device(c10::kCPU), s.comm);
  if (!engine.ok()) return engine.status();
  s.engine = std::move(*engine);
  s.model = SmallMlp(rank);
  absl::Status prepared = s.engine->PrepareForTraining(s.model, Sgd());
  if (!prepared.ok()) return prepared;
  return s;
}

Batch RankBatch(int rank) {
  torch::manual_seed(7 + rank);
  return Batch{torch::randn({4, 6}), torch::randint(3, {4}), torch::Tensor()};
}

TEST(DdpEngineTest, BucketsFollowReverseRegistrationOrderUpToTheCap) {
  // 200 bytes per bucket: the head (27 floats = 108 bytes) and layers.1's bias (32 bytes) share
  // one; layers.1's weight (256 bytes) exceeds the cap and sits alone; and so on.
  ASSERT_TRUE(RunRanksAsThreads(2, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto s = Prepare(rank, store, 2, 200.0 / (1024 * 1024));
    if (!s.ok()) return s.status();
    std::vector<std::string> order;
    for (const auto& bucket : s->engine->BucketParameterNames()) {
      for (const auto& name : bucket) order.push_back(name);
    }
    std::vector<std::string> registered;
    for (const auto& item : s->model->named_parameters()) registered.push_back(item.key());
    std::reverse(registered.begin(), registered.end());
    EXPECT_EQ(order, registered);
    for (const auto& bucket : s->engine->BucketParameterNames()) {
      int64_t bytes = 0;
      for (const auto& name : bucket) bytes += s->model->named_parameters()[name].numel() * 4;
      if (bucket.size() > 1) {
        EXPECT_LE(bytes, 200) << bucket.front();
      }
    }
    EXPECT_GT(s->engine->BucketParameterNames().size(), 2u);
    return absl::OkStatus();
  }).ok());
}

// Whether `names` of `model` are consecutive pieces of one buffer, in that order.
bool SideBySide(torch::nn::Module& model, const std::vector<std::string>& names) {
  const auto params = model.named_parameters();
  for (size_t i = 1; i < names.size(); ++i) {
    const at::Tensor& before = params[names[i - 1]];
    const at::Tensor& p = params[names[i]];
    if (!p.is_alias_of(before) || p.storage_offset() != before.storage_offset() + before.numel()) {
      return false;
    }
  }
  return true;
}

// A PairedMlp holding `init`'s values.
std::shared_ptr<PairedMlp> CopyOf(PairedMlp& init) {
  auto model = std::make_shared<PairedMlp>();
  torch::NoGradGuard no_grad;
  for (const auto& item : model->named_parameters()) {
    item.value().copy_(init.named_parameters()[item.key()]);
  }
  return model;
}

// The model's adjacent set is one unit of the reversed order, placed where the walk from the
// head first meets it (layers.1's weight) and kept in its own order, in one bucket even past the
// cap; with bf16 working copies the two weights are consecutive in one buffer, under DDP and the
// local engine alike. Through those buckets, two ranks' SGD step equals the local engine's over
// both batches, bit for bit (as Bf16WorkingCopiesEqualOneProcessAccumulatingBothBatches).
TEST(DdpEngineTest, AnAdjacentSetStaysTogetherInItsOrderInBucketsAndWorkingCopies) {
  const std::vector<std::string> pair = {"layers.0.linear.weight", "layers.1.linear.weight"};
  const std::vector<Batch> batches = {RankBatch(0), RankBatch(1)};
  auto init = std::make_shared<PairedMlp>();
  const auto step = [&](Engine& engine, PairedMlp& model,
                        const std::vector<int>& ranks) -> absl::Status {
    for (int r : ranks) {
      torch::Tensor loss;
      {
        auto scope = engine.EnterForward();
        loss = model.LossSum(model.Forward(batches[r]), batches[r]);
      }
      CT_RETURN_IF_ERROR(engine.Backward(loss));
    }
    return engine.OptimizerStep().status();
  };
  proto::LocalEngineConfig cpu;
  cpu.set_device("cpu");
  auto local = LocalEngine::Create(cpu, MixedPrecision::kBf16);
  ASSERT_TRUE(local.ok()) << local.status();
  std::shared_ptr<PairedMlp> want = CopyOf(*init);
  ASSERT_TRUE((*local)->PrepareForTraining(want, Sgd()).ok());
  EXPECT_TRUE(SideBySide(*want, pair)) << "the local engine's working copies";
  ASSERT_TRUE(step(**local, *want, {0, 1}).ok());
  ASSERT_TRUE(RunRanksAsThreads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = GlooCommunicator::Create(store, rank, 2, std::chrono::seconds(30));
    if (!comm.ok()) return comm.status();
    proto::DdpConfig config;
    config.set_bucket_cap_mb(200.0 / (1024 * 1024));  // the pair, 448 bytes, exceeds it
    auto engine = DdpEngine::Create(config, MixedPrecision::kBf16, c10::Device(c10::kCPU),
                                    std::move(*comm));
    if (!engine.ok()) return engine.status();
    std::shared_ptr<PairedMlp> model = CopyOf(*init);
    CT_RETURN_IF_ERROR((*engine)->PrepareForTraining(model, Sgd()));
    const std::vector<std::vector<std::string>> buckets = {
        {"head.bias", "head.weight", "layers.1.linear.bias"},
        {"layers.0.linear.weight", "layers.1.linear.weight"},
        {"layers.0.linear.bias"}};
    EXPECT_EQ((*engine)->BucketParameterNames(), buckets);
    EXPECT_EQ(model->named_parameters()[pair[0]].scalar_type(), torch::kBFloat16);
    EXPECT_TRUE(SideBySide(*model, pair)) << "DDP's working copies";
    CT_RETURN_IF_ERROR(step(**engine, *model, {rank}));
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(item.value().equal(want->named_parameters()[item.key()]))
          << "rank " << rank << " " << item.key();
    }
    return absl::OkStatus();
  }).ok());
}

TEST(DdpEngineTest, GradientsAreSummedAndNothingIsSentWithoutSync) {
  ASSERT_TRUE(RunRanksAsThreads(2, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto s = Prepare(rank, store, 2, 25);
    if (!s.ok()) return s.status();
    const int buckets = static_cast<int>(s->engine->BucketParameterNames().size());
    // Parameters start equal on both ranks (rank 0's were broadcast).
    torch::Tensor sum = s->model->parameters()[0].detach().clone();
    auto work = s->comm->AllReduce(sum, ReduceOp::kSum);
    EXPECT_TRUE(work.ok() && (*work)->Wait().ok());
    EXPECT_TRUE(torch::allclose(sum, 2 * s->model->parameters()[0]));
    const int before = s->comm->all_reduces.load();

    Batch batch = RankBatch(rank);
    s->engine->SetGradientSync(false);
    EXPECT_TRUE(s->engine->Backward(s->model->LossSum(s->model->Forward(batch), batch)).ok());
    EXPECT_EQ(s->comm->all_reduces.load(), before) << "no communication without sync";
    torch::Tensor local_grad = s->model->parameters()[0].grad().clone();

    s->engine->ZeroGrad();
    s->engine->SetGradientSync(true);
    EXPECT_TRUE(s->engine->Backward(s->model->LossSum(s->model->Forward(batch), batch)).ok());
    EXPECT_EQ(s->comm->all_reduces.load(), before + buckets) << "one all-reduce per bucket";
    // The synchronized gradient is the sum of both ranks' local gradients.
    torch::Tensor total = local_grad.clone();
    auto w = s->comm->AllReduce(total, ReduceOp::kSum);
    EXPECT_TRUE(w.ok() && (*w)->Wait().ok());
    EXPECT_TRUE(torch::allclose(s->model->parameters()[0].grad(), total, 1e-5, 1e-6));
    return absl::OkStatus();
  }).ok());
}

TEST(DdpEngineTest, AnOverflowOnOneRankSkipsTheStepOnAll) {
  ASSERT_TRUE(RunRanksAsThreads(3, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto s = Prepare(rank, store, 3, 25);
    if (!s.ok()) return s.status();
    auto all_clean = s->engine->AllRanksFinite(true);
    EXPECT_TRUE(all_clean.ok() && *all_clean);
    auto one_bad = s->engine->AllRanksFinite(rank != 1);  // rank 1 overflowed
    EXPECT_TRUE(one_bad.ok());
    EXPECT_FALSE(*one_bad) << "rank " << rank << " must skip the step too";
    return absl::OkStatus();
  }).ok());
}

// A weight tied across two units (a.w and b.w) is one bucket slot, one optimizer entry and
// one term of the norm: after a step it equals one process stepping the summed loss once.
TEST(DdpEngineTest, TiedWeightsAreReducedAndSteppedOnce) {
  const std::vector<Batch> batches = {testing::TiedBlocks::Inputs(3, 20),
                                      testing::TiedBlocks::Inputs(3, 21)};
  const testing::SgdReference want = testing::TiedBlocksSgdStep(batches, 0.5, 0);
  ASSERT_TRUE(RunRanksAsThreads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = GlooCommunicator::Create(store, rank, 2, std::chrono::seconds(30));
    if (!comm.ok()) return comm.status();
    auto engine = DdpEngine::Create(proto::DdpConfig(), MixedPrecision::kNone,
                                    c10::Device(c10::kCPU), std::move(*comm));
    if (!engine.ok()) return engine.status();
    auto model = std::make_shared<testing::TiedBlocks>(1);
    int given = 0;
    CT_RETURN_IF_ERROR((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5, &given)));
    EXPECT_EQ(given, 3);
    EXPECT_EQ((*engine)->BucketParameterNames().size(), 1u);
    EXPECT_EQ((*engine)->BucketParameterNames()[0].size(), 3u);
    const Batch& batch = batches[rank];
    CT_RETURN_IF_ERROR((*engine)->Backward(model->LossSum(model->Forward(batch), batch)));
    CT_ASSIGN_OR_RETURN(torch::Tensor norm_tensor, (*engine)->ClipGradNorm(0));
    const double norm = norm_tensor.item<double>();
    EXPECT_NEAR(norm, want.norm, 1e-5 * want.norm);
    CT_RETURN_IF_ERROR((*engine)->OptimizerStep().status());
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(torch::allclose(item.value(), want.params.at(item.key()), 1e-5, 1e-6))
          << "rank " << rank << " " << item.key();
    }
    return absl::OkStatus();
  }).ok());
}

// Under bf16 with working copies the buckets all-reduce the fp32 gradients of the masters: two
// ranks equal one process accumulating both ranks' batches (fp32 sums of the same bf16
// gradients), bit for bit, over two clipped steps; parameters stay bf16 and replicated.
TEST(DdpEngineTest, Bf16WorkingCopiesEqualOneProcessAccumulatingBothBatches) {
  const std::vector<std::vector<Batch>> steps = {
      {testing::TiedBlocks::Inputs(3, 20), testing::TiedBlocks::Inputs(3, 21)},
      {testing::TiedBlocks::Inputs(3, 22), testing::TiedBlocks::Inputs(3, 23)}};
  const auto train = [&](Engine& engine, testing::TiedBlocks& model,
                         const std::vector<int>& ranks) -> absl::Status {
    for (const std::vector<Batch>& batches : steps) {
      for (int r : ranks) {
        torch::Tensor loss;
        {
          auto scope = engine.EnterForward();
          loss = model.LossSum(model.Forward(batches[r]), batches[r]);
        }
        CT_RETURN_IF_ERROR(engine.Backward(loss));
      }
      CT_RETURN_IF_ERROR(engine.ClipGradNorm(0.05).status());
      CT_RETURN_IF_ERROR(engine.OptimizerStep().status());
      engine.ZeroGrad();
    }
    return absl::OkStatus();
  };
  proto::LocalEngineConfig cpu;
  cpu.set_device("cpu");
  auto local = LocalEngine::Create(cpu, MixedPrecision::kBf16);
  ASSERT_TRUE(local.ok()) << local.status();
  auto want = std::make_shared<testing::TiedBlocks>(1);
  ASSERT_TRUE((*local)->PrepareForTraining(want, testing::SgdFactory(0.5)).ok());
  ASSERT_TRUE(train(**local, *want, {0, 1}).ok());
  ASSERT_EQ(want->named_parameters()["a.w"].scalar_type(), torch::kBFloat16);
  ASSERT_TRUE(RunRanksAsThreads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto comm = GlooCommunicator::Create(store, rank, 2, std::chrono::seconds(30));
    if (!comm.ok()) return comm.status();
    auto engine = DdpEngine::Create(proto::DdpConfig(), MixedPrecision::kBf16,
                                    c10::Device(c10::kCPU), std::move(*comm));
    if (!engine.ok()) return engine.status();
    auto model = std::make_shared<testing::TiedBlocks>(1);
    CT_RETURN_IF_ERROR((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5)));
    CT_RETURN_IF_ERROR(train(**engine, *model, {rank}));
    for (const auto& item : model->named_parameters()) {
      EXPECT_EQ(item.value().scalar_type(), torch::kBFloat16) << item.key();
      EXPECT_TRUE(item.value().equal(want->named_parameters()[item.key()]))
          << "rank " << rank << " " << item.key();
    }
    return absl::OkStatus();
  }).ok());
}

// A model outlives its engine: after the first DDP engine is gone, a second trains the same
// model (two Trainers in turn) and its gradients are summed once, by the second's buckets.
TEST(DdpEngineTest, ASecondEngineTrainsTheModelTheFirstLeft) {
  for (MixedPrecision precision : {MixedPrecision::kNone, MixedPrecision::kBf16}) {
    ASSERT_TRUE(RunRanksAsThreads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
      auto model = std::make_shared<testing::TiedBlocks>(1);
      const Batch batch = testing::TiedBlocks::Inputs(3, 30 + rank);
      for (int round = 0; round < 2; ++round) {
        auto round_store =
            c10::make_intrusive<c10d::PrefixStore>("round" + std::to_string(round), store);
        auto comm = GlooCommunicator::Create(round_store, rank, 2, std::chrono::seconds(30));
        if (!comm.ok()) return comm.status();
        auto engine = DdpEngine::Create(proto::DdpConfig(), precision, c10::Device(c10::kCPU),
                                        std::move(*comm));
        if (!engine.ok()) return engine.status();
        CT_RETURN_IF_ERROR((*engine)->PrepareForTraining(model, testing::SgdFactory(0.5)));
        EXPECT_EQ(model->named_parameters()["a.w"].scalar_type(),
                  precision == MixedPrecision::kBf16 ? torch::kBFloat16 : torch::kFloat);
        torch::Tensor loss;
        {
          auto scope = (*engine)->EnterForward();
          loss = model->LossSum(model->Forward(batch), batch);
        }
        CT_RETURN_IF_ERROR((*engine)->Backward(loss));
        CT_ASSIGN_OR_RETURN(torch::Tensor norm, (*engine)->ClipGradNorm(0));
        EXPECT_GT(norm.item<double>(), 0) << "round " << round;
        CT_RETURN_IF_ERROR((*engine)->OptimizerStep().status());
      }
      EXPECT_EQ(model->named_parameters()["a.w"].scalar_type(), torch::kFloat)
          << "with the engines gone the model holds its fp32 values";
      return absl::OkStatus();
    }).ok());
  }
}

// broadcast_buffers: a buffer a rank changed (running statistics) is rank 0's again at the
// next training forward; with it off, each rank keeps its own.
TEST(DdpEngineTest, BroadcastBuffersBeforeEveryTrainingForward) {
  for (bool broadcast : {true, false}) {
    ASSERT_TRUE(RunRanksAsThreads(2, [&](int rank, c10::intrusive_ptr<c10d::Store> store) {
      auto comm = GlooCommunicator::Create(store, rank, 2, std::chrono::seconds(30));
      if (!comm.ok()) return comm.status();
      proto::DdpConfig config;
      config.set_broadcast_buffers(broadcast);
      auto engine = DdpEngine::Create(config, MixedPrecision::kNone, c10::Device(c10::kCPU),
                                      std::move(*comm));
      if (!engine.ok()) return engine.status();
      std::shared_ptr<Mlp> model = SmallMlp(rank);
      torch::Tensor stat = model->register_buffer("running_stat", torch::zeros({3}));
      CT_RETURN_IF_ERROR((*engine)->PrepareForTraining(model, Sgd()));
      stat.fill_(rank + 1.0);
      (*engine)->EnterForward();
      EXPECT_TRUE(stat.equal(torch::full({3}, broadcast ? 1.0 : rank + 1.0)))
          << "rank " << rank << " broadcast " << broadcast << ": " << stat;
      return absl::OkStatus();
    }).ok());
  }
}

// A backward that bypasses Engine::Backward while synchronization is on reduces nothing, so
// the step refuses to run on those gradients.
TEST(DdpEngineTest, ABackwardOutsideTheEngineIsRefusedAtTheStep) {
  ASSERT_TRUE(RunRanksAsThreads(2, [](int rank, c10::intrusive_ptr<c10d::Store> store) {
    auto s = Prepare(rank, store, 2, 25);
    if (!s.ok()) return s.status();
    Batch batch = RankBatch(rank);
    s->model->LossSum(s->model->Forward(batch), batch).backward();
    auto step = s->engine->OptimizerStep();
    EXPECT_FALSE(step.ok());
    EXPECT_NE(step.status().message().find("Engine::Backward"), std::string::npos)
        << step.status();
    s->engine->ZeroGrad();
    EXPECT_TRUE(s->engine->Backward(s->model->LossSum(s->model->Forward(batch), batch)).ok());
    EXPECT_TRUE(s->engine->OptimizerStep().ok());
    return absl::OkStatus();
  }).ok());
}

}  // namespace
}  // namespace cpptrain
