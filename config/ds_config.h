// A DeepSpeed JSON config (the file given to deepspeed.initialize or to Hugging Face's
// TrainingArguments(deepspeed=...)) as the training arguments of the ZeRO engine:
// zero_optimization -> args.zero, fp16/bf16 -> fp16/bf16 (the loss-scale keys into args.zero),
// gradient_clipping -> max_grad_norm, the batch keys, the AdamW optimizer block and the
// WarmupLR / WarmupDecayLR / WarmupCosineLR schedulers.
//
//   CT_ASSIGN_OR_RETURN(DeepSpeedConversion c, ConvertDeepSpeedConfig(json_text, "ds.json"));
//   std::cout << DeepSpeedConversionText(c, "ds.json", /*base=*/nullptr);
//   // or as overrides of a TrainJob: {"args.zero={stage: 2 ...}", "args.max_grad_norm=1", ...}
//   std::vector<std::string> overrides = DeepSpeedConversionOverrides(c, "args.");
//
// A value of "auto" is left unset, so the textproto's own value applies (a note says so). Keys
// that only steer DeepSpeed's logging (steps_per_print, wall_clock_breakdown, ...) are dropped
// with a note. Anything else the engine cannot honour (an unknown key, NVMe offload, another
// optimizer or scheduler, values this engine does not implement) is an InvalidArgument error
// naming the key path, the value and what to do instead.
#ifndef CPPTRAIN_CONFIG_DS_CONFIG_H_
#define CPPTRAIN_CONFIG_DS_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/job.pb.h"
#include "proto/training_args.pb.h"

namespace cpptrain {

struct DeepSpeedConversion {
  // Only the fields the JSON sets (has_* tells which); args.zero is always set.
  proto::TrainingArguments args;
  // One line each: "auto" keys left unset, keys dropped, behaviour that differs.
  std::vector<std::string> notes;
};

absl::StatusOr<DeepSpeedConversion> ConvertDeepSpeedConfig(absl::string_view json_text,
                                                           absl::string_view source_name);

// The conversion's fields as assignments for ApplyOverrides: "<prefix>zero={...}" and one per
// other field ("<prefix>bf16=true"). `prefix` is "args." for a TrainJob, "" for TrainingArguments.
std::vector<std::string> DeepSpeedConversionOverrides(const DeepSpeedConversion& conversion,
                                                      absl::string_view prefix = "args.");

// The job textproto: the notes as comment lines, then `args { ... }` (the fields set by the
// conversion merged over base's args, with base's model and data, when base is given).
std::string DeepSpeedConversionText(const DeepSpeedConversion& conversion,
                                    absl::string_view source_name, const proto::TrainJob* base);

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_DS_CONFIG_H_
