// The job overrides an Accelerate configuration gives tools/train: from the YAML file of
// --accelerate_config, else from the variables `accelerate launch` set
// (config/accelerate_config.h maps both), with a deepspeed_config_file converted by
// config/ds_config.h and laid right after the engine's selection, so the YAML's own keys and
// then the user's --set flags refine it.
//
//   CT_ASSIGN_OR_RETURN(AccelerateJob accelerate, AccelerateJobOverrides(flag_value));
//   overrides.insert(overrides.begin(), accelerate.overrides.begin(), accelerate.overrides.end());
#ifndef CPPTRAIN_TOOLS_ACCELERATE_JOB_H_
#define CPPTRAIN_TOOLS_ACCELERATE_JOB_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "config/accelerate_config.h"
#include "config/ds_config.h"

namespace cpptrain {

struct AccelerateJob {
  std::string source;  // the YAML path, "the environment of accelerate launch", or "" (none)
  std::vector<std::string> overrides;  // job paths ("args.fsdp={}", "args.bf16=true")
  AccelerateLaunch launch;
  std::vector<std::string> notes;  // keys accepted with no effect, and the JSON's notes
};

// `yaml_path` empty: the environment's settings (none when not launched by accelerate).
absl::StatusOr<AccelerateJob> AccelerateJobOverrides(const std::string& yaml_path);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_ACCELERATE_JOB_H_
