// ZeroEngine (stages 1 and 2) and Zero3Engine with ranks as threads (Gloo over a HashStore):
// one SGD step equals the unsharded reference (tied weights stepped once, clipping), with and
// without offload_optimizer; and what each rank holds after a step (parameters, gradients,
// optimizer state) against the ZeRO formulas, on a model whose sizes 3 ranks do not divide;
// and the offload path's device-side squared norm of the reduced gradients.
#include "engines/zero/zero_engine.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/optim/optimizer.h>
#include <torch/optim/sgd.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/torch_compat.h"
#include "base/torch_status.h"
#include "engines/grad_utils.h"
#include "engines/gradient_scaling.h"
#include "engines/stepped_parameters.h"
#include "engines/zero/zero3_engine.h"
#include "engines/zero/zero_gradients.h"
#include "engines/zero/zero_layout.h"
#include "module/checkpointable_optimizer.h"
#include "module/testing/tied_blocks.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using multi_rank::RunRanksAsThreads;
using testing::TiedBlocks;

absl::StatusOr<std::shared_ptr<Communicator>> Comm(int rank, int world,
                                                   c10::intrusive_ptr<c10d::Store> store) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                      GlooCommunicator::Create(store, rank, world, std::chrono::seconds(30)));
  return std::shared_ptr<Communicator>(std::move(comm));
}

proto::ZeroConfig Config(int stage, bool offload, int64_t bucket = 500000000) {
  proto::ZeroConfig config;
  config.set_stage(stage);
  config.set_reduce_bucket_size(bucket);
  config.set_allgather_bucket_size(bucket);
  if (offload) config.set_offload_optimizer_device(proto::ZeroConfig::CPU);
  return config;
}

// Two fp32 moments per element, like AdamW's exp_avg and exp_avg_sq (a simple momentum step),
// kept where the engine can count and checkpoint them (the Trainer's FusedAdamW is one too).
class TwoMoments : public torch::optim::Optimizer, public CheckpointableOptimizer {
 public:
  explicit TwoMoments(std::vector<torch::Tensor> params)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(1e-3)) {}
  torch::Tensor step(LossClosure) override {
    torch::NoGradGuard no_grad;
    for (const at::Tensor& p : param_groups()[0].params()) {
      if (!p.grad().defined()) continue;
      auto& [m, v] = moments_[p.unsafeGetTensorImpl()];
      if (!m.defined()) m = torch::zeros_like(p), v = torch::zeros_like(p);
      m.mul_(0.9).add_(p.grad());
      v.add_(p.grad().square());
      p.sub_(m * 1e-3);
    }
    return {};
  }
  std::map<std::string, at::Tensor> ExportState(const at::Tensor& param) override {
    auto it = moments_.find(param.unsafeGetTensorImpl());
    if (it == moments_.end()) return {};
    return {{"exp_avg", it->second.first}, {"exp_avg_sq", it->second.second}};
  }
  absl::Status ImportState(const at::Tensor&, const std::map<std::string, at::Tensor>&) override {
    return absl::UnimplementedError("not needed here");
  }

 private:
  std::map<const c10::TensorImpl*, std::pair<at::Tensor, at::Tensor>> moments_;
};

// SGD that reports each parameter as soon as it is stepped, in address order, and writes the
// bf16 copies it is asked for (engines/stepped_parameters.h), as the Trainer's AdamW does on
// its CPU path; it steps every piece but the one named `skip` (a factory that leaves one out).
class ReportingSgd : public torch::optim::Optimizer, public ReportsSteppedParameters {
 public:
  // `copies` (may be null) counts the bf16 copies it wrote.
  ReportingSgd(std::vector<torch::Tensor> params, double lr, std::shared_ptr<int> copies)
      : torch::optim::Optimizer({torch::optim::OptimizerParamGroup(std::move(params))},
                                std::make_unique<torch::optim::SGDOptions>(lr)),
        lr_(lr),
        copies_(std::move(copies)) {}
  bool ReportEachParameterInNextStep(Callback callback) override {
    report_ = std::move(callback);
    return true;
  }
  bool WriteBf16CopiesInNextStep(Bf16CopyOf copy_of) override {
    copy_of_ = std::move(copy_of);
    return true;
  }
  torch::Tensor step(LossClosure) override {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> order = param_groups()[0].params();
    std::sort(order.begin(), order.end(), [](const at::Tensor& a, const at::Tensor& b) {
      return std::less<const void*>()(a.data_ptr(), b.data_ptr());
    });
    const Callback report = std::exchange(report_, nullptr);
    const Bf16CopyOf copy_of = std::exchange(copy_of_, nullptr);
    for (const at::Tensor& p : order) {
      if (p.grad().defined()) p.sub_(p.grad() * lr_);
      at::Tensor copy = copy_of ? copy_of(p) : at::Tensor();
      if (copy.defined()) {
        copy.copy_(p);
        if (copies_) ++*copies_;
      }
      if (report) report(p);
    }
    return {};
  }

 private:
  double lr_;
  std::shared_ptr<int> copies_;
  Callback report_;
  Bf16CopyOf copy_of_;
};

OptimizerFactory ReportingSgdFactory(double lr, const std::string& skip = "",
                                     std::shared_ptr<int> copies = nullptr) {
  return [lr, skip, copies](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> tensors;
    for (const auto& [name, tensor] : params) {
      if (name != skip) tensors.push_back(tensor);
    }
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<ReportingSgd>(tensors, lr, copies));
  };
}

OptimizerFactory AdamWFactory() {
  return [](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> tensors;
    for (const auto& item : params) tensors.push_back(item.second);
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<TwoMoments>(tensors));
  };
}

OptimizerFactory SgdFactory(double lr) {
  return [lr](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> tensors;
    for (const auto& item : params) tensors.push_back(item.second);
    return std::unique_ptr<torch::optim::Optimizer>(
        std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(lr)));
  };
}

Batch Rows(const Batch& batch, int64_t begin, int64_t end) {
  Batch out;
  out.inputs = batch.inputs.narrow(0, begin, end - begin);
  out.labels = batch.labels.narrow(0, begin, end - begin);
  return out;
}

