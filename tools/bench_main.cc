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
// --engine=zero runs ZeRO stage --zero_stage (1, 2 or 3; DeepSpeed's defaults: 500M-element
// buckets, stage 3 with stage3_param_persistence_threshold 100000, so a layer of a real model
// is its own group), --zero_offload puts the optimizer on the host; the JSON line names it
// "zero<stage>" ("zero<stage>_offload").
// --skip_collectives (ddp, fsdp1, fsdp2, zero) replaces the communicator with one that moves
// nothing (wrong results, right timing), so the difference to a normal run is the exposed
// communication.
//
// Verification (tools/bench_compare.py runs this and tools/bench_torch.py side by side): with
// --init_dir the model comes from that Hugging Face directory (written there first when it
// holds none) and every rank's token ids are written beside it, once per run shape, for
// bench_torch.py to train on. The JSON line carries first_loss and last_loss (the global loss
// of the first and the last optimizer step) and tokens_fingerprint.
#include <sys/resource.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "config/text_proto.h"
#include "engines/ddp/ddp_engine.h"
#include "engines/engine_factory.h"
#include "engines/fsdp/fsdp1_engine.h"
#include "engines/fsdp/fsdp2_engine.h"
#include "engines/zero/zero3_engine.h"
#include "engines/zero/zero_engine.h"
#include "models/configs.h"
#include "sharding/noop_communicator.h"
#include "sharding/rendezvous.h"
#include "tools/bench_init_dir.h"
#include "tools/kernel_profile.h"
#include "tools/repeated_flag.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, model, "qwen3-0.6b", "named decoder config (models/configs.cc)");
ABSL_FLAG(std::string, engine, "ddp", "local, ddp, fsdp1, fsdp2 or zero");
ABSL_FLAG(int, zero_stage, 2, "--engine=zero: zero.stage (1, 2 or 3)");
ABSL_FLAG(bool, zero_offload, false, "--engine=zero: zero.offload_optimizer_device=CPU");
ABSL_FLAG(int64_t, seq_len, 2048, "tokens per sample");
ABSL_FLAG(int64_t, micro_batch, 4, "samples per micro-batch per GPU");
ABSL_FLAG(int64_t, grad_accum, 1, "micro-batches per optimizer step");
ABSL_FLAG(int64_t, steps, 20, "timed optimizer steps");
ABSL_FLAG(int64_t, warmup, 5, "untimed optimizer steps first");
ABSL_FLAG(bool, bf16, true, "bf16 autocast (parameters and reductions stay fp32)");
ABSL_FLAG(bool, activation_checkpointing, false, "recompute each layer in backward");
ABSL_FLAG(bool, skip_collectives, false, "communicate nothing (measures exposed communication)");
ABSL_FLAG(double, peak_tflops, 790.0, "peak bf16 TFLOP/s of one GPU, for MFU (H200: 790)");
ABSL_FLAG(bool, use_cpu, false, "run on the CPU even where CUDA is available (tests)");
ABSL_FLAG(std::string, init_dir, "",
          "Hugging Face model directory to start from (written there first when it holds none), "
          "and where each rank's token ids go for tools/bench_torch.py");
ABSL_FLAG(double, learning_rate, 1e-4, "AdamW learning rate (constant)");
ABSL_FLAG(bool, cuda_graphs, false,
          "TrainingArguments.cuda_graphs: replay the step as a CUDA graph once its shapes settle "
          "(the warm-up must cover the two eager steps and the captured one)");
ABSL_FLAG(bool, fused_kernels, true,
          "the model's fused kernels (TrainingArguments.fused_kernels; false: the eager path)");
ABSL_FLAG(int64_t, profile_steps, 0,
          "profile the last N timed steps and print device time per kernel family (CUDA; the "
          "profiled steps run slower, so the JSON line says profiled)");
ABSL_FLAG(double, weight_decay, 0.0,
          "AdamW weight decay of the matrices (TrainingArguments' default; bench_torch.py's too)");

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

// Profiles the last `steps` optimizer steps (the device drained at both ends) and prints the
// table to stderr on rank 0.
class ProfileWindow : public TrainerCallback {
 public:
  ProfileWindow(int64_t steps, c10::Device device, int rank)
      : steps_(steps), device_(device), rank_(rank) {}
  void OnStepEnd(const CallbackContext& c) override {
    if (c.state.global_step == c.state.max_steps - steps_) {
      SynchronizeDevice(device_);
      profile_.Start();
    }
    if (c.state.global_step == c.state.max_steps) {
      SynchronizeDevice(device_);
      const std::string table = profile_.StopAndFormat(steps_);
      if (rank_ == 0) std::fprintf(stderr, "%s", table.c_str());
    }
  }

