// One leg of the resharding test (checkpoint_test.sh): trains the tiny decoder with AdamW on a
// fixed global batch of 12 sequences per step (per-device batch 12 / world), with the engine
// given by --engine, saving a checkpoint every 2 steps, optionally resuming from --resume.
// Rank 0 prints "LOSS <step> <loss>" (to full double precision) for every step this run
// trained, which the scripts compare across legs run on different engines, world sizes and
// nodes (checkpoint_test.sh, multinode_test.sh).
#include <torch/utils.h>

#include <csignal>
#include <iomanip>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/logging.h"
#include "models/configs.h"
#include "sharding/rendezvous.h"
#include "trainer/testing/trainer_testing.h"
#include "trainer/trainer.h"

ABSL_FLAG(std::string, engine, "local",
          "local, ddp, fsdp / fsdp1 (sharded checkpoints), fsdp_full / fsdp1_full, zero1, zero2, "
          "zero3 or zero1_offload / zero2_offload / zero3_offload (offload_optimizer CPU)");
ABSL_FLAG(std::string, output_dir, "/tmp/checkpoint_resume", "where checkpoints go");
ABSL_FLAG(std::string, resume, "", "resume_from_checkpoint");
ABSL_FLAG(int, max_steps, 10, "optimizer steps in all");
ABSL_FLAG(bool, use_cpu, false, "train on the CPU even where CUDA is available");
ABSL_FLAG(bool, bf16, false,
          "TrainingArguments.bf16 (local, DDP and ZeRO 1/2: bf16 working copies of fp32 masters)");
ABSL_FLAG(int, sigterm_at_step, 0, "the last rank raises SIGTERM on itself after this step");
ABSL_FLAG(int, kill_at_step, 0,
          "the last rank raises SIGKILL on itself after this step, on the launcher's first "
          "attempt only (TORCHELASTIC_RESTART_COUNT 0), so a restart runs to the end");
ABSL_FLAG(int, ddp_timeout_s, 1800, "TrainingArguments.ddp_timeout: collectives, rendezvous");

namespace cpptrain {
namespace {

// Raises `signal` on this process at the end of step `step` (0: never): SIGTERM as a
// scheduler's preemption would deliver it, SIGKILL as a crash or the OOM killer would.
class RaiseAtStep : public TrainerCallback {
 public:
  RaiseAtStep(int64_t step, int signal) : step_(step), signal_(signal) {}
  void OnStepEnd(const CallbackContext& c) override {
    if (step_ > 0 && c.state.global_step == step_) std::raise(signal_);
  }

 private:
  int64_t step_;
  int signal_;
};

void PrintLosses(const Trainer& trainer, int64_t resumed, int rank);

int Run() {
  auto env = DistributedEnvFromEnvironment();
  if (!env.ok()) {
    LOG(ERROR) << env.status();
    return 1;
  }
  InitLogging("checkpoint_resume", env->rank);
  if (12 % env->world_size != 0) {
    LOG(ERROR) << "world size must divide 12";
    return 1;
  }
  proto::TrainingArguments args;
  args.set_output_dir(absl::GetFlag(FLAGS_output_dir));
  args.set_per_device_train_batch_size(12 / env->world_size);
  args.set_max_steps(absl::GetFlag(FLAGS_max_steps));
  args.set_learning_rate(1e-2);
  args.set_warmup_steps(2);
  args.set_lr_scheduler_type(proto::TrainingArguments::COSINE);
  args.set_logging_steps(1);
  args.set_save_strategy(proto::TrainingArguments::STEPS);
  args.set_save_steps(2);
  args.set_disable_tqdm(true);
  args.set_resume_from_checkpoint(absl::GetFlag(FLAGS_resume));
  args.set_use_cpu(absl::GetFlag(FLAGS_use_cpu));
  args.set_bf16(absl::GetFlag(FLAGS_bf16));
  args.set_ddp_timeout(absl::GetFlag(FLAGS_ddp_timeout_s));
  const std::string engine = absl::GetFlag(FLAGS_engine);
  if (engine == "ddp") {
    args.mutable_ddp();
  } else if (engine == "fsdp" || engine == "fsdp_full" || engine == "fsdp1" ||
             engine == "fsdp1_full") {
    args.mutable_fsdp()->set_version(engine == "fsdp1" || engine == "fsdp1_full" ? 1 : 2);
    if (engine == "fsdp_full" || engine == "fsdp1_full") {
      args.mutable_fsdp()->set_state_dict_type(proto::FsdpConfig::FULL_STATE_DICT);
    }
  } else if (engine.rfind("zero", 0) == 0 && engine.size() >= 5) {
    args.mutable_zero()->set_stage(engine[4] - '0');
    args.mutable_zero()->set_stage3_param_persistence_threshold(0);  // every layer a group
    args.mutable_zero()->set_reduce_bucket_size(20000);              // several buckets
    if (engine.find("_offload") != std::string::npos) {
      args.mutable_zero()->set_offload_optimizer_device(proto::ZeroConfig::CPU);
    }
  } else {
    args.mutable_local()->set_device("cpu");
  }
  torch::manual_seed(5);
  // A different initialization than the checkpoint's: resuming must overwrite all of it.
  if (!absl::GetFlag(FLAGS_resume).empty()) torch::manual_seed(6);
  auto model = *BuildDecoder(*NamedDecoderConfig("tiny"));
  // The step training resumes after (log_history comes back with the checkpoint; print only
  // what this run trained).
  int64_t resumed = 0;
  std::string resume = absl::GetFlag(FLAGS_resume);
  if (resume == "latest") resume = LatestCheckpoint(args.output_dir()).value_or("");
  if (const size_t dash = resume.rfind('-'); dash != std::string::npos) {
    resumed = std::stoll(resume.substr(dash + 1));
  }
  Trainer trainer(args, model, testing::VariableLengthTokens(120, 3));
  const bool last_rank = env->rank == env->world_size - 1;
  if (const int step = absl::GetFlag(FLAGS_sigterm_at_step); step > 0) {
    trainer.AddCallback(std::make_shared<RaiseAtStep>(last_rank ? step : 0, SIGTERM));
  }
  if (const int step = absl::GetFlag(FLAGS_kill_at_step); step > 0) {
    const bool first_attempt = env->restart_count == 0;
    trainer.AddCallback(
        std::make_shared<RaiseAtStep>(last_rank && first_attempt ? step : 0, SIGKILL));
  }
  auto out = trainer.Train();
  if (!out.ok() && trainer.stopped_by_signal() != 0) {
    // Stopped for the signal after saving: the steps it ran, and where it stopped.
    PrintLosses(trainer, resumed, env->rank);
    if (env->rank == 0) std::cout << "STOPPED " << trainer.state().global_step << std::endl;
    return 128 + trainer.stopped_by_signal();
  }
  if (!out.ok()) {
    LOG(ERROR) << "training failed: " << out.status();
    return 1;
  }
  PrintLosses(trainer, resumed, env->rank);
  return 0;
}

void PrintLosses(const Trainer& trainer, int64_t resumed, int rank) {
  if (rank == 0) {
    for (const Metrics& m : trainer.state().log_history) {
      if (m.count("loss") && m.at("step") > resumed) {
        std::cout << "LOSS " << static_cast<int64_t>(m.at("step")) << " " << std::setprecision(17)
                  << m.at("loss") << std::endl;
      }
    }
  }
}

}  // namespace
}  // namespace cpptrain

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return cpptrain::Run();
}