absl::Status TrainStep(Engine& engine, TrainableModel& model, const Batch& batch) {
  torch::Tensor loss;
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    std::unique_ptr<ForwardScope> scope = engine.EnterForward();
    loss = model.LossSum(model.Forward(batch), batch);
  }));
  return engine.Backward(loss);
}

// The reference: one SGD step of TiedBlocks on the summed loss of both ranks' batches,
// clipped to max_norm, the tied weight once.
struct Reference {
  std::map<std::string, at::Tensor> params;
  double norm = 0;
};

Reference SgdStep(const std::vector<Batch>& batches, double lr, double max_norm) {
  TiedBlocks model(1);
  for (const Batch& b : batches) model.LossSum(model.Forward(b), b).backward();
  std::vector<at::Tensor> grads;
  for (auto& [name, p] : UniqueTrainableParameters(model)) grads.push_back(p.grad());
  Reference out;
  out.norm = GlobalNorm(grads).item<double>();
  ClipByNorm(grads, out.norm, max_norm);
  torch::NoGradGuard no_grad;
  for (auto& [name, p] : UniqueTrainableParameters(model)) p.sub_(p.grad() * lr);
  for (const auto& item : model.named_parameters()) out.params[item.key()] = item.value().clone();
  return out;
}

// Under bf16 (stages 1 and 2) the forward sees the bf16 rounding of each fp32 master and the
// masters take the step with the fp32 sum of the bf16 gradients: this reference does the same
// by hand (autocast on the CPU, as the engine's forward runs).
Reference Bf16SgdStep(const std::vector<Batch>& batches, double lr, double max_norm) {
  TiedBlocks master(1);
  std::vector<at::Tensor> sums;
  for (const Batch& b : batches) {
    TiedBlocks working(1);
    working.to(torch::kBFloat16);
    {
      AutocastGuard autocast(at::kCPU, at::kBFloat16);
      working.LossSum(working.Forward(b), b).backward();
    }
    std::vector<at::Tensor> grads;
    for (auto& [name, p] : UniqueTrainableParameters(working))
      grads.push_back(p.grad().to(at::kFloat));
    if (sums.empty()) {
      sums = grads;
    } else {
      for (size_t i = 0; i < sums.size(); ++i) sums[i] = sums[i] + grads[i];
    }
  }
  Reference out;
  out.norm = GlobalNorm(sums).item<double>();
  ClipByNorm(sums, out.norm, max_norm);
  torch::NoGradGuard no_grad;
  size_t i = 0;
  for (auto& [name, p] : UniqueTrainableParameters(master)) p.sub_(sums[i++] * lr);
  for (const auto& item : master.named_parameters()) out.params[item.key()] = item.value().clone();
  return out;
}

class ZeroBf16Test : public ::testing::TestWithParam<std::tuple<int, bool>> {};

INSTANTIATE_TEST_SUITE_P(Stages, ZeroBf16Test,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool()));

// One clipped step under bf16 equals the reference; the parameters are the masters' bf16
// rounding; ExposeMasterWeights shows the fp32 masters, and what is written there becomes the
// masters (a checkpoint load) with training going on after it.
TEST_P(ZeroBf16Test, MastersTakeTheStepAndCheckpointsSeeThem) {
  const auto [stage, offload] = GetParam();
  const std::vector<Batch> batches = {TiedBlocks::Inputs(3, 30), TiedBlocks::Inputs(3, 31)};
  const Reference want = Bf16SgdStep(batches, 0.5, 0.3);
  absl::Status s = RunRanksAsThreads(2, [&](int rank, auto store) -> absl::Status {
    auto model = std::make_shared<TiedBlocks>(1);
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, 2, store));
    CT_ASSIGN_OR_RETURN(auto engine,
                        ZeroEngine::Create(Config(stage, offload, 6), MixedPrecision::kBf16,
                                           c10::Device(c10::kCPU), comm));
    CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, SgdFactory(0.5)));
    // No synchronized backward yet: nothing to clip or step with.
    const absl::Status early = engine->OptimizerStep().status();
    EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition) << early;
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, batches[rank]));
    CT_ASSIGN_OR_RETURN(torch::Tensor norm_tensor, engine->ClipGradNorm(0.3));
    const double norm = norm_tensor.item<double>();
    EXPECT_NEAR(norm, want.norm, 1e-5 * want.norm);
    CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
    engine->ZeroGrad();
    for (const auto& item : model->named_parameters()) {
      const at::Tensor& wanted = want.params.at(item.key());
      EXPECT_EQ(item.value().scalar_type(), at::kBFloat16) << item.key();
      EXPECT_TRUE(torch::allclose(item.value().to(at::kFloat),
                                  wanted.to(at::kBFloat16).to(at::kFloat), 1e-2))
          << item.key() << ": " << item.value() << " vs " << wanted;
    }
    CT_RETURN_IF_ERROR(engine->ExposeMasterWeights());
    EXPECT_EQ(engine->ExposeMasterWeights().code(), absl::StatusCode::kFailedPrecondition);
    for (const auto& item : model->named_parameters()) {
      EXPECT_EQ(item.value().scalar_type(), at::kFloat) << item.key();
      EXPECT_TRUE(torch::allclose(item.value(), want.params.at(item.key()), 1e-5, 1e-6))
          << "stage " << stage << " rank " << rank << " " << item.key() << ": " << item.value()
          << " vs " << want.params.at(item.key());
    }
    {
      torch::NoGradGuard no_grad;
      model->named_parameters()["a.w"].fill_(0.3);  // tied: b.w too
    }
    CT_RETURN_IF_ERROR(engine->RestoreWorkingWeights());
    const at::Tensor loaded = model->named_parameters()["b.w"];
    EXPECT_EQ(loaded.scalar_type(), at::kBFloat16);
    EXPECT_TRUE(torch::equal(
        loaded.to(at::kFloat),
        torch::full_like(loaded.to(at::kFloat), 0.3).to(at::kBFloat16).to(at::kFloat)));
    // Training goes on from the written masters: the hooks still reduce every gradient.
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, batches[rank]));
    CT_RETURN_IF_ERROR(engine->ClipGradNorm(0.3).status());
    CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
    CT_RETURN_IF_ERROR(engine->ExposeMasterWeights());
    const at::Tensor stepped = model->named_parameters()["a.w"].clone();
    CT_RETURN_IF_ERROR(engine->RestoreWorkingWeights());
    EXPECT_FALSE(torch::allclose(stepped, torch::full_like(stepped, 0.3)));
    // Still fp32 masters after a second step (nothing took them from the bf16 copies).
    EXPECT_FALSE(torch::equal(stepped, stepped.to(at::kBFloat16).to(at::kFloat)));
    EXPECT_LT((stepped - 0.3).abs().max().item<double>(), 0.5 * 0.3 + 1e-6);  // lr x clip
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

