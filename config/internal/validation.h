// Rule groups behind ValidateTrainingArguments and TrainingArgumentsWarnings
// (config/training_args.h); not part of the public API. Each check appends one line per
// violated rule, naming the field(s), the value(s) seen and the fix.
//
//   std::vector<std::string> problems;
//   config_internal::CheckSteps(args, &problems);
//   config_internal::CheckEngine(args, &problems);
#ifndef CPPTRAIN_CONFIG_INTERNAL_VALIDATION_H_
#define CPPTRAIN_CONFIG_INTERNAL_VALIDATION_H_

#include <string>
#include <vector>

#include "proto/training_args.pb.h"

namespace cpptrain {
namespace config_internal {

using Problems = std::vector<std::string>;

// A double as it would be written in a config ("0.0003", "500", "1e-07").
std::string Num(double value);
// "true" / "false".
std::string Bool(bool value);
// The value of a proto2 optional field, or "<unset>".
std::string NumOrUnset(bool has, double value);

// Strategies and *_steps intervals (logging, evaluation, saving, best model, warm-up).
void CheckSteps(const proto::TrainingArguments& args, Problems* problems);
// Batch sizes, gradient accumulation, run length, precision, data loader, checkpoints.
void CheckLoop(const proto::TrainingArguments& args, Problems* problems);
// Optimizer hyper-parameters and the keyword arguments of the selected scheduler.
void CheckOptimizerAndScheduler(const proto::TrainingArguments& args, Problems* problems);
// The selected engine (local, DDP, FSDP, ZeRO) and its interplay with the other arguments.
void CheckEngine(const proto::TrainingArguments& args, Problems* problems);
// Engine settings that work but are likely mistakes.
void AddEngineWarnings(const proto::TrainingArguments& args, std::vector<std::string>* warnings);

}  // namespace config_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_INTERNAL_VALIDATION_H_