 private:
  int64_t steps_;
  c10::Device device_;
  int rank_;
  KernelProfile profile_;
};

// Keeps what the verification needs without a host sync in the timed steps: this rank's share
// of the first and the last step's loss (device scalars) and every micro-batch's token ids (as
// the loader gave them), for replayed steps (--cuda_graphs) too.
class BenchTrainer : public Trainer {
 public:
  using Trainer::Trainer;

  // Undefined before the step ran.
  const torch::Tensor& first_loss() const { return first_loss_; }
  const torch::Tensor& last_loss() const { return last_loss_; }
  // [steps, grad_accum, micro_batch, seq_len] on the CPU.
  torch::Tensor TokenIds() const {
    const int64_t accum = args().gradient_accumulation_steps();
    at::Tensor ids = torch::stack(inputs_).to(torch::kCPU);
    return ids.view({ids.size(0) / accum, accum, ids.size(1), ids.size(2)});
  }

 protected:
  void StepFinished(const std::vector<Batch>& micro_batches,
                    const torch::Tensor& step_loss) override {
    const int64_t step = state().global_step;  // optimizer steps finished, this one included
    if (step == 1) first_loss_ = step_loss;
    if (step == state().max_steps) last_loss_ = step_loss;
    for (const Batch& batch : micro_batches) inputs_.push_back(batch.inputs);
  }

 private:
  torch::Tensor first_loss_, last_loss_;
  std::vector<torch::Tensor> inputs_;
};

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const proto::TrainingArguments& args) {
  if (!absl::GetFlag(FLAGS_skip_collectives)) return CreateEngine(args);
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  CT_ASSIGN_OR_RETURN(const c10::Device device,
                      DataParallelDevice(env, absl::GetFlag(FLAGS_use_cpu)));
  auto noop = std::make_shared<NoopCommunicator>(env.rank, env.world_size);
  if (args.has_zero() && args.zero().stage() == 3) {
    CT_ASSIGN_OR_RETURN(auto engine, Zero3Engine::Create(args.zero(), MixedPrecisionFromArgs(args),
                                                         device, ShardMesh{noop, nullptr}));
    return std::unique_ptr<Engine>(std::move(engine));
  }
  if (args.has_zero()) {
    CT_ASSIGN_OR_RETURN(
        auto engine, ZeroEngine::Create(args.zero(), MixedPrecisionFromArgs(args), device, noop));
    return std::unique_ptr<Engine>(std::move(engine));
  }
  if (args.has_fsdp() && args.fsdp().version() == 1) {
    CT_ASSIGN_OR_RETURN(auto engine, Fsdp1Engine::Create(args.fsdp(), MixedPrecisionFromArgs(args),
                                                         device, ShardMesh{noop, nullptr}));
    return std::unique_ptr<Engine>(std::move(engine));
  }
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

// The JSON line's engine: the flag, or zero<stage>[_offload].
std::string EngineLabel(const proto::TrainingArguments& args) {
  if (!args.has_zero()) return absl::GetFlag(FLAGS_engine);
  return absl::StrCat(
      "zero", args.zero().stage(),
      args.zero().offload_optimizer_device() == proto::ZeroConfig::CPU ? "_offload" : "");
}

absl::StatusOr<proto::TrainingArguments> BenchArgs(int rank,
                                                   const std::vector<std::string>& overrides) {
  const int64_t micro = absl::GetFlag(FLAGS_micro_batch);
  const int64_t accum = absl::GetFlag(FLAGS_grad_accum);
  const int64_t steps = absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps);
  proto::TrainingArguments args;
  args.set_output_dir(absl::StrCat("/tmp/cpptrain_bench_rank", rank));
  args.set_per_device_train_batch_size(static_cast<int32_t>(micro));
  args.set_gradient_accumulation_steps(static_cast<int32_t>(accum));
  args.set_max_steps(steps);
  args.set_learning_rate(absl::GetFlag(FLAGS_learning_rate));
  args.set_weight_decay(absl::GetFlag(FLAGS_weight_decay));
  args.set_lr_scheduler_type(proto::TrainingArguments::CONSTANT);
  args.set_logging_steps(static_cast<double>(steps));
  args.set_save_strategy(proto::TrainingArguments::NO);
  args.set_bf16(absl::GetFlag(FLAGS_bf16));
  args.set_use_cpu(absl::GetFlag(FLAGS_use_cpu));
  args.set_gradient_checkpointing(absl::GetFlag(FLAGS_activation_checkpointing));
  args.set_fused_kernels(absl::GetFlag(FLAGS_fused_kernels));
  args.set_cuda_graphs(absl::GetFlag(FLAGS_cuda_graphs));
  args.set_disable_tqdm(true);
  args.set_dataloader_num_workers(2);
  const std::string engine_name = absl::GetFlag(FLAGS_engine);
  if (engine_name == "ddp") {
    args.mutable_ddp();
  } else if (engine_name == "local") {
    args.mutable_local();
  } else if (engine_name == "fsdp2") {
    args.mutable_fsdp()->set_version(2);
  } else if (engine_name == "fsdp1") {
    // PyTorch FSDP1's settings in tools/bench_torch.py: FULL_SHARD, a flat parameter per layer,
    // BACKWARD_PRE; with --bf16, bf16 parameters and fp32 reduction.
    args.mutable_fsdp()->set_version(1);
    args.mutable_fsdp()->set_sharding_strategy(proto::FsdpConfig::FULL_SHARD);
  } else if (engine_name == "zero") {
    // DeepSpeed's zero_optimization defaults otherwise (bench_torch.py's DeepSpeed runs too).
    args.mutable_zero()->set_stage(absl::GetFlag(FLAGS_zero_stage));
    if (absl::GetFlag(FLAGS_zero_offload)) {
      args.mutable_zero()->set_offload_optimizer_device(proto::ZeroConfig::CPU);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "--engine=", engine_name, " is unknown: use local, ddp, fsdp1, fsdp2 or zero"));
  }
  if (absl::GetFlag(FLAGS_skip_collectives) && args.has_local()) {
    return absl::InvalidArgumentError(
        "--skip_collectives measures the exposed communication of --engine=ddp, fsdp1, fsdp2 or "
        "zero; "
        "--engine=local communicates nothing: drop the flag");
  }
  CT_RETURN_IF_ERROR(ApplyOverrides(overrides, &args));
  return args;
}