class ZeroStepTest : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(ZeroStepTest, OneClippedStepEqualsTheReference) {
  const auto [stage, offload] = GetParam();
  const std::vector<Batch> batches = {TiedBlocks::Inputs(3, 30), TiedBlocks::Inputs(3, 31)};
  const Reference want = SgdStep(batches, 0.5, 0.3);
  absl::Status s = RunRanksAsThreads(2, [&](int rank, auto store) -> absl::Status {
    auto model = std::make_shared<TiedBlocks>(1);
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, 2, store));
    std::unique_ptr<Engine> engine;
    if (stage == 3) {
      CT_ASSIGN_OR_RETURN(engine,
                          Zero3Engine::Create(Config(3, offload), MixedPrecision::kNone,
                                              c10::Device(c10::kCPU), ShardMesh{comm, nullptr}));
    } else {
      // A 6-element bucket cap: the 16-element weight is a bucket alone, the biases share one.
      CT_ASSIGN_OR_RETURN(engine,
                          ZeroEngine::Create(Config(stage, offload, 6), MixedPrecision::kNone,
                                             c10::Device(c10::kCPU), comm));
    }
    CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, SgdFactory(0.5)));
    // Half of the batch in an unsynchronized micro-batch, then the rest: the same gradient.
    engine->SetGradientSync(false);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, Rows(batches[rank], 0, 1)));
    engine->SetGradientSync(true);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, Rows(batches[rank], 1, 3)));
    CT_ASSIGN_OR_RETURN(torch::Tensor norm_tensor, engine->ClipGradNorm(0.3));
    const double norm = norm_tensor.item<double>();
    EXPECT_NEAR(norm, want.norm, 1e-5 * want.norm);
    CT_ASSIGN_OR_RETURN(bool stepped, engine->OptimizerStep());
    EXPECT_TRUE(stepped);
    engine->ZeroGrad();
    if (stage == 3) return absl::OkStatus();  // shards: checked end to end elsewhere
    for (const auto& item : model->named_parameters()) {
      EXPECT_TRUE(torch::allclose(item.value(), want.params.at(item.key()), 1e-5, 1e-6))
          << "stage " << stage << " rank " << rank << " " << item.key() << ": " << item.value()
          << " vs " << want.params.at(item.key());
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroStepTest,
                         ::testing::Combine(::testing::Values(1, 2, 3), ::testing::Bool()));

// Twelve parameters of sizes 3 ranks mostly do not divide (one of them 2-d), and a loss linear
// in the input.
class OddModel : public TrainableModel {
 public:
  static constexpr int kParams = 12;
  static int64_t Size(int i) { return 401 + 38 * i; }

  OddModel() : TrainableModel("OddModel") {
    torch::manual_seed(3);
    for (int i = 0; i < kParams; ++i) {
      const at::Tensor init = i == 1 ? torch::randn({Size(i) / 3, 3}) : torch::randn({Size(i)});
      params_.push_back(register_parameter("p" + std::to_string(i), init));
    }
  }
  torch::Tensor Forward(const Batch& batch) override {
    return Hooked(batch.inputs, [this](const torch::Tensor& x) {
      torch::Tensor total = torch::zeros({});
      for (size_t i = 0; i < params_.size() - (use_last ? 0 : 1); ++i) {
        total = total + (i % 2 == 0 ? params_[i].sin().sum() : params_[i].square().sum());
      }
      return x * total;
    });
  }
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch&) const override {
    return logits.sum();
  }
  int64_t CountLossTargets(const Batch& batch) const override { return batch.inputs.size(0); }

  bool use_last = true;  // false: the last parameter gets no gradient

 private:
  std::vector<torch::Tensor> params_;
};

int64_t OddModelNumel() {
  int64_t n = 0;
  for (int i = 0; i < OddModel::kParams; ++i)
    n += i == 1 ? OddModel::Size(i) / 3 * 3 : OddModel::Size(i);
  return n;
}

Batch OddBatch() {
  Batch batch;
  batch.inputs = torch::ones({2, 1});
  batch.labels = torch::zeros({2}, torch::kLong);
  return batch;
}

// On the CPU, P trainable elements (padded: Pp, rank part Pp/N), after two accumulated
// micro-batches and a step:
//   stage 1: parameters 4 Pp, gradients 4 Pp (full fp32 buckets) + 4 Pp/N (reduced shard),
//            optimizer 8 x owned elements (exp_avg, exp_avg_sq)
//   stage 2: parameters 4 Pp, gradients 4 Pp/N, optimizer 8 x owned
//   offload: the shard is on the host instead; + 4 Pp/N host fp32 master
//   bf16:    parameters 2 Pp (the working copies), + 4 Pp/N fp32 master (on the host with
//            offload, else on the device)
// With bf16 that is DeepSpeed's mixed-precision formula with fp32 gradient buffers: stage 1
// 2P + (4P + 4P/N) + 12P/N where DeepSpeed counts 2P + 2P + 12P/N, stage 2 2P + 4P/N + 12P/N
// (DeepSpeed 2P + 14P/N), plus the buckets in flight during backward (checked below).
class ZeroMemoryTest : public ::testing::TestWithParam<std::tuple<int, bool, bool>> {};

