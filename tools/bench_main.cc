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
//                     + 12 * layers * heads * head_dim * seq_len (attention's full square)
//   ..._causal        = the same with 6 * layers * heads * head_dim * seq_len (its causal half)
//   mfu_full_measured = TFLOP/s per GPU / --peak_tflops (a measured peak: tools/matmul_peak.py)
//   mfu_causal_spec   = causal TFLOP/s per GPU / --spec_tflops (the datasheet's: 989)
//   peak_memory_gib   = the largest rank's peak allocated device memory (CUDA), and
//   peak_by_phase_gib   that peak per phase (tools/phase_peaks.h; setup, forward with the loss,
//                       backward, step; null under --cuda_graphs), as bench_torch.py's
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
// bench_torch.py to train on. The tokens form a Markov chain the model learns within a few steps
// (--tokens=markov, tools/bench_verification.h), so the loss falls and a side whose optimizer did
// nothing ends elsewhere. The JSON line carries first_loss and last_loss (the global loss of the
// first and the last optimizer step), first_grad_norm (the first step's global gradient norm
// before clipping), param_checksum (the sum of squares of the trained parameters, fp64) and
// tokens_fingerprint. --inject_fault breaks one of those on purpose, for testing the check.
#include <sys/resource.h>
#include <torch/types.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_compat.h"
#include "base/working_directory.h"
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
#include "tools/bench_verification.h"
#include "tools/kernel_profile.h"
#include "tools/phase_peaks.h"
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
ABSL_FLAG(double, peak_tflops, 790.0,
          "measured dense bf16 TFLOP/s of one GPU (tools/matmul_peak.py), for mfu_full_measured");
ABSL_FLAG(double, spec_tflops, 989.0,
          "the GPU's specified dense bf16 TFLOP/s (H100/H200 SXM: 989), for mfu_causal_spec");
ABSL_FLAG(std::string, tokens, "markov",
          "markov: a token stream the model learns within a few steps (the loss falls, so the "
          "comparison's checks can fail); random: uniform ids (the loss stays about ln(vocab))");
ABSL_FLAG(std::string, inject_fault, "none",
          "for testing tools/bench_compare.py: noop_optimizer (learning rate 0), scaled_gradient "
          "(the loss's value, its gradient 1.002x), other_tokens (every id + 1 mod vocab, the "
          "fingerprint of the original ones)");
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
ABSL_FLAG(int64_t, loss_chunk_rows, 0,
          "rows per chunk of the fused LM head + loss (0: 4096 rows, at most 2^30 logits); larger "
          "chunks move the fp32 head gradient fewer times and hold more logits");
ABSL_FLAG(bool, recompute_mlp_product, false,
          "each MLP keeps gate and up but not act(gate) * up for the backward, which writes it "
          "again (DecoderLM::SetRecomputeMlpProduct; fused kernels only): one [tokens, "
          "intermediate] tensor less a layer, one more write of it in the backward");
ABSL_FLAG(int64_t, profile_steps, 0,
          "profile the last N timed steps and print device time per kernel family (CUDA; the "
          "profiled steps run slower, so the JSON line says profiled)");
ABSL_FLAG(double, weight_decay, 0.0,
          "AdamW weight decay of the matrices (TrainingArguments' default; bench_torch.py's too)");

namespace cpptrain {
namespace {

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
// of the first and the last step's loss and the first step's gradient norm (device scalars) and
// every micro-batch's token ids (as the loader gave them), for replayed steps (--cuda_graphs)
// too. With --inject_fault, trains wrongly on purpose (FaultyLoss).
class BenchTrainer : public Trainer {
 public:
  BenchTrainer(proto::TrainingArguments args, std::shared_ptr<TrainableModel> model,
               std::shared_ptr<const Dataset> data, std::unique_ptr<Engine> engine,
               std::string fault, int64_t vocab)
      : Trainer(std::move(args), std::move(model), std::move(data), nullptr, std::move(engine)),
        fault_(std::move(fault)),
        vocab_(vocab),
        peaks_([this] { return PeakAllocatedBytes(this->engine()->device()); },
               [this] { ResetPeakMemory(this->engine()->device()); }) {}

  // Undefined before the step ran.
  const torch::Tensor& first_loss() const { return first_loss_; }
  const torch::Tensor& last_loss() const { return last_loss_; }
  const torch::Tensor& first_grad_norm() const { return first_grad_norm_; }
  // Peak device memory by phase: setup (up to the first forward), forward (the loss included),
  // backward, step (the optimizer step and the host work up to the next forward). Replayed
  // CUDA graphs run no TrainingStep, so under cuda_graphs their steps count as "step".
  PhasePeaks& phase_peaks() { return peaks_; }
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
    if (step == 1) {
      first_loss_ = step_loss;
      if (last_grad_norm().defined()) first_grad_norm_ = last_grad_norm().detach().clone();
    }
    if (step == state().max_steps) last_loss_ = step_loss;
    for (const Batch& batch : micro_batches) inputs_.push_back(batch.inputs);
  }

