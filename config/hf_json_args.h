// Hugging Face TrainingArguments' three JSON-valued fields, given as transformers takes them (the
// path of a JSON file, or the JSON object itself), as assignments to our TrainingArguments:
//
//   deepspeed           a DeepSpeed config, converted by config/ds_config.h: zero { ... }, bf16,
//                       fp16, optimizer and scheduler fields, batch sizes, clipping. A value of
//                       "auto" sets nothing, so the training arguments' own value applies (the
//                       value Hugging Face would write there).
//   fsdp_config         fsdp.* fields. Keys are read with or without the "fsdp_" prefix (
//                       transformers strips it); they mean what Accelerate's fsdp_config keys
//                       mean (config/accelerate_config.h), plus transformers' own cpu_offload,
//                       limit_all_gathers and xla keys. "version" is set only when given, so a
//                       config without it keeps the version fsdp's string form chose (else 2).
//   accelerator_config  accelerator_config.* fields, key for key.
//
// A key nothing here reads is an error naming it (transformers ignores an unknown fsdp_config
// key; here a typo does not pass silently). Keys accepted with a changed meaning or no effect
// come back as notes for the caller to log.
//
//   CT_ASSIGN_OR_RETURN(HfJsonTranslation t,
//                       TranslateHfJsonArgument("deepspeed", "ds_config_zero2.json"));
//   CT_RETURN_IF_ERROR(ApplyOverrides(t.assignments, &args));  // "zero={stage: 2 ...}", ...
//   for (const std::string& note : t.notes) LOG(WARNING) << note;
#ifndef CPPTRAIN_CONFIG_HF_JSON_ARGS_H_
#define CPPTRAIN_CONFIG_HF_JSON_ARGS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cpptrain {

struct HfJsonTranslation {
  // Paths from TrainingArguments, in ApplyOverride's syntax ("accelerator_config.even_batches=
  // false", "zero={stage: 3 ...}").
  std::vector<std::string> assignments;
  // One line each: "auto" keys, keys dropped or read differently from Hugging Face, and why.
  std::vector<std::string> notes;
};

// deepspeed, fsdp_config or accelerator_config.
bool IsHfJsonArgument(absl::string_view name);

// Whether `value` is Hugging Face's form (a path, or a JSON object whose first key is quoted)
// rather than a text-format body ("{split_batches: true}", which accelerator_config, a field of
// ours, also takes). Quotes around the whole value are looked through.
bool IsHfJsonValue(absl::string_view value);

// `value`: a JSON file's path (relative to the working directory, as Python's open() takes it)
// or the JSON text, either possibly quoted as in a text-format file ('{"stage": 2}'). Errors
// are InvalidArgument (NotFound for a file that cannot be read) naming the argument, the key
// path, the value and what to do instead.
absl::StatusOr<HfJsonTranslation> TranslateHfJsonArgument(absl::string_view name,
                                                          absl::string_view value);

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_HF_JSON_ARGS_H_