TEST_P(ZeroMemoryTest, BytesPerRankFollowTheFormulas) {
  const auto [stage, offload, bf16] = GetParam();
  constexpr int kWorld = 3;
  const int64_t kOddP = OddModelNumel();
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    auto model = std::make_shared<OddModel>();
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, kWorld, store));
    // A 1000-element cap: every parameter its own bucket but the first two, which share one.
    CT_ASSIGN_OR_RETURN(auto engine,
                        ZeroEngine::Create(Config(stage, offload, 1000),
                                           bf16 ? MixedPrecision::kBf16 : MixedPrecision::kNone,
                                           c10::Device(c10::kCPU), comm));
    CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, AdamWFactory()));
    // Two micro-batches, the first unsynced, as the Trainer runs gradient accumulation.
    engine->SetGradientSync(false);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, OddBatch()));
    engine->SetGradientSync(true);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, OddBatch()));
    const ZeroLayout& layout = *engine->layout();
    const int64_t padded = layout.total_numel, part = layout.local_numel;
    EXPECT_GE(padded, kOddP);
    // One pad per bucket, at most world * 4 - 1 elements, and per aligned start at most 3.
    const int64_t buckets = static_cast<int64_t>(layout.buckets.size());
    EXPECT_LT(padded, kOddP + buckets * kWorld * 4 + 3 * OddModel::kParams);
    int64_t owned = 0;
    for (const ZeroLayout::Param& p : layout.params) owned += p.own_numel;
    const ZeroFootprint after_backward = engine->Footprint();
    CT_RETURN_IF_ERROR(engine->ClipGradNorm(1.0).status());
    CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
    const ZeroFootprint after_step = engine->Footprint();
    EXPECT_EQ(after_backward.parameter_bytes, (bf16 ? 2 : 4) * padded);
    const int64_t grads = (stage == 1 ? 4 * padded : 0) + 4 * part;
    EXPECT_EQ(after_backward.gradient_bytes, grads) << "stage " << stage;
    EXPECT_EQ(after_step.optimizer_bytes, 8 * owned + (offload || bf16 ? 4 * part : 0));
    // During backward: stage 1 holds every bucket; stage 2, which reduces every micro-batch
    // into its shard (DeepSpeed's way), at most the shard, the bucket being filled, the one in
    // flight and its output, never the whole gradient, under accumulation too.
    int64_t largest = 0;
    for (const ZeroLayout::Bucket& b : layout.buckets) largest = std::max(largest, b.numel);
    const int64_t peak = after_backward.peak_gradient_buffer_bytes;
    if (stage == 1) {
      EXPECT_GE(peak, 4 * padded + 4 * part);
    } else {
      EXPECT_LE(peak, 4 * part + 2 * 4 * largest + 4 * largest / kWorld);
      EXPECT_LT(peak, 4 * padded);
    }
    EXPECT_LE(owned, part);
    LOG(INFO) << "stage " << stage << (offload ? " offload" : "") << (bf16 ? " bf16" : "")
              << " rank " << rank << ": P "
              << kOddP << " (padded " << padded << ", " << layout.buckets.size()
              << " buckets), bytes: parameters " << after_backward.parameter_bytes << ", gradients "
              << after_backward.gradient_bytes << ", optimizer " << after_step.optimizer_bytes
              << "; peak gradient buffers during backward " << peak << " (largest bucket "
              << 4 * largest << ")";
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

INSTANTIATE_TEST_SUITE_P(Stages, ZeroMemoryTest,
                         ::testing::Combine(::testing::Values(1, 2), ::testing::Bool(),
                                            ::testing::Bool()));

// TwoMoments that reads bf16 gradients of its fp32 parameters as they are (widening each in its
// step), as the Trainer's AdamW does on CUDA: ZeRO stage 2 on one rank then holds them in bf16.
class Bf16ReadingMoments : public TwoMoments, public ScalesGradientsInStep {
 public:
  using TwoMoments::TwoMoments;
  torch::Tensor step(LossClosure closure) override {
    for (auto& p : param_groups()[0].params()) {
      if (p.grad().defined()) p.mutable_grad() = p.grad().to(at::kFloat);
    }
    return TwoMoments::step(std::move(closure));
  }
  bool ScaleGradientsInNextStep(const at::Tensor& scale) override { return !scale.defined(); }
  bool ReadsBf16Gradients() override { return true; }
};

OptimizerFactory MomentsFactory(bool reads_bf16) {
  return [reads_bf16](const NamedParameters& params)
             -> absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> {
    std::vector<torch::Tensor> tensors;
    for (const auto& item : params) tensors.push_back(item.second);
    if (reads_bf16) {
      return std::unique_ptr<torch::optim::Optimizer>(new Bf16ReadingMoments(tensors));
    }
    return std::unique_ptr<torch::optim::Optimizer>(new TwoMoments(tensors));
  };
}

