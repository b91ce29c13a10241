// Which run a checkpoint continues: a hash of the training arguments without the fields a
// resumed run may legitimately change (kRunIdentityIgnoredFields), plus whatever else defines
// the job (tools/train adds its model and data configuration). Saved in trainer_state; a
// resume_from_checkpoint: latest that finds another run's checkpoint in output_dir refuses it,
// where it would otherwise continue the other run's weights and optimizer silently.
//
//   const std::string id = RunIdentity(args, job.model().DebugString() + job.data()...);
//   if (saved.has_run_identity() && saved.run_identity() != id) ... refuse
#ifndef CPPTRAIN_TRAINER_RUN_IDENTITY_H_
#define CPPTRAIN_TRAINER_RUN_IDENTITY_H_

#include <string>
#include <vector>

#include "proto/training_args.pb.h"

namespace cpptrain {

// TrainingArguments fields left out of the identity: the length of the run (max_steps,
// num_train_epochs), where it writes and what it resumes (output_dir, logging_dir,
// resume_from_checkpoint, overwrite_output_dir, run_name), the logging, evaluation and saving
// schedule and what is kept, the engine and its section (checkpoints load into any engine and
// world size), data-loading performance knobs, and switches that do not change the step's
// mathematics (fused_kernels, cuda_graphs, gradient_checkpointing, disable_tqdm, report_to,
// ddp_timeout, load_strict, auto_find_batch_size, the do_* run modes, predict_top_k).
// What remains (batch size, accumulation, optimizer and its hyperparameters, scheduler, seeds,
// precision, clipping, label smoothing, accelerator_config, ...) is the run.
const std::vector<std::string>& RunIdentityIgnoredFields();

// 16 hex digits: two CRC-32Cs of the deterministic serialization of `args` with the ignored
// fields cleared, followed by `job_extra`.
std::string RunIdentity(const proto::TrainingArguments& args, const std::string& job_extra = "");

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_RUN_IDENTITY_H_