  absl::StatusOr<torch::Tensor> TrainingStep(const Batch& batch,
                                             int64_t num_items_in_batch) override {
    peaks_.Begin("forward");
    absl::StatusOr<torch::Tensor> loss = Trainer::TrainingStep(batch, num_items_in_batch);
    peaks_.Begin("step");
    return loss;
  }

  torch::Tensor ComputeLoss(TrainableModel& model, const Batch& batch,
                            int64_t num_items_in_batch) override {
    torch::Tensor loss = FaultyLoss(model, batch, num_items_in_batch);
    peaks_.Begin("backward");
    return loss;
  }

 private:
  torch::Tensor FaultyLoss(TrainableModel& model, const Batch& batch,
                           int64_t num_items_in_batch) {
    if (fault_ == "other_tokens") {
      Batch other = batch;
      other.inputs = (batch.inputs + 1).remainder(vocab_);
      other.labels = torch::where(batch.labels >= 0, (batch.labels + 1).remainder(vocab_),
                                  batch.labels);
      return Trainer::ComputeLoss(model, other, num_items_in_batch);
    }
    const torch::Tensor loss = Trainer::ComputeLoss(model, batch, num_items_in_batch);
    if (fault_ == "scaled_gradient") return loss * 1.002 - (loss * 0.002).detach();
    return loss;
  }