// On one rank stage 2 holds each parameter's gradient as its own tensor, with no bucket and no
// shard: autograd's bf16 gradient itself when the optimizer reads bf16 (2 bytes a parameter),
// else fp32 (4 bytes); a second micro-batch adds into fp32. Two steps (the first with two
// micro-batches, the second with the last parameter unused, which then holds zeros) clip and
// step as stage 1, whose buckets take the reduce-scatter path, and ZeroGrad lets go of them.
TEST(ZeroGradientsTest, OneRankStageTwoHoldsEachGradient) {
  for (const auto& [bf16, reads_bf16] :
       std::vector<std::pair<bool, bool>>{{false, false}, {true, false}, {true, true}}) {
    const std::string label = std::string(bf16 ? " bf16" : "") + (reads_bf16 ? " reads bf16" : "");
    absl::Status s = RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
      std::map<int, std::shared_ptr<OddModel>> models;
      std::map<int, std::unique_ptr<ZeroEngine>> engines;
      for (const int stage : {1, 2}) {
        models[stage] = std::make_shared<OddModel>();
        CT_ASSIGN_OR_RETURN(
            std::shared_ptr<Communicator> comm,
            Comm(rank, 1,
                 c10::make_intrusive<c10d::PrefixStore>("stage" + std::to_string(stage), store)));
        CT_ASSIGN_OR_RETURN(engines[stage],
                            ZeroEngine::Create(Config(stage, false, 1000),
                                               bf16 ? MixedPrecision::kBf16 : MixedPrecision::kNone,
                                               c10::Device(c10::kCPU), comm));
        CT_RETURN_IF_ERROR(
            engines[stage]->PrepareForTraining(models[stage], MomentsFactory(reads_bf16)));
      }
      const int64_t numel = OddModelNumel();
      // During a backward the pieces hold no gradient (a second micro-batch's fp32 sums replace
      // the held bf16 gradients, which the pieces must not keep alive).
      size_t piece_grads_in_backward = 0;
      models[2]->named_parameters()["p0"].register_hook([&](const at::Tensor& grad) {
        piece_grads_in_backward = std::max(piece_grads_in_backward,
                                           Gradients(*engines[2]->optimizer()).size());
        return grad;
      });
      for (int step = 0; step < 2; ++step) {
        std::map<int, double> norms;
        for (const int stage : {1, 2}) {
          ZeroEngine& engine = *engines[stage];
          models[stage]->use_last = step == 0;
          engine.SetGradientSync(step != 0);
          CT_RETURN_IF_ERROR(TrainStep(engine, *models[stage], OddBatch()));
          if (step == 0) {
            engine.SetGradientSync(true);
            CT_RETURN_IF_ERROR(TrainStep(engine, *models[stage], OddBatch()));
          }
          if (stage == 2) {
            const int64_t bytes = (reads_bf16 && step == 1 ? 2 : 4) * numel;
            EXPECT_EQ(engine.Footprint().gradient_bytes, bytes) << "step " << step << label;
            if (step == 0) {  // the peak since the engine was made
              EXPECT_EQ(engine.Footprint().peak_gradient_buffer_bytes, bytes) << label;
            }
          }
          CT_ASSIGN_OR_RETURN(const torch::Tensor norm, engine.ClipGradNorm(1.0));
          norms[stage] = norm.item<double>();
          CT_RETURN_IF_ERROR(engine.OptimizerStep().status());
          engine.ZeroGrad();
          const int64_t kept = stage == 1 ? 8 * engine.layout()->total_numel : 0;
          EXPECT_EQ(engine.Footprint().gradient_bytes, kept)
              << "stage " << stage << " step " << step << label;
          if (stage == 2) {
            EXPECT_TRUE(Gradients(*engine.optimizer()).empty()) << "pieces still hold gradients";
          }
        }
        EXPECT_NEAR(norms[1], norms[2], 1e-6 * norms[1]) << "step " << step << label;
      }
      EXPECT_EQ(piece_grads_in_backward, 0u) << label;
      for (const auto& item : models[1]->named_parameters()) {
        const at::Tensor other = models[2]->named_parameters()[item.key()];
        EXPECT_TRUE(torch::allclose(item.value().to(at::kFloat), other.to(at::kFloat), 1e-5, 1e-6))
            << item.key() << label;
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

// Stage 3 on the CPU over `world` ranks, prepared for training `model` with AdamW.
template <typename Store>
absl::StatusOr<std::unique_ptr<Zero3Engine>> PreparedZero3(int rank, int world, Store store,
                                                           std::shared_ptr<OddModel> model) {
  CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, world, store));
  CT_ASSIGN_OR_RETURN(auto engine, Zero3Engine::Create(Config(3, false), MixedPrecision::kNone,
                                                       c10::Device(c10::kCPU),
                                                       ShardMesh{comm, nullptr}));
  CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, AdamWFactory()));
  return engine;
}

// Stage 3 at rest: parameters, gradients and AdamW state each 1/N (the flat shards).
TEST(Zero3MemoryTest, EverythingIsPartitioned) {
  constexpr int kWorld = 3;
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    auto model = std::make_shared<OddModel>();
    CT_ASSIGN_OR_RETURN(auto engine, PreparedZero3(rank, kWorld, store, model));
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, OddBatch()));
    CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
    int64_t params = 0, grads = 0, state = 0;
    auto* adamw = dynamic_cast<TwoMoments*>(engine->optimizer());
    for (const at::Tensor& p : model->parameters()) {
      params += p.numel() * 4;
      if (p.grad().defined()) grads += p.grad().numel() * 4;
      for (const auto& [name, v] : adamw->ExportState(p)) state += v.numel() * v.element_size();
    }
    const int64_t padded_part = engine->flat()->shard_bytes();  // 4 x padded / N
    EXPECT_LE(params, padded_part);
    EXPECT_GE(params, padded_part - 4 * kWorld * 4);
    EXPECT_EQ(grads, params);
    EXPECT_EQ(state, 2 * params);
    LOG(INFO) << "stage 3 rank " << rank << ": bytes at rest: parameters " << params
              << " (flat shard " << padded_part << "), gradients " << grads << ", optimizer "
              << state << "; whole model " << 4 * OddModelNumel();
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Stage 3 under accumulation reduce-scatters every micro-batch, as DeepSpeed does: after the
// first of two micro-batches (gradient sync off, as the Trainer sets it) each parameter already
// holds its reduced shard of the gradient, so no rank keeps a full fp32 gradient between
// micro-batches (FSDP's no_sync would: 4 bytes per parameter); after the second the shards hold
// both micro-batches' sum, as one process's gradient of both.
TEST(Zero3MemoryTest, AccumulationKeepsOnlyThePartitionedGradient) {
  constexpr int kWorld = 3;
  OddModel reference;
  for (int i = 0; i < 2 * kWorld; ++i) {
    reference.LossSum(reference.Forward(OddBatch()), OddBatch()).backward();
  }
  // Made here, one after the other: OddModel seeds the global generator, which threads share.
  std::vector<std::shared_ptr<OddModel>> models;
  for (int rank = 0; rank < kWorld; ++rank) models.push_back(std::make_shared<OddModel>());
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    std::shared_ptr<OddModel> model = models[rank];
    CT_ASSIGN_OR_RETURN(auto engine, PreparedZero3(rank, kWorld, store, model));
    engine->SetGradientSync(false);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, OddBatch()));
    int64_t grads = 0, params = 0;
    for (const at::Tensor& p : model->parameters()) {
      params += p.numel() * 4;
      if (p.grad().defined()) grads += p.grad().numel() * 4;
    }
    EXPECT_EQ(grads, params) << "rank " << rank << ": the first micro-batch's shard gradients";
    EXPECT_LE(params, engine->flat()->shard_bytes());
    engine->SetGradientSync(true);
    CT_RETURN_IF_ERROR(TrainStep(*engine, *model, OddBatch()));
    CT_ASSIGN_OR_RETURN(at::Tensor norm, engine->ClipGradNorm(0.0));
    at::Tensor expected = torch::zeros({}, torch::kDouble);
    for (const at::Tensor& p : reference.parameters()) {
      expected += p.grad().to(torch::kDouble).square().sum();
    }
    EXPECT_NEAR(norm.item<double>(), std::sqrt(expected.item<double>()),
                1e-5 * std::sqrt(expected.item<double>()))
        << "two micro-batches on each of 3 ranks: one process's six";
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// One unit of LayeredModel: two parameters whose sizes 3 ranks mostly do not divide.
class Layer : public Unit {
 public:
  explicit Layer(int i) : Unit("Layer") {
    a_ = register_parameter("a", torch::randn({1201 + 37 * i}));
    b_ = register_parameter("b", torch::randn({301 + 11 * i, 2}));
  }
  torch::Tensor Forward(torch::Tensor h) {
    return Hooked(std::move(h), [this](const torch::Tensor& x) {
      return torch::tanh(x) + 1e-3 * (a_.sin().sum() + b_.square().sum());
    });
  }

