// Hugging Face Accelerate's configuration as the training arguments: the settings
// `accelerate launch` passes its workers as environment variables (ACCELERATE_USE_FSDP and the
// FSDP_* keys, ACCELERATE_USE_DEEPSPEED and ACCELERATE_DEEPSPEED_*, ACCELERATE_MIXED_PRECISION,
// ...) and the YAML file `accelerate config` writes (config/accelerate_yaml.h reads it) go
// through one mapping, keyed by the YAML's names ("distributed_type",
// "fsdp_config.fsdp_version"). Each key becomes `--set` overrides of the job
// ("args.fsdp.version=2"), a launch setting (num_processes, main_process_port, ...), a note
// (a key that changes nothing here, and why), or an InvalidArgument error naming the key, where
// it came from, its value and what to do instead. docs/ACCELERATE.md is the table of every key
// (AccelerateKeyTableMarkdown writes it; a test keeps them equal).
//
//   std::vector<AccelerateSetting> settings = AccelerateSettingsFromEnvironment();
//   CT_ASSIGN_OR_RETURN(AccelerateMapping mapping, MapAccelerateSettings(settings));
//   overrides.insert(overrides.begin(), mapping.overrides.begin(), mapping.overrides.end());
//   CT_ASSIGN_OR_RETURN(proto::TrainJob job, LoadTrainJob(path, overrides));
//
// Precedence: the job file, then Accelerate's overrides, then the user's own --set flags. As in
// Hugging Face, where TrainingArguments set ACCELERATE_MIXED_PRECISION themselves, Accelerate's
// "no" mixed precision and MULTI_GPU leave the job's bf16/fp16 and engine as they are; FSDP and
// DEEPSPEED select the engine (FSDP from fsdp_config, ZeRO from deepspeed_config).
#ifndef CPPTRAIN_CONFIG_ACCELERATE_CONFIG_H_
#define CPPTRAIN_CONFIG_ACCELERATE_CONFIG_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace cpptrain {

struct AccelerateSetting {
  std::string key;     // the YAML's path: "mixed_precision", "deepspeed_config.zero_stage"
  std::string value;   // the scalar as written; a list joined with ","
  std::string source;  // where it came from: "ACCELERATE_USE_FSDP", "fsdp.yaml:7"
};

// What tools/launch takes from the file (unset: -1 or empty).
struct AccelerateLaunch {
  int num_processes = -1;
  int num_machines = -1;
  int machine_rank = -1;
  std::string main_process_ip;
  int main_process_port = -1;
};

struct AccelerateMapping {
  // Job overrides in ApplyOverride's syntax, in order: "args.fsdp={}", "args.fsdp.version=2".
  std::vector<std::string> overrides;
  // deepspeed_config.deepspeed_config_file: a DeepSpeed JSON for config/ds_config.h to convert
  // (its fields go under the overrides above).
  std::string deepspeed_config_file;
  AccelerateLaunch launch;
  // Keys accepted with no effect here, one line each with the reason.
  std::vector<std::string> notes;
};

// The settings `accelerate launch` left in the environment (NAME=VALUE strings, as in
// `environ`), as YAML keys. Empty when none of ACCELERATE_MIXED_PRECISION, ACCELERATE_USE_FSDP,
// ACCELERATE_USE_DEEPSPEED and ACCELERATE_USE_CPU is set (not launched by accelerate). FSDP_*
// variables count only with ACCELERATE_USE_FSDP=true and ACCELERATE_DEEPSPEED_* (and the
// gradient ones) only with ACCELERATE_USE_DEEPSPEED=true, as in Accelerate. An FSDP_* or
// ACCELERATE_DEEPSPEED_* variable this mapping does not know becomes a setting of that name,
// which MapAccelerateSettings refuses; other unknown ACCELERATE_* variables are left alone
// (Accelerate reads some outside its launcher, such as ACCELERATE_LOG_LEVEL).
std::vector<AccelerateSetting> AccelerateSettingsFromEnvironment(
    const std::vector<std::string>& environment);
// The same over this process's environment.
std::vector<AccelerateSetting> AccelerateSettingsFromEnvironment();

// Maps every setting (see the file comment). All errors are reported together, one a line.
absl::StatusOr<AccelerateMapping> MapAccelerateSettings(
    const std::vector<AccelerateSetting>& settings);

// docs/ACCELERATE.md: every key, its environment variable, and what it maps to.
std::string AccelerateKeyTableMarkdown();

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_ACCELERATE_CONFIG_H_