  std::string fault_;
  int64_t vocab_;
  PhasePeaks peaks_;
  torch::Tensor first_loss_, last_loss_, first_grad_norm_;
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
  // One directory per job and rank: two benchmarks running at once (CTest runs tests in
  // parallel) would otherwise refuse each other's output_dir lock. MASTER_PORT differs per job.
  const char* port = std::getenv("MASTER_PORT");
  args.set_output_dir(absl::StrCat("/tmp/cpptrain_bench_", port != nullptr ? port : "0", "_rank",
                                   rank));
  args.set_per_device_train_batch_size(static_cast<int32_t>(micro));
  args.set_gradient_accumulation_steps(static_cast<int32_t>(accum));
  args.set_max_steps(steps);
  // The JSON line still says --learning_rate: a no-op optimizer that claims it trained.
  const bool noop = absl::GetFlag(FLAGS_inject_fault) == "noop_optimizer";
  args.set_learning_rate(noop ? 0.0 : absl::GetFlag(FLAGS_learning_rate));
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

// What tools/bench_compare.py checks, global and the same on every rank (after the run: reading
// the device tensors here costs the timed steps nothing).
struct Verification {
  double first_loss = 0, last_loss = 0, first_grad_norm = 0, param_checksum = 0;
  double tokens_fingerprint = 0;
};

absl::StatusOr<Verification> VerificationFigures(BenchTrainer& trainer,
                                                 const std::string& init_dir, int64_t seq) {
  Engine& engine = *trainer.engine();
  const at::Tensor ids = trainer.TokenIds();
  if (!init_dir.empty()) {
    const BenchTokensShape shape{absl::GetFlag(FLAGS_tokens), engine.world_size(), ids.size(1),
                                 ids.size(2),                 seq,                 ids.size(0)};
    CT_RETURN_IF_ERROR(
        WriteBenchTokensIfAbsent(BenchTokensPath(init_dir, shape, engine.rank()), ids));
  }
  // Each rank's share of the losses and of the fingerprint, summed; the norm is global already.
  at::Tensor sums =
      torch::tensor({trainer.first_loss().item<double>(), trainer.last_loss().item<double>(),
                     static_cast<double>(BenchTokensFingerprint(ids, engine.rank()))},
                    torch::kFloat64);
  if (!absl::GetFlag(FLAGS_skip_collectives)) {
    CT_ASSIGN_OR_RETURN(sums, engine.AllReduceSum(sums));
  }
  Verification out;
  out.first_loss = sums[0].item<double>();
  out.last_loss = sums[1].item<double>();
  out.tokens_fingerprint = sums[2].item<double>();
  out.first_grad_norm = trainer.first_grad_norm().defined()
                            ? trainer.first_grad_norm().item<double>()
                            : std::nan("");
  CT_ASSIGN_OR_RETURN(out.param_checksum, ParameterSquareSum(trainer.model(), engine));
  return out;
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

// One JSON object, its fields in the order added.
class JsonLine {
 public:
  JsonLine& Raw(const std::string& key, const std::string& value) {
    absl::StrAppend(&text_, text_.empty() ? "{" : ",", "\"", key, "\":", value);
    return *this;
  }
  JsonLine& String(const std::string& key, const std::string& value) {
    return Raw(key, absl::StrCat("\"", value, "\""));
  }
  JsonLine& Bool(const std::string& key, bool value) { return Raw(key, value ? "true" : "false"); }
  JsonLine& Int(const std::string& key, int64_t value) { return Raw(key, absl::StrCat(value)); }
  JsonLine& Number(const std::string& key, double value) { return Raw(key, JsonNumber(value)); }
  JsonLine& Fixed(const std::string& key, double value, int digits) {
    return Raw(key, absl::StrFormat("%.*f", digits, value));
  }
  std::string Finish() const { return text_ + "}"; }

 private:
  std::string text_;
};

// The phases of BenchTrainer::phase_peaks, in the JSON line's order.
constexpr const char* kPhases[] = {"setup", "forward", "backward", "step"};
constexpr int kNumPhases = 4;

// The measured figures of a run: the slowest rank's time, the largest peaks (the run's, and
// each phase's over the ranks; -1 where unknown).
struct Figures {
  double seconds = 0, peak_bytes = 0, host_peak_bytes = 0, graph_replays = 0;
  double phase_peak_bytes[kNumPhases] = {-1, -1, -1, -1};
};

absl::StatusOr<Figures> GatherFigures(BenchTrainer& trainer, const StepTimer& timer,
                                      const TrainOutput& trained) {
  Engine& engine = *trainer.engine();
  PhasePeaks& peaks = trainer.phase_peaks();
  peaks.Finish();
  std::vector<double> values = {timer.seconds(), static_cast<double>(peaks.overall()),
                                static_cast<double>(HostPeakBytes())};
  for (const char* phase : kPhases) {
    const auto it = peaks.by_phase().find(phase);
    values.push_back(it == peaks.by_phase().end() ? -1.0 : static_cast<double>(it->second));
  }
  const int64_t n = static_cast<int64_t>(values.size());
  at::Tensor figures = torch::tensor(values, torch::kFloat64);
  // Without collectives every rank reports its own figures (the ranks do the same work).
  at::Tensor gathered = figures.view({1, n});
  if (!absl::GetFlag(FLAGS_skip_collectives)) {
    CT_ASSIGN_OR_RETURN(gathered, engine.AllGather(figures));
    gathered = gathered.view({engine.world_size(), n});
  }
  Figures out;
  out.seconds = gathered.select(1, 0).max().item<double>();
  out.peak_bytes = gathered.select(1, 1).max().item<double>();
  out.host_peak_bytes = gathered.select(1, 2).max().item<double>();
  for (int i = 0; i < kNumPhases; ++i) {
    out.phase_peak_bytes[i] = gathered.select(1, 3 + i).max().item<double>();
  }
  const auto replays = trained.metrics.find("cuda_graph_replays");
  out.graph_replays = replays == trained.metrics.end() ? 0 : replays->second;
  return out;
}

// Under --cuda_graphs every timed step must be a replay: a capture (an eager run of the step
// plus the capture itself) inside the timed window would be charged to a few steps' average,
// and PyTorch's reduce-overhead records its graphs in the warm-up.
absl::Status CheckTimedStepsReplayed(const Figures& f) {
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (!absl::GetFlag(FLAGS_cuda_graphs) || f.graph_replays >= static_cast<double>(steps)) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "--cuda_graphs: ", f.graph_replays, " replays over --warmup=", absl::GetFlag(FLAGS_warmup),
      " and --steps=", steps, " steps, so the timed steps include the capture or eager steps ",
      "(the step is captured after 2 eager steps all ranks agree on, and the first step has no "
      "vote yet): give --warmup of at least 4 (the log's cuda_graphs lines say why when no "
      "step was captured)"));
}

// {"setup": GiB, "forward": ..., "backward": ..., "step": ...}; null without the peaks (not
// CUDA), or under cuda_graphs, where the replayed steps' forward and backward count as "step".
std::string PhasePeaksJson(const Figures& f, bool cuda_graphs) {
  if (f.peak_bytes < 0 || cuda_graphs) return "null";
  std::string out;
  for (int i = 0; i < kNumPhases; ++i) {
    absl::StrAppend(&out, i == 0 ? "{" : ",", "\"", kPhases[i], "\":",
                    f.phase_peak_bytes[i] < 0
                        ? "null"
                        : absl::StrFormat("%.2f", f.phase_peak_bytes[i] / (1 << 30)));
  }
  return out + "}";
}

// The run's JSON line (printed by rank 0).
std::string ResultLine(const proto::TrainingArguments& args, const proto::DecoderConfig& config,
                       const Engine& engine, const Figures& f, const Verification& v) {
  const int64_t seq = absl::GetFlag(FLAGS_seq_len), micro = absl::GetFlag(FLAGS_micro_batch);
  const int64_t accum = absl::GetFlag(FLAGS_grad_accum), steps = absl::GetFlag(FLAGS_steps);
  const int world = engine.world_size();
  const double tokens_per_s = static_cast<double>(steps * accum * micro * seq * world) / f.seconds;
  // Attention as the full square, and as its causal half: (F(seq) + F(0)) / 2.
  const double flops = DecoderTrainingFlopsPerToken(config, seq);
  const double flops_causal = (flops + DecoderTrainingFlopsPerToken(config, 0)) / 2;
  const double tflops = tokens_per_s / world * flops / 1e12;
  const double tflops_causal = tokens_per_s / world * flops_causal / 1e12;
  JsonLine line;
  line.String("model", absl::GetFlag(FLAGS_model)).String("engine", EngineLabel(args));
  line.Int("gpus", world).String("device", engine.device().str()).Int("seq_len", seq);
  line.Int("micro_batch", micro).Int("grad_accum", accum).Int("steps", steps);
  line.Int("warmup", absl::GetFlag(FLAGS_warmup)).Bool("bf16", args.bf16());
  line.Bool("activation_checkpointing", absl::GetFlag(FLAGS_activation_checkpointing));
  line.Bool("fused_kernels", args.fused_kernels()).Bool("cuda_graphs", args.cuda_graphs());
  line.Fixed("graph_replays", f.graph_replays, 0);
  line.Int("loss_chunk_rows", absl::GetFlag(FLAGS_loss_chunk_rows));
  line.Bool("recompute_mlp_product", absl::GetFlag(FLAGS_recompute_mlp_product));
  line.Int("profiled_steps", std::min(absl::GetFlag(FLAGS_profile_steps), steps));
  line.Bool("skip_collectives", absl::GetFlag(FLAGS_skip_collectives));
  line.Number("learning_rate", absl::GetFlag(FLAGS_learning_rate));
  line.Number("weight_decay", args.weight_decay()).String("init_dir", absl::GetFlag(FLAGS_init_dir));
  line.String("tokens", absl::GetFlag(FLAGS_tokens));
  line.String("inject_fault", absl::GetFlag(FLAGS_inject_fault)).Fixed("seconds", f.seconds, 3);
  line.Fixed("tokens_per_s", tokens_per_s, 1).Fixed("tokens_per_s_per_gpu", tokens_per_s / world, 1);
  line.Number("flops_per_token", flops).Number("flops_per_token_causal", flops_causal);
  line.Fixed("tflops_per_gpu", tflops, 1).Fixed("tflops_per_gpu_causal", tflops_causal, 1);
  line.Number("peak_tflops", absl::GetFlag(FLAGS_peak_tflops));
  line.Number("spec_tflops", absl::GetFlag(FLAGS_spec_tflops));
  line.Fixed("mfu_full_measured", tflops / absl::GetFlag(FLAGS_peak_tflops), 4);
  line.Fixed("mfu_causal_spec", tflops_causal / absl::GetFlag(FLAGS_spec_tflops), 4);
  // Peak memory is known on CUDA only (PeakAllocatedBytes is -1 elsewhere).
  line.Raw("peak_memory_gib",
           f.peak_bytes < 0 ? "null" : absl::StrFormat("%.2f", f.peak_bytes / (1 << 30)));
  line.Raw("peak_by_phase_gib", PhasePeaksJson(f, args.cuda_graphs()));
  line.Fixed("host_peak_gib", f.host_peak_bytes / (1 << 30), 2);
  line.Number("first_loss", v.first_loss).Number("last_loss", v.last_loss);
  line.Number("first_grad_norm", v.first_grad_norm).Number("param_checksum", v.param_checksum);
  line.Fixed("tokens_fingerprint", v.tokens_fingerprint, 0);
  line.String("formula", "6*matmul_params + 12*layers*heads*head_dim*seq per token (causal: 6*)");
  return line.Finish();
}

absl::StatusOr<std::shared_ptr<Dataset>> BenchTokens(int64_t samples, int64_t seq, int64_t vocab) {
  const std::string kind = absl::GetFlag(FLAGS_tokens);
  if (kind == "markov") return std::make_shared<MarkovTokens>(samples, seq, vocab);
  if (kind == "random") return std::make_shared<RandomTokens>(samples, seq, vocab);
  return absl::InvalidArgumentError(
      absl::StrCat("--tokens=", kind, " is unknown: use markov (learnable) or random"));
}

// The flags that tune the fused kernels: refused when they would change nothing.
absl::Status CheckFusedKernelFlags() {
  const int64_t rows = absl::GetFlag(FLAGS_loss_chunk_rows);
  if (rows < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--loss_chunk_rows=", rows, " is negative: give rows per chunk, or 0 for the default"));
  }
  if (rows > 0 && !absl::GetFlag(FLAGS_fused_kernels)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--loss_chunk_rows=", rows, " chunks the fused LM head + loss, which "
        "--fused_kernels=false turns off: drop one of the two flags"));
  }
  if (absl::GetFlag(FLAGS_recompute_mlp_product) && !absl::GetFlag(FLAGS_fused_kernels)) {
    return absl::InvalidArgumentError(
        "--recompute_mlp_product changes the fused MLP, which --fused_kernels=false turns off: "
        "drop one of the two flags");
  }
  return absl::OkStatus();
}