// The global losses of the first and last step and the tokens fingerprint, summed over ranks
// (after the run: reading the device tensors here costs the timed steps nothing).
absl::StatusOr<at::Tensor> VerificationFigures(BenchTrainer& trainer, const std::string& init_dir,
                                               int64_t seq) {
  Engine& engine = *trainer.engine();
  const at::Tensor ids = trainer.TokenIds();
  if (!init_dir.empty()) {
    const BenchTokensShape shape{engine.world_size(), ids.size(1), ids.size(2), seq, ids.size(0)};
    CT_RETURN_IF_ERROR(
        WriteBenchTokensIfAbsent(BenchTokensPath(init_dir, shape, engine.rank()), ids));
  }
  const at::Tensor local =
      torch::tensor({trainer.first_loss().item<double>(), trainer.last_loss().item<double>(),
                     static_cast<double>(BenchTokensFingerprint(ids, engine.rank()))},
                    torch::kFloat64);
  if (absl::GetFlag(FLAGS_skip_collectives)) return local;
  return engine.AllReduceSum(local);
}

// `value` with full precision, or null when it is not finite (JSON has no NaN).
std::string JsonNumber(double value) {
  return std::isfinite(value) ? absl::StrFormat("%.17g", value) : "null";
}

// This process's peak resident set (getrusage; Linux reports KiB), as bench_torch.py's
// host_peak_gib: host memory matters once the optimizer is offloaded.
int64_t HostPeakBytes() {
  struct rusage usage;
  return getrusage(RUSAGE_SELF, &usage) == 0 ? int64_t{usage.ru_maxrss} * 1024 : 0;
}

