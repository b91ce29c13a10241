// //tools:bench: trains a reference model shape on random tokens with a chosen engine and
// prints one JSON line (rank 0) with throughput, FLOP rate, MFU and peak memory. Run one
// process per GPU under the launcher:
//
//   bazel-bin/tools/launch --nproc_per_node=4 bazel-bin/tools/bench --engine=ddp
//
// Figures (warm-up steps excluded; the slowest rank's time counts):
//   tokens/s          = steps * micro_batch * grad_accum * seq_len * world / seconds
//   TFLOP/s per GPU   = tokens/s per GPU * flops_per_token / 1e12, where
//   flops_per_token   = 6 * matmul parameters (LM head included)
//                     + 12 * layers * heads * head_dim * seq_len
//   MFU               = TFLOP/s per GPU / --peak_tflops
// --skip_collectives (ddp, fsdp2) replaces the communicator with one that moves nothing
// (wrong results, right timing), so the difference to a normal run is the exposed
// communication.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>

#include <torch/torch.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "config/text_proto.h"
#include "engines/ddp/ddp_engine.h"
#include "engines/engine_factory.h"
#include "engines/fsdp/fsdp2_engine.h"
#include "models/configs.h"
#include "sharding/noop_communicator.h"
#include "sharding/rendezvous.h"
#include "tools/repeated_flag.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, model, "qwen3-0.6b", "named decoder config (models/configs.cc)");
ABSL_FLAG(std::string, engine, "ddp", "local, ddp or fsdp2");
ABSL_FLAG(int64_t, seq_len, 2048, "tokens per sample");
ABSL_FLAG(int64_t, micro_batch, 4, "samples per micro-batch per GPU");
ABSL_FLAG(int64_t, grad_accum, 1, "micro-batches per optimizer step");
ABSL_FLAG(int64_t, steps, 20, "timed optimizer steps");
ABSL_FLAG(int64_t, warmup, 5, "untimed optimizer steps first");
ABSL_FLAG(bool, bf16, true, "bf16 autocast (parameters and reductions stay fp32)");
ABSL_FLAG(bool, activation_checkpointing, false, "recompute each layer in backward");
ABSL_FLAG(bool, skip_collectives, false, "communicate nothing (measures exposed communication)");
ABSL_FLAG(double, peak_tflops, 790.0, "peak bf16 TFLOP/s of one GPU, for MFU (H200: 790)");

namespace cpptrain {
namespace {

// Random tokens, generated from the index on demand (no memory for the whole set).
class RandomTokens : public Dataset {
 public:
  RandomTokens(int64_t size, int64_t seq_len, int64_t vocab)
      : size_(size), seq_len_(seq_len), vocab_(vocab) {}
  int64_t size() const override { return size_; }
  Example Get(int64_t index) const override {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(index));
    return {torch::randint(vocab_, {seq_len_}, generator, torch::kLong), at::Tensor()};
  }

 private:
  int64_t size_, seq_len_, vocab_;
};

// Times the steps after warm-up, with the device drained at both ends.
class StepTimer : public TrainerCallback {
 public:
  StepTimer(int64_t warmup, c10::Device device) : warmup_(warmup), device_(device) {}
  void OnStepEnd(const CallbackContext& c) override {
    if (c.state.global_step == warmup_) {
      SynchronizeDevice(device_);
      start_ = std::chrono::steady_clock::now();
    }
    if (c.state.global_step == c.state.max_steps) {
      SynchronizeDevice(device_);
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
  }
  double seconds() const { return seconds_; }

 private:
  int64_t warmup_;
  c10::Device device_;
  std::chrono::steady_clock::time_point start_;
  double seconds_ = 0;
};

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const proto::TrainingArguments& args) {
  if (!absl::GetFlag(FLAGS_skip_collectives)) return CreateEngine(args);
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  CT_ASSIGN_OR_RETURN(const c10::Device device, DataParallelDevice(env));
  auto noop = std::make_shared<NoopCommunicator>(env.rank, env.world_size);
  if (args.has_fsdp()) {
    // Every rank computes on its own chunk in the other ranks' slots: the same shapes and
    // kernels as a real run, with no bytes moved.
    CT_ASSIGN_OR_RETURN(auto engine, Fsdp2Engine::Create(args.fsdp(), MixedPrecisionFromArgs(args),
                                                         device, ShardMesh{noop, nullptr}));
    return std::unique_ptr<Engine>(std::move(engine));
  }
  CT_ASSIGN_OR_RETURN(auto engine,
                      DdpEngine::Create(args.ddp(), MixedPrecisionFromArgs(args), device, noop));
  return std::unique_ptr<Engine>(std::move(engine));
}

absl::Status Run(const std::vector<std::string>& overrides) {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  InitLogging("bench", env.rank);
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, NamedDecoderConfig(absl::GetFlag(FLAGS_model)));
  const int64_t seq = absl::GetFlag(FLAGS_seq_len);
  const int64_t micro = absl::GetFlag(FLAGS_micro_batch);
  const int64_t accum = absl::GetFlag(FLAGS_grad_accum);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  const int64_t steps = absl::GetFlag(FLAGS_steps);