 private:
  torch::Tensor a_, b_;
};

// kLayers units in a chain, each its own ZeRO-3 group when stage3_param_persistence_threshold
// is 0 (the root holds nothing), so one group's gradients are a small part of the model's.
class LayeredModel : public TrainableModel {
 public:
  static constexpr int kLayers = 16;

  LayeredModel() : TrainableModel("LayeredModel") {
    torch::manual_seed(5);
    for (int i = 0; i < kLayers; ++i) {
      layers_.push_back(register_module("layer" + std::to_string(i), std::make_shared<Layer>(i)));
    }
  }
  torch::Tensor Forward(const Batch& batch) override {
    return Hooked(batch.inputs, [this](const torch::Tensor& x) {
      torch::Tensor h = x;
      for (const auto& layer : layers_) h = layer->Forward(h);
      return h;
    });
  }
  torch::Tensor LossSum(const torch::Tensor& logits, const Batch&) const override {
    return logits.sum();
  }
  int64_t CountLossTargets(const Batch& batch) const override { return batch.inputs.size(0); }
  std::vector<std::string> LayerUnitClasses() const override { return {"Layer"}; }

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

// The ZeRO memory test under accumulation, stage 3: over three micro-batches (sync off, off,
// on, as the Trainer sets it) the gradient storage a rank holds at once (ShardingCore::
// peak_gradient_bytes: local parts' gradients, a group's full gradients from autograd, the
// reduce-scatters in flight) is its 1/N partition plus at most two groups' worth in flight,
// never the full gradient; FSDP's no_sync on the same sharding (the core's own switch, which
// ZeRO-3 does not take) keeps a padded full gradient of every group, at least 4 bytes per
// parameter.
TEST(Zero3MemoryTest, PeakGradientUnderAccumulationIsThePartitionPlusTwoGroups) {
  constexpr int kWorld = 3;
  constexpr int kMicroBatches = 3;
  std::vector<std::shared_ptr<LayeredModel>> models;  // made here: they seed the generator
  for (int rank = 0; rank < kWorld; ++rank) models.push_back(std::make_shared<LayeredModel>());
  int64_t full = 0;
  for (const at::Tensor& p : models[0]->parameters()) full += 4 * p.numel();
  absl::Status s = RunRanksAsThreads(kWorld, [&](int rank, auto store) -> absl::Status {
    std::shared_ptr<LayeredModel> model = models[rank];
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, kWorld, store));
    proto::ZeroConfig config = Config(3, false);
    config.set_stage3_param_persistence_threshold(0);  // every layer its own group
    CT_ASSIGN_OR_RETURN(auto engine, Zero3Engine::Create(config, MixedPrecision::kNone,
                                                         c10::Device(c10::kCPU),
                                                         ShardMesh{comm, nullptr}));
    CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, AdamWFactory()));
    FlatShardedModel& core = *engine->flat();
    EXPECT_EQ(core.num_groups(), LayeredModel::kLayers + 1);
    int64_t largest_group = 0;  // padded, fp32
    for (const auto& [used, padded] : core.FlatSizes()) {
      largest_group = std::max(largest_group, 4 * padded);
    }
    int64_t peaks[2] = {0, 0};
    for (const bool fsdp_no_sync : {false, true}) {
      core.ResetPeakUnsharded();
      for (int m = 0; m < kMicroBatches; ++m) {
        const bool last = m + 1 == kMicroBatches;
        engine->SetGradientSync(last);
        if (fsdp_no_sync) core.SetGradientSync(last);
        CT_RETURN_IF_ERROR(TrainStep(*engine, *model, OddBatch()));
      }
      peaks[fsdp_no_sync] = core.peak_gradient_bytes();
      engine->ZeroGrad();
    }
    const int64_t partition = core.shard_bytes();  // 4 x padded / N
    const int64_t in_flight = 2 * largest_group + largest_group / kWorld;
    EXPECT_GT(peaks[0], partition - 4 * kWorld * (LayeredModel::kLayers + 1) * 4);
    EXPECT_LE(peaks[0], partition + in_flight);
    EXPECT_LT(peaks[0], full * 2 / 3) << "rank " << rank << ": the full gradient is " << full;
    EXPECT_GE(peaks[1], full) << "FSDP's no_sync keeps every group's full gradient";
    LOG(INFO) << "stage 3 rank " << rank << ", " << kMicroBatches
              << " micro-batches: peak gradient bytes " << peaks[0] << " (partition " << partition
              << ", largest group " << largest_group << ", full gradient " << full
              << "); FSDP's no_sync on the same sharding " << peaks[1];
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Offload under bf16 with an optimizer that reports its progress: each bucket goes back as its
// last piece is stepped, from the bf16 copies the step wrote, and the result is the reference
// step's; the working parameters are exactly the masters' bf16 rounding. A piece the factory
// left out keeps its value (its bucket goes back from the masters instead).
// The same without offload (one bucket, so a rank's range holds several pieces, and buckets of
// 6, so a bucket's range starts past 0): the step writes each piece's bf16 copy straight into
// its place in the working parameters, and a bucket with a piece it did not write is copied
// from the masters.
TEST(ZeroOffloadTest, BucketsGoBackFromTheStepsBf16Copies) {
  const std::vector<Batch> batches = {TiedBlocks::Inputs(3, 30), TiedBlocks::Inputs(3, 31)};
  const Reference want = Bf16SgdStep(batches, 0.5, 0.3);
  // Without offload also a 6-element cap: several buckets, so a bucket's range starts past 0.
  for (const auto [stage, offload, cap] :
       {std::tuple{1, true, 6}, {2, true, 6}, {1, false, 1000}, {2, false, 1000}, {1, false, 6},
        {2, false, 6}}) {
    for (const std::string skip : {"", "b.b"}) {
      absl::Status s = RunRanksAsThreads(2, [&](int rank, auto store) -> absl::Status {
        auto model = std::make_shared<TiedBlocks>(1);
        const at::Tensor skipped_before =
            skip.empty() ? at::Tensor() : model->named_parameters()[skip].detach().clone();
        CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, 2, store));
        CT_ASSIGN_OR_RETURN(
            auto engine,
            ZeroEngine::Create(Config(stage, offload, cap), MixedPrecision::kBf16,
                               c10::Device(c10::kCPU), comm));
        auto copies = std::make_shared<int>(0);
        CT_RETURN_IF_ERROR(
            engine->PrepareForTraining(model, ReportingSgdFactory(0.5, skip, copies)));
        CT_RETURN_IF_ERROR(TrainStep(*engine, *model, batches[rank]));
        CT_RETURN_IF_ERROR(engine->ClipGradNorm(0.3).status());
        CT_RETURN_IF_ERROR(engine->OptimizerStep().status());
        EXPECT_GT(*copies, 0) << "stage " << stage << " offload " << offload;
        EXPECT_EQ(engine->Footprint().host_copy_bytes,
                  offload ? 2 * engine->layout()->local_numel : 0);
        std::map<std::string, at::Tensor> working;
        for (const auto& item : model->named_parameters()) {
          working[item.key()] = item.value().detach().clone();
        }
        CT_RETURN_IF_ERROR(engine->ExposeMasterWeights());
        for (const auto& item : model->named_parameters()) {
          const std::string where = "stage " + std::to_string(stage) +
                                    (offload ? " offload" : "") + " cap " + std::to_string(cap) +
                                    " skip '" + skip + "' rank " + std::to_string(rank) + " " +
                                    item.key();
          EXPECT_TRUE(torch::equal(working.at(item.key()), item.value().to(at::kBFloat16)))
              << where;
          const at::Tensor& wanted =
              item.key() == skip ? skipped_before : want.params.at(item.key());
          EXPECT_TRUE(torch::allclose(item.value(), wanted, 1e-5, 1e-6))
              << where << ": " << item.value() << " vs " << wanted;
        }
        return engine->RestoreWorkingWeights();
      });
      EXPECT_TRUE(s.ok()) << s;
    }
  }
}