absl::Status CheckFault() {
  const std::string fault = absl::GetFlag(FLAGS_inject_fault);
  if (fault == "none" || fault == "noop_optimizer" || fault == "scaled_gradient" ||
      fault == "other_tokens") {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--inject_fault=", fault,
      " is unknown: use none, noop_optimizer, scaled_gradient or other_tokens"));
}

absl::Status Run(const std::vector<std::string>& overrides) {
  CT_ASSIGN_OR_RETURN(DistributedEnv env, DistributedEnvFromEnvironment());
  InitLogging("bench", env.rank);
  CT_RETURN_IF_ERROR(CheckFault());
  CT_RETURN_IF_ERROR(CheckFusedKernelFlags());
  const std::string model_name = absl::GetFlag(FLAGS_model);
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, NamedDecoderConfig(model_name));
  const int64_t seq = absl::GetFlag(FLAGS_seq_len);
  const int64_t samples = (absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps)) *
                          absl::GetFlag(FLAGS_grad_accum) * absl::GetFlag(FLAGS_micro_batch);
  const std::string init_dir = absl::GetFlag(FLAGS_init_dir);
  CT_ASSIGN_OR_RETURN(proto::TrainingArguments args, BenchArgs(env.rank, overrides));

  CT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, MakeEngine(args));
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
                      BenchModel(init_dir, config, model_name, *engine));
  model->set_loss_chunk_rows(absl::GetFlag(FLAGS_loss_chunk_rows));
  model->SetRecomputeMlpProduct(absl::GetFlag(FLAGS_recompute_mlp_product));
  const c10::Device device = engine->device();
  CT_ASSIGN_OR_RETURN(std::shared_ptr<Dataset> data,
                      BenchTokens(samples * engine->world_size(), seq, config.vocab_size()));
  BenchTrainer trainer(args, model, data, std::move(engine), absl::GetFlag(FLAGS_inject_fault),
                       config.vocab_size());
  auto timer = std::make_shared<StepTimer>(absl::GetFlag(FLAGS_warmup), device);
  trainer.AddCallback(timer);
  const int64_t profile_steps = std::min(absl::GetFlag(FLAGS_profile_steps),
                                         absl::GetFlag(FLAGS_steps));
  if (profile_steps > 0) {
    trainer.AddCallback(std::make_shared<ProfileWindow>(profile_steps, device, env.rank));
  }
  CT_ASSIGN_OR_RETURN(TrainOutput trained, trainer.Train());
  CT_ASSIGN_OR_RETURN(const Figures figures, GatherFigures(trainer, *timer, trained));
  CT_RETURN_IF_ERROR(CheckTimedStepsReplayed(figures));
  // After the peaks were read: the checksum gathers whole parameters.
  CT_ASSIGN_OR_RETURN(const Verification verification,
                      VerificationFigures(trainer, init_dir, seq));
  if (env.rank == 0) {
    std::printf("%s\n", ResultLine(args, config, *trainer.engine(), figures, verification).c_str());
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  cpptrain::EnterBuildWorkingDirectory();
  std::vector<std::string> overrides = cpptrain::TakeRepeatedFlag("set", argc, argv);
  absl::ParseCommandLine(argc, argv);
  absl::Status status = cpptrain::Run(overrides);
  if (!status.ok()) {
    LOG(ERROR) << status.message();
    return 1;
  }
  return 0;
}