  proto::TrainingArguments args;
  args.set_output_dir(absl::StrCat("/tmp/cpptrain_bench_rank", env.rank));
  args.set_per_device_train_batch_size(static_cast<int32_t>(micro));
  args.set_gradient_accumulation_steps(static_cast<int32_t>(accum));
  args.set_max_steps(warmup + steps);
  args.set_learning_rate(1e-4);
  args.set_lr_scheduler_type(proto::TrainingArguments::CONSTANT);
  args.set_logging_steps(static_cast<double>(warmup + steps));
  args.set_save_strategy(proto::TrainingArguments::NO);
  args.set_bf16(absl::GetFlag(FLAGS_bf16));
  args.set_gradient_checkpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  args.set_disable_tqdm(true);
  args.set_dataloader_num_workers(2);
  const std::string engine_name = absl::GetFlag(FLAGS_engine);
  if (engine_name == "ddp") {
    args.mutable_ddp();
  } else if (engine_name == "local") {
    args.mutable_local();
  } else if (engine_name == "fsdp2") {
    args.mutable_fsdp()->set_version(2);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("--engine=", engine_name,
                                                   " is not built yet: use local, ddp or fsdp2"));
  }
  if (absl::GetFlag(FLAGS_skip_collectives) && args.has_local()) {
    return absl::InvalidArgumentError(
        "--skip_collectives measures the exposed communication of --engine=ddp or fsdp2; "
        "--engine=local communicates nothing: drop the flag");
  }
  CT_RETURN_IF_ERROR(ApplyOverrides(overrides, &args));

  torch::manual_seed(0);
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeEngine(args));
  const c10::Device device = engine->device();
  const int world = engine->world_size();
  auto data = std::make_shared<RandomTokens>((warmup + steps) * accum * micro * world, seq,
                                             config.vocab_size());
  Trainer trainer(args, model, data, nullptr, std::move(engine));
  auto timer = std::make_shared<StepTimer>(warmup, device);
  trainer.AddCallback(timer);
  CT_ASSIGN_OR_RETURN(TrainOutput out, trainer.Train());

  // The slowest rank's time and the largest peak memory count.
  at::Tensor figures = torch::tensor(
      {timer->seconds(), static_cast<double>(PeakAllocatedBytes(device))}, torch::kFloat64);
  // Without collectives every rank reports its own figures (the ranks do the same work).
  at::Tensor gathered = figures.view({1, 2});
  if (!absl::GetFlag(FLAGS_skip_collectives)) {
    CT_ASSIGN_OR_RETURN(gathered, trainer.engine()->AllGather(figures));
    gathered = gathered.view({world, 2});
  }
  const double seconds = gathered.select(1, 0).max().item<double>();
  const double peak_bytes = gathered.select(1, 1).max().item<double>();
  double last_loss = 0;
  for (const Metrics& m : trainer.state().log_history) {
    if (m.count("loss")) last_loss = m.at("loss");
  }
  const double tokens = static_cast<double>(steps * accum * micro * seq * world);
  const double tokens_per_s = tokens / seconds;
  const double flops_per_token = DecoderTrainingFlopsPerToken(config, seq);
  const double tflops_per_gpu = tokens_per_s / world * flops_per_token / 1e12;
  if (env.rank == 0) {
    std::printf(
        "{\"model\":\"%s\",\"engine\":\"%s\",\"gpus\":%d,\"device\":\"%s\",\"seq_len\":%lld,"
        "\"micro_batch\":%lld,\"grad_accum\":%lld,\"steps\":%lld,\"bf16\":%s,"
        "\"activation_checkpointing\":%s,\"skip_collectives\":%s,\"seconds\":%.3f,"
        "\"tokens_per_s\":%.1f,\"tokens_per_s_per_gpu\":%.1f,\"flops_per_token\":%.4g,"
        "\"tflops_per_gpu\":%.1f,\"mfu\":%.4f,\"peak_memory_gib\":%.2f,\"last_loss\":%.4f,"
        "\"formula\":\"6*matmul_params + 12*layers*heads*head_dim*seq per token\"}\n",
        absl::GetFlag(FLAGS_model).c_str(), engine_name.c_str(), world, device.str().c_str(),
        static_cast<long long>(seq), static_cast<long long>(micro), static_cast<long long>(accum),
        static_cast<long long>(steps), args.bf16() ? "true" : "false",
        absl::GetFlag(FLAGS_activation_checkpointing) ? "true" : "false",
        absl::GetFlag(FLAGS_skip_collectives) ? "true" : "false", seconds, tokens_per_s,
        tokens_per_s / world, flops_per_token, tflops_per_gpu,
        tflops_per_gpu / absl::GetFlag(FLAGS_peak_tflops), peak_bytes / (1 << 30), last_loss);
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  std::vector<std::string> overrides = cpptrain::TakeRepeatedFlag("set", argc, argv);
  absl::ParseCommandLine(argc, argv);
  absl::Status status = cpptrain::Run(overrides);
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return 1;
  }
  return 0;
}