// With offload, the clip's squared norm is summed on the device as each bucket is reduced: it
// equals the host shard's while every bucket was reduced once, and is withdrawn when a second
// micro-batch adds into the shard or someone writes the shard.
// On one rank (stage 2, on the device) the gradients are held per parameter and no shard is
// made: a bf16 gradient stays bf16 only with HoldBf16(true); one that got none holds zeros of
// the dtype autograd would have given it; a second backward adds into fp32; Clear() drops them.
TEST(ZeroGradientsTest, OneRankHoldsEachGradientUntilAClear) {
  for (const bool hold_bf16 : {false, true}) {
    absl::Status s = RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
      CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, 1, store));
      torch::manual_seed(3);
      const auto bf16 = torch::TensorOptions().dtype(at::kBFloat16);
      std::vector<at::Tensor> params = {torch::randn({5, 3}, bf16).requires_grad_(),
                                        torch::randn({7}, bf16).requires_grad_(),
                                        torch::randn({3}, bf16).requires_grad_()};
      const ZeroLayout layout = BuildZeroLayout({15, 7, 3}, 1, rank, /*bucket_numel=*/8, 4);
      ZeroGradients grads(layout, params, comm.get(), c10::Device(c10::kCPU),
                          /*keep_full=*/false,
                          {c10::Device(c10::kCPU), false, /*reduce_squares=*/false});
      EXPECT_TRUE(grads.held());
      EXPECT_FALSE(grads.shard().defined());
      grads.HoldBf16(hold_bf16);
      grads.Install();
      const auto backward = [&](bool use_last) {
        grads.Begin(/*sync=*/true);
        at::Tensor loss = params[0].sum(1).mul(params[1].narrow(0, 0, 5)).sum();
        if (use_last) loss = loss + params[2].square().sum();
        loss.backward();
        return grads.Finish(true);
      };
      torch::NoGradGuard no_grad;
      const std::vector<at::Tensor> want = {
          params[1].narrow(0, 0, 5).unsqueeze(1).expand({5, 3}).reshape({-1}),
          torch::cat({params[0].sum(1), torch::zeros({2}, bf16)}), torch::zeros({3}, bf16)};
      const at::ScalarType first = hold_bf16 ? at::kBFloat16 : at::kFloat;
      for (const bool use_last : {false, true}) {
        grads.Clear();
        for (int i = 0; i < 3; ++i) EXPECT_FALSE(grads.OwnedGradient(i).defined());
        EXPECT_EQ(grads.LiveBytes(), 0);
        {
          at::AutoGradMode enable(true);
          CT_RETURN_IF_ERROR(backward(false));
        }
        for (int i = 0; i < 3; ++i) {
          const at::Tensor held = grads.OwnedGradient(i);
          EXPECT_EQ(held.scalar_type(), first) << i;
          EXPECT_TRUE(torch::equal(held.to(at::kFloat), want[i].to(at::kFloat))) << i;
          EXPECT_FALSE(params[i].grad().defined()) << i;
        }
        EXPECT_EQ(grads.OwnedGradients().size(), 3u);
        EXPECT_EQ(grads.LiveBytes(), (hold_bf16 ? 2 : 4) * 25);
        if (!use_last) continue;
        {
          at::AutoGradMode enable(true);
          CT_RETURN_IF_ERROR(backward(true));  // a second micro-batch: the sums, in fp32
        }
        const at::Tensor last = 2 * params[2].to(at::kFloat);
        for (int i = 0; i < 3; ++i) {
          const at::Tensor held = grads.OwnedGradient(i);
          EXPECT_EQ(held.scalar_type(), at::kFloat) << i;
          const at::Tensor sum = i == 2 ? last : 2 * want[i].to(at::kFloat);
          EXPECT_TRUE(torch::equal(held, sum)) << i << ": " << held << " vs " << sum;
        }
        EXPECT_EQ(grads.LiveBytes(), 4 * 25);
      }
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST(ZeroGradientsTest, ReducedSquaresDescribeTheShardOrAreWithdrawn) {
  absl::Status s = RunRanksAsThreads(2, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, 2, store));
    torch::manual_seed(3);  // the same parameters and inputs on both ranks
    std::vector<at::Tensor> params = {torch::randn({5, 3}).requires_grad_(),
                                      torch::randn({7}).requires_grad_(),
                                      torch::randn({3}).requires_grad_()};
    const ZeroLayout layout = BuildZeroLayout({15, 7, 3}, 2, rank, /*bucket_numel=*/8, 4);
    ZeroGradients grads(layout, params, comm.get(), c10::Device(c10::kCPU), /*keep_full=*/false,
                        {c10::Device(c10::kCPU), false, /*reduce_squares=*/true});
    grads.Install();
    const auto backward = [&](double factor) {
      grads.Begin(/*sync=*/true);
      (params[0].sum(1).mul(params[1].narrow(0, 0, 5)).sum() * factor + params[2].square().sum())
          .backward();
      return grads.Finish(true);
    };
    CT_RETURN_IF_ERROR(backward(1.0 + rank));
    at::Tensor squares = grads.ReducedSquares();
    EXPECT_TRUE(squares.defined());
    if (squares.defined()) {
      const double host = grads.shard().square().sum().item<double>();
      EXPECT_NEAR(squares.item<double>(), host, 1e-6 * host) << "rank " << rank;
      EXPECT_GT(host, 0.0);
    }
    CT_RETURN_IF_ERROR(backward(2.0));  // a second micro-batch adds into the shard
    EXPECT_FALSE(grads.ReducedSquares().defined());
    grads.Clear();
    EXPECT_FALSE(grads.ReducedSquares().defined());  // nothing reduced yet
    CT_RETURN_IF_ERROR(backward(3.0));
    EXPECT_TRUE(grads.ReducedSquares().defined());
    grads.ShardWritten();
    EXPECT_FALSE(grads.ReducedSquares().defined());
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Stage 1 keeps the full gradient: unsynchronized micro-batches add up in the buckets and one
// synchronized backward reduces the sum once, so the device sum still describes the shard.
TEST(ZeroGradientsTest, ReducedSquaresOfStageOneAccumulation) {
  absl::Status s = RunRanksAsThreads(2, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> comm, Comm(rank, 2, store));
    torch::manual_seed(4);
    std::vector<at::Tensor> params = {torch::randn({9}).requires_grad_(),
                                      torch::randn({6}).requires_grad_()};
    const ZeroLayout layout = BuildZeroLayout({9, 6}, 2, rank, /*bucket_numel=*/8, 4);
    ZeroGradients grads(layout, params, comm.get(), c10::Device(c10::kCPU), /*keep_full=*/true,
                        {c10::Device(c10::kCPU), false, /*reduce_squares=*/true});
    grads.Install();
    for (bool sync : {false, false, true}) {
      grads.Begin(sync);
      (params[0].square().sum() * (1.0 + rank) + params[1].sum()).backward();
      CT_RETURN_IF_ERROR(grads.Finish(true));
    }
    const at::Tensor squares = grads.ReducedSquares();
    EXPECT_TRUE(squares.defined());
    if (squares.defined()) {
      const double host = grads.shard().square().sum().item<double>();
      EXPECT_NEAR(squares.item<double>(), host, 1e-6 * host) << "rank " << rank;
    }
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(ZeroEngineTest, CreateNamesTheStage) {
  EXPECT_FALSE(
      ZeroEngine::Create(Config(3, false), MixedPrecision::kNone, c10::Device(c10::kCPU), nullptr)
          .ok());
  absl::Status s = RunRanksAsThreads(1, [&](int rank, auto store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(std::shared_ptr<Communicator> c, Comm(rank, 1, store));
    auto three =
        ZeroEngine::Create(Config(3, false), MixedPrecision::kNone, c10::Device(c10::kCPU), c);
    EXPECT_FALSE(three.ok());
    EXPECT_NE(three.status().message().find("zero.stage is 3"), std::string::npos);
    auto fp16 =
        ZeroEngine::Create(Config(2, false), MixedPrecision::kFp16, c10::Device(c10::kCPU), c);
    EXPECT_FALSE(fp16.ok());
    EXPECT_NE(fp16.status().message().find("fp16"), std::string::npos);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

}  // namespace
}  // namespace cpptrain
