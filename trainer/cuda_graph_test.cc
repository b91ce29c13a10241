// The Trainer's step on a CUDA device: replayed as a CUDA graph (cuda_graphs) it trains as the
// eager step does (local and DDP engines), a step that cannot be captured falls back to eager
// steps, and an eager step queues its work without the host waiting for the device. Every test
// needs a CUDA device and a CUDA LibTorch (the GPU hosts); elsewhere each says SKIPPED.
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

#include "base/cuda_graph.h"
#include "base/status.h"
#include "trainer/data/in_memory_dataset.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

#if defined(CPPTRAIN_HAS_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace cpptrain {
namespace {

using testing::MaxRelativeDifference;
using testing::Parameters;
using testing::TestTempDir;
using testing::TinyDecoder;

bool HaveCuda() { return torch::cuda::is_available() && SideStreamGraph::Supported(); }

// Sequences of one length, so every step has the same shapes and loss normalizer.
std::shared_ptr<const Dataset> FixedLengthTokens(int64_t count, int64_t length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> sequences(count, std::vector<int64_t>(length));
  for (auto& tokens : sequences) {
    for (int64_t& t : tokens) t = 1 + rng() % 60;
  }
  return *InMemoryDataset::FromTokenSequences(sequences);
}

// bf16 on CUDA with AdamW (fused), clipping that clips, a learning rate that changes every step
// (warm-up then cosine), weight decay and two micro-batches per step.
proto::TrainingArguments GraphArgs(const std::string& name, bool graphs) {
  proto::TrainingArguments args;
  args.set_output_dir(TestTempDir(name));
  args.set_learning_rate(3e-3);
  args.set_lr_scheduler_type(proto::TrainingArguments::COSINE);
  args.set_warmup_steps(2);
  args.set_max_steps(8);
  args.set_per_device_train_batch_size(4);
  args.set_gradient_accumulation_steps(2);
  args.set_max_grad_norm(0.5);
  args.set_weight_decay(0.1);
  args.set_bf16(true);
  args.set_logging_steps(1);
  args.set_save_strategy(proto::TrainingArguments::NO);
  args.set_disable_tqdm(true);
  args.mutable_accelerator_config()->set_non_blocking(true);
  args.mutable_local()->set_device("cuda:0");
  args.set_cuda_graphs(graphs);
  return args;
}

struct Trained {
  std::vector<double> losses, grad_norms;
  std::vector<torch::Tensor> params;
  Metrics metrics;
};

std::vector<double> Logged(const Trainer& trainer, const std::string& key) {
  std::vector<double> out;
  for (const Metrics& record : trainer.state().log_history) {
    if (record.count(key) && record.count("step") && !record.count("train_loss")) {
      out.push_back(record.at(key));
    }
  }
  return out;
}

template <typename T = Trainer>
Trained Train(const proto::TrainingArguments& args,
              std::shared_ptr<TrainerCallback> callback = nullptr) {
  auto model = TinyDecoder(7);
  T trainer(args, model, FixedLengthTokens(64, 12, 3));
  if (callback != nullptr) trainer.AddCallback(callback);
  auto out = trainer.Train();
  EXPECT_TRUE(out.ok()) << out.status();
  Trained t;
  if (!out.ok()) return t;
  t.losses = Logged(trainer, "loss");
  t.grad_norms = Logged(trainer, "grad_norm");
  for (const torch::Tensor& p : Parameters(*model)) t.params.push_back(p.cpu());
  t.metrics = out->metrics;
  return t;
}

double Worst(const std::vector<double>& a, const std::vector<double>& b) {
  return testing::WorstRelative(a, b);
}

// 8 steps: the first (eager: it makes the optimizer's state, and the ranks' vote says no), 2
// eager warm-up steps after it, the captured step (run by its first replay), 4 replays. With
// cuda_graphs every step reads the learning rate from an fp32 device scalar where a run without
// passes a double, so the two agree to within that rounding (and attention's backward need not
// be deterministic), not bit for bit.
TEST(CudaGraphTest, ReplayedStepsTrainAsEagerStepsDo) {
  if (!HaveCuda()) GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
  const Trained eager = Train(GraphArgs("graph_off", false));
  const Trained graphs = Train(GraphArgs("graph_on", true));
  ASSERT_EQ(graphs.losses.size(), 8u);
  EXPECT_EQ(graphs.metrics.at("cuda_graph_captures"), 1);
  EXPECT_EQ(graphs.metrics.at("cuda_graph_replays"), 4);
  EXPECT_EQ(eager.metrics.count("cuda_graph_replays"), 0u);
  EXPECT_LT(Worst(graphs.losses, eager.losses), 1e-5);
  EXPECT_LT(Worst(graphs.grad_norms, eager.grad_norms), 1e-5);
  EXPECT_LT(MaxRelativeDifference(graphs.params, eager.params), 1e-4);
  auto untrained = TinyDecoder(7);
  EXPECT_GT(MaxRelativeDifference(graphs.params, Parameters(*untrained)), 1e-3) << "it trained";
}

// The DDP engine (one process, NCCL) captures its step with the bucket all-reduces in it, with
// bf16 working copies (hooks on the copies' accumulators) and without (hooks on the fp32
// parameters' own), and replays train as eager DDP steps do; find_unused_parameters keeps
// every step eager and says why.
proto::TrainingArguments DdpGraphArgs(const std::string& name, bool graphs,
                                      bool working_copies) {
  proto::TrainingArguments args = GraphArgs(name, graphs);
  args.mutable_ddp()->set_bf16_working_copies(working_copies);  // replaces `local`
  return args;
}

TEST(CudaGraphTest, ReplayedDdpStepsTrainAsEagerDdpStepsDo) {
  if (!HaveCuda()) GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
  for (bool copies : {true, false}) {
    const std::string tag = copies ? "ddp_copies" : "ddp_fp32";
    const Trained eager = Train(DdpGraphArgs(tag + "_off", false, copies));
    const Trained graphs = Train(DdpGraphArgs(tag + "_on", true, copies));
    ASSERT_EQ(graphs.losses.size(), 8u) << tag;
    EXPECT_EQ(graphs.metrics.at("cuda_graph_captures"), 1) << tag;
    EXPECT_EQ(graphs.metrics.at("cuda_graph_replays"), 4) << tag;
    EXPECT_LT(Worst(graphs.losses, eager.losses), 1e-5) << tag;
    EXPECT_LT(Worst(graphs.grad_norms, eager.grad_norms), 1e-5) << tag;
    EXPECT_LT(MaxRelativeDifference(graphs.params, eager.params), 1e-4) << tag;
    auto untrained = TinyDecoder(7);
    EXPECT_GT(MaxRelativeDifference(graphs.params, Parameters(*untrained)), 1e-3) << tag;
  }
  proto::TrainingArguments unused = DdpGraphArgs("ddp_unused", true, true);
  unused.mutable_ddp()->set_find_unused_parameters(true);
  const Trained eager_only = Train(unused);
  EXPECT_EQ(eager_only.metrics.at("cuda_graph_captures"), 0);
  EXPECT_EQ(eager_only.metrics.at("cuda_graph_replays"), 0);
  EXPECT_EQ(eager_only.losses.size(), 8u);
}

// A step that reads a device value on the host cannot be captured: the run says why, trains
// every step eagerly and ends where a run without cuda_graphs ends. Then a second run in the same
// process captures and replays its steps: the failed capture left the allocator in order.
class ReadsLossOnTheHost : public Trainer {
 public:
  using Trainer::Trainer;