absl::Status Run(const std::vector<std::string>& overrides) {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  InitLogging("bench", env.rank);
  const std::string model_name = absl::GetFlag(FLAGS_model);
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, NamedDecoderConfig(model_name));
  const int64_t seq = absl::GetFlag(FLAGS_seq_len);
  const int64_t micro = absl::GetFlag(FLAGS_micro_batch);
  const int64_t accum = absl::GetFlag(FLAGS_grad_accum);
  const int64_t warmup = absl::GetFlag(FLAGS_warmup);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  const std::string init_dir = absl::GetFlag(FLAGS_init_dir);
  CT_ASSIGN_OR_RETURN(proto::TrainingArguments args, BenchArgs(env.rank, overrides));

  CT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeEngine(args));
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
                      BenchModel(init_dir, config, model_name, *engine));
  const c10::Device device = engine->device();
  const int world = engine->world_size();
  auto data = std::make_shared<RandomTokens>((warmup + steps) * accum * micro * world, seq,
                                             config.vocab_size());
  BenchTrainer trainer(args, model, data, nullptr, std::move(engine));
  auto timer = std::make_shared<StepTimer>(warmup, device);
  trainer.AddCallback(timer);
  const int64_t profile_steps = std::min(absl::GetFlag(FLAGS_profile_steps), steps);
  if (profile_steps > 0) {
    trainer.AddCallback(std::make_shared<ProfileWindow>(profile_steps, device, env.rank));
  }
  CT_ASSIGN_OR_RETURN(TrainOutput trained, trainer.Train());
  const auto replays = trained.metrics.find("cuda_graph_replays");
  const double graph_replays = replays == trained.metrics.end() ? 0 : replays->second;

  // The slowest rank's time and the largest peak memory count.
  at::Tensor figures =
      torch::tensor({timer->seconds(), static_cast<double>(PeakAllocatedBytes(device)),
                     static_cast<double>(HostPeakBytes())},
                    torch::kFloat64);
  // Without collectives every rank reports its own figures (the ranks do the same work).
  at::Tensor gathered = figures.view({1, 3});
  if (!absl::GetFlag(FLAGS_skip_collectives)) {
    CT_ASSIGN_OR_RETURN(gathered, trainer.engine()->AllGather(figures));
    gathered = gathered.view({world, 3});
  }
  const double seconds = gathered.select(1, 0).max().item<double>();
  const double peak_bytes = gathered.select(1, 1).max().item<double>();
  const double host_peak_bytes = gathered.select(1, 2).max().item<double>();
  CT_ASSIGN_OR_RETURN(at::Tensor verification, VerificationFigures(trainer, init_dir, seq));
  const double tokens = static_cast<double>(steps * accum * micro * seq * world);
  const double tokens_per_s = tokens / seconds;
  const double flops_per_token = DecoderTrainingFlopsPerToken(config, seq);
  const double tflops_per_gpu = tokens_per_s / world * flops_per_token / 1e12;
  // Peak memory is known on CUDA only (PeakAllocatedBytes is -1 elsewhere).
  const std::string peak_gib =
      peak_bytes < 0 ? "null" : absl::StrFormat("%.2f", peak_bytes / (1 << 30));
  if (env.rank == 0) {
    std::printf(
        "{\"model\":\"%s\",\"engine\":\"%s\",\"gpus\":%d,\"device\":\"%s\",\"seq_len\":%lld,"
        "\"micro_batch\":%lld,\"grad_accum\":%lld,\"steps\":%lld,\"warmup\":%lld,\"bf16\":%s,"
        "\"activation_checkpointing\":%s,\"fused_kernels\":%s,\"cuda_graphs\":%s,"
        "\"graph_replays\":%.0f,\"profiled_steps\":%lld,"
        "\"skip_collectives\":%s,\"learning_rate\":%.17g,"
        "\"weight_decay\":%.17g,\"init_dir\":\"%s\",\"seconds\":%.3f,"
        "\"tokens_per_s\":%.1f,\"tokens_per_s_per_gpu\":%.1f,\"flops_per_token\":%.4g,"
        "\"tflops_per_gpu\":%.1f,\"mfu\":%.4f,\"peak_memory_gib\":%s,\"host_peak_gib\":%.2f,"
        "\"first_loss\":%s,"
        "\"last_loss\":%s,\"tokens_fingerprint\":%.0f,"
        "\"formula\":\"6*matmul_params + 12*layers*heads*head_dim*seq per token\"}\n",
        model_name.c_str(), EngineLabel(args).c_str(), world, device.str().c_str(),
        static_cast<long long>(seq), static_cast<long long>(micro), static_cast<long long>(accum),
        static_cast<long long>(steps), static_cast<long long>(warmup),
        args.bf16() ? "true" : "false",
        absl::GetFlag(FLAGS_activation_checkpointing) ? "true" : "false",
        args.fused_kernels() ? "true" : "false", args.cuda_graphs() ? "true" : "false",
        graph_replays, static_cast<long long>(profile_steps),
        absl::GetFlag(FLAGS_skip_collectives) ? "true" : "false", args.learning_rate(),
        args.weight_decay(), init_dir.c_str(), seconds, tokens_per_s, tokens_per_s / world,
        flops_per_token, tflops_per_gpu, tflops_per_gpu / absl::GetFlag(FLAGS_peak_tflops),
        peak_gib.c_str(), host_peak_bytes / (1 << 30),
        JsonNumber(verification[0].item<double>()).c_str(),
        JsonNumber(verification[1].item<double>()).c_str(), verification[2].item<double>());
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