 protected:
  absl::StatusOr<torch::Tensor> TrainingStep(const Batch& batch, int64_t num_items) override {
    CT_ASSIGN_OR_RETURN(torch::Tensor loss, Trainer::TrainingStep(batch, num_items));
    if (!std::isfinite(loss.item<double>())) return absl::InternalError("loss is not finite");
    return loss;
  }
};

TEST(CudaGraphTest, UncapturableStepFallsBackToEagerSteps) {
  if (!HaveCuda()) GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
  const Trained eager = Train<ReadsLossOnTheHost>(GraphArgs("fallback_off", false));
  const Trained graphs = Train<ReadsLossOnTheHost>(GraphArgs("fallback_on", true));
  EXPECT_EQ(graphs.metrics.at("cuda_graph_captures"), 0);
  EXPECT_EQ(graphs.metrics.at("cuda_graph_replays"), 0);
  ASSERT_EQ(graphs.losses.size(), 8u);
  EXPECT_LT(Worst(graphs.losses, eager.losses), 1e-5);
  EXPECT_LT(MaxRelativeDifference(graphs.params, eager.params), 1e-4);
  const Trained after = Train(GraphArgs("after_fallback", true));
  EXPECT_EQ(after.metrics.at("cuda_graph_captures"), 1);
  EXPECT_EQ(after.metrics.at("cuda_graph_replays"), 4);
  EXPECT_LT(Worst(after.losses, graphs.losses), 1e-5);
  // DDP: the failed capture holds the buckets' all-reduces; discarding it touches none of them.
  const Trained ddp_eager = Train(DdpGraphArgs("fallback_ddp_off", false, true));
  const Trained ddp = Train<ReadsLossOnTheHost>(DdpGraphArgs("fallback_ddp", true, true));
  EXPECT_EQ(ddp.metrics.at("cuda_graph_captures"), 0);
  ASSERT_EQ(ddp.losses.size(), 8u);
  EXPECT_LT(Worst(ddp.losses, ddp_eager.losses), 1e-5);
  EXPECT_LT(MaxRelativeDifference(ddp.params, ddp_eager.params), 1e-4);
}

#if defined(CPPTRAIN_HAS_CUDA)
// Turns c10's sync debug mode to "error" for steps from `from_step` on, between the start and
// the end of each step: a host wait for the device inside a step then fails the run.
class NoHostSyncInSteps : public TrainerCallback {
 public:
  explicit NoHostSyncInSteps(int64_t from_step) : from_step_(from_step) {}
  void OnStepBegin(const CallbackContext& c) override {
    if (c.state.global_step + 1 >= from_step_) {
      c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
      ++checked;
    }
  }
  void OnStepEnd(const CallbackContext&) override {
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  }
  int checked = 0;

 private:
  int64_t from_step_;
};
#endif

// From the second step on (the first makes the optimizer's state and the model's tables), an
// eager step, and a replayed one, queue their work without waiting for the device: token
// counting reads the host's copy of the batch and the clip coefficient stays on the device.
TEST(CudaGraphTest, StepsQueueWorkWithoutWaitingForTheDevice) {
  if (!HaveCuda()) GTEST_SKIP() << "needs a CUDA device and a CUDA LibTorch";
#if defined(CPPTRAIN_HAS_CUDA)
  for (bool graphs : {false, true}) {
    // With graphs: from the first replay (the capture empties the allocator's cache).
    auto check = std::make_shared<NoHostSyncInSteps>(graphs ? 4 : 2);
    const Trained t =
        Train(GraphArgs(graphs ? "nosync_graphs" : "nosync_eager", graphs), check);
    EXPECT_EQ(t.losses.size(), 8u) << "graphs " << graphs;
    EXPECT_EQ(check->checked, graphs ? 5 : 7);
  }
#endif
}

}  // namespace
}  // namespace cpptrain
