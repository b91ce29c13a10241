#include "config/accelerate_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

extern char** environ;

namespace cpptrain {
namespace {

// What one key's handler sees: every setting by key, and where to put its results.
struct Context {
  std::map<std::string, const AccelerateSetting*> by_key;
  std::string distributed_type = "NO";
  int fsdp_version = 1;
  AccelerateMapping* out = nullptr;
  std::vector<std::string>* errors = nullptr;

  const AccelerateSetting* Find(const std::string& key) const {
    auto it = by_key.find(key);
    return it == by_key.end() ? nullptr : it->second;
  }
  void Error(const AccelerateSetting& s, absl::string_view problem) {
    errors->push_back(absl::StrCat(s.source, ": ", s.key, ": \"", s.value, "\" ", problem));
  }
  void Note(const AccelerateSetting& s, absl::string_view why) {
    out->notes.push_back(absl::StrCat(s.source, ": ", s.key, ": \"", s.value, "\" ", why));
  }
  void Set(const std::string& path, const std::string& value) {
    out->overrides.push_back(absl::StrCat(path, "=", value));
  }
};

using Handler = std::function<void(const AccelerateSetting&, Context&)>;

struct KeyRow {
  const char* key;
  const char* env;      // the variable `accelerate launch` sets, or ""
  const char* maps_to;  // for the table in docs/ACCELERATE.md
  Handler handle;
};

// Accelerate's str_to_bool.
bool ParseBool(absl::string_view text, bool* value) {
  const std::string v = absl::AsciiStrToLower(text);
  for (const char* t : {"y", "yes", "t", "true", "on", "1"}) {
    if (v == t) return *value = true, true;
  }
  for (const char* f : {"n", "no", "f", "false", "off", "0"}) {
    if (v == f) return *value = false, true;
  }
  return false;
}

bool IsEmptyValue(absl::string_view v) {
  const std::string lower = absl::AsciiStrToLower(v);
  return lower.empty() || lower == "null" || lower == "none" || lower == "~";
}

Handler SetBool(const char* path) {
  return [path](const AccelerateSetting& s, Context& c) {
    bool b = false;
    if (!ParseBool(s.value, &b)) return c.Error(s, "is not true or false");
    c.Set(path, b ? "true" : "false");
  };
}

Handler SetInt(const char* path, int64_t min) {
  return [path, min](const AccelerateSetting& s, Context& c) {
    int64_t v = 0;
    double d = 0;
    // `accelerate config` writes 1e8 for fsdp_min_num_params.
    if (!absl::SimpleAtoi(s.value, &v)) {
      if (!absl::SimpleAtod(s.value, &d) || d != static_cast<double>(static_cast<int64_t>(d))) {
        return c.Error(s, "is not a whole number");
      }
      v = static_cast<int64_t>(d);
    }
    if (v < min) return c.Error(s, absl::StrCat("is below ", min));
    c.Set(path, std::to_string(v));
  };
}

// An enum given by name (any case) or, as Accelerate allows, by its 1-based number.
bool ParseEnum(absl::string_view value, const std::vector<std::string>& names, std::string* out) {
  int index = 0;
  if (absl::SimpleAtoi(value, &index) && index >= 1 && index <= static_cast<int>(names.size())) {
    *out = names[index - 1];
    return true;
  }
  const std::string upper = absl::AsciiStrToUpper(value);
  if (std::find(names.begin(), names.end(), upper) == names.end()) return false;
  *out = upper;
  return true;
}

Handler SetEnum(const char* path, std::vector<std::string> names) {
  return [path, names](const AccelerateSetting& s, Context& c) {
    std::string name;
    if (!ParseEnum(s.value, names, &name)) {
      return c.Error(s, absl::StrCat("is not one of ", absl::StrJoin(names, ", ")));
    }
    c.Set(path, name);
  };
}

// Accepted with no effect here; `why` says so.
Handler NoEffect(const char* why) {
  return [why](const AccelerateSetting& s, Context& c) {
    bool b = true;
    if (IsEmptyValue(s.value) || (ParseBool(s.value, &b) && !b)) return;  // off: nothing to say
    c.Note(s, why);
  };
}

// Accepted only with the values that mean "off" (or `allowed`); anything else is refused.
Handler OnlyOff(const char* why_refused, std::vector<std::string> allowed = {}) {
  return [why_refused, allowed](const AccelerateSetting& s, Context& c) {
    bool b = true;
    const std::string lower = absl::AsciiStrToLower(s.value);
    if (IsEmptyValue(s.value) || (ParseBool(s.value, &b) && !b) ||
        std::find(allowed.begin(), allowed.end(), lower) != allowed.end()) {
      return;
    }
    c.Error(s, why_refused);
  };
}

Handler Refuse(const char* why) {
  return [why](const AccelerateSetting& s, Context& c) {
    if (!IsEmptyValue(s.value)) c.Error(s, why);
  };
}

const std::vector<std::string> kShardingStrategies = {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD",
                                                      "HYBRID_SHARD", "HYBRID_SHARD_ZERO2"};

void DistributedType(const AccelerateSetting& s, Context& c) {
  const std::string type = absl::AsciiStrToUpper(s.value);
  if (type == "NO" || type == "MULTI_GPU") return;  // one process, or DDP under several
  if (type == "MULTI_CPU") return c.Set("args.use_cpu", "true");
  if (type == "FSDP") return c.Set("args.fsdp", "{}");
  if (type == "DEEPSPEED") return c.Set("args.zero", "{}");
  c.Error(s, "is not a distributed type this framework runs: use NO, MULTI_GPU, MULTI_CPU, "
             "FSDP or DEEPSPEED");
}

void MixedPrecision(const AccelerateSetting& s, Context& c) {
  const std::string mp = absl::AsciiStrToLower(s.value);
  if (mp == "no") return;  // the job's own bf16/fp16 stay, as TrainingArguments' do in HF
  if (mp == "bf16") return c.Set("args.bf16", "true");
  if (mp == "fp16") return c.Set("args.fp16", "true");
  c.Error(s, "is not supported: use no, bf16 or fp16 (fp8 needs Transformer Engine or torchao)");
}

// FSDP1: the strategy `accelerate config` asks for as fsdp_reshard_after_forward, else
// fsdp_sharding_strategy. FSDP2: a bool.
void ReshardAfterForward(const AccelerateSetting& s, Context& c) {
  bool b = false;
  std::string strategy;
  if (c.fsdp_version == 2) {
    if (!ParseBool(s.value, &b)) return c.Error(s, "is not true or false (fsdp_version 2)");
    return c.Set("args.fsdp.reshard_after_forward", b ? "true" : "false");
  }
  if (ParseEnum(s.value, kShardingStrategies, &strategy)) {
    return c.Set("args.fsdp.sharding_strategy", strategy);
  }
  if (ParseBool(s.value, &b)) {
    return c.Note(s, "is ignored under fsdp_version 1, as in Accelerate (fsdp_sharding_strategy "
                     "applies)");
  }
  c.Error(s, absl::StrCat("is neither a sharding strategy (",
                          absl::StrJoin(kShardingStrategies, ", "), ") nor true/false"));
}

void ShardingStrategy(const AccelerateSetting& s, Context& c) {
  if (c.fsdp_version == 2) {
    return c.Note(s, "is ignored under fsdp_version 2, as in Accelerate (reshard_after_forward "
                     "says it)");
  }
  std::string strategy;
  if (!ParseEnum(s.value, kShardingStrategies, &strategy)) {
    return c.Error(s, absl::StrCat("is not one of ", absl::StrJoin(kShardingStrategies, ", ")));
  }
  const AccelerateSetting* reshard = c.Find("fsdp_config.fsdp_reshard_after_forward");
  std::string other;
  if (reshard != nullptr && ParseEnum(reshard->value, kShardingStrategies, &other)) {
    return c.Note(s, absl::StrCat("gives way to fsdp_reshard_after_forward ", other,
                                  " (what `accelerate config` asks for as the strategy)"));
  }
  c.Set("args.fsdp.sharding_strategy", strategy);
}

bool IsClassName(absl::string_view name) {
  return !name.empty() && std::all_of(name.begin(), name.end(), [](char ch) {
    return absl::ascii_isalnum(ch) || ch == '_' || ch == '.';
  });
}

void WrapClasses(const AccelerateSetting& s, Context& c) {
  std::vector<std::string> names;
  for (absl::string_view n : absl::StrSplit(s.value, ',', absl::SkipWhitespace())) {
    n = absl::StripAsciiWhitespace(n);
    if (!IsClassName(n)) {
      return c.Error(s, absl::StrCat("has \"", n, "\", which is not a class name (letters, digits, "
                                     "'_' and '.')"));
    }
    names.push_back(absl::StrCat("\"", n, "\""));
  }
  if (names.empty()) return c.Error(s, "names no class; give one or more, comma-separated");
  c.Set("args.fsdp.transformer_layer_cls_to_wrap",
        absl::StrCat("[", absl::StrJoin(names, ", "), "]"));
}

void OffloadDevice(const char* path, const AccelerateSetting& s, Context& c) {
  const std::string device = absl::AsciiStrToLower(s.value);
  if (device == "none") return c.Set(path, "NONE");
  if (device == "cpu") return c.Set(path, "CPU");
  c.Error(s, "is not supported: use none or cpu (no NVMe offload here)");
}

// "auto" leaves the job's value, as DeepSpeed's "auto" takes the Trainer's.
Handler AutoOr(Handler handle) {
  return [handle](const AccelerateSetting& s, Context& c) {
    if (absl::AsciiStrToLower(s.value) == "auto") return;
    handle(s, c);
  };
}

void LaunchInt(int AccelerateLaunch::*field, int min, const AccelerateSetting& s, Context& c) {
  int v = 0;
  if (!absl::SimpleAtoi(s.value, &v) || v < min) {
    return c.Error(s, absl::StrCat("is not a whole number >= ", min));
  }
  c.out->launch.*field = v;
}

const std::vector<KeyRow>& Rows() {
  static const auto* rows = new std::vector<KeyRow>{
      {"distributed_type", "ACCELERATE_USE_FSDP, ACCELERATE_USE_DEEPSPEED",
       "NO, MULTI_GPU: the job's engine (DDP by default under several processes); MULTI_CPU: "
       "`args.use_cpu`; FSDP: `args.fsdp` from fsdp_config; DEEPSPEED: `args.zero` from "
       "deepspeed_config; other types: an error",
       DistributedType},
      {"mixed_precision", "ACCELERATE_MIXED_PRECISION",
       "bf16: `args.bf16`; fp16: `args.fp16`; no: the job's own; fp8: an error", MixedPrecision},
      {"use_cpu", "ACCELERATE_USE_CPU", "true: `args.use_cpu`",
       [](const AccelerateSetting& s, Context& c) {
         bool b = false;
         if (!ParseBool(s.value, &b)) return c.Error(s, "is not true or false");
         if (b) c.Set("args.use_cpu", "true");
       }},
      {"num_processes", "", "tools/launch --nproc_per_node (divided by num_machines)",
       [](const AccelerateSetting& s, Context& c) {
         LaunchInt(&AccelerateLaunch::num_processes, 1, s, c);
       }},
      {"num_machines", "", "tools/launch --nnodes",
       [](const AccelerateSetting& s, Context& c) {
         LaunchInt(&AccelerateLaunch::num_machines, 1, s, c);
       }},
      {"machine_rank", "", "tools/launch --node_rank",
       [](const AccelerateSetting& s, Context& c) {
         LaunchInt(&AccelerateLaunch::machine_rank, 0, s, c);
       }},
      {"main_process_ip", "", "tools/launch --master_addr",
       [](const AccelerateSetting& s, Context& c) {
         if (!IsEmptyValue(s.value)) c.out->launch.main_process_ip = s.value;
       }},
      {"main_process_port", "", "tools/launch --master_port",
       [](const AccelerateSetting& s, Context& c) {
         if (IsEmptyValue(s.value)) return;
         LaunchInt(&AccelerateLaunch::main_process_port, 0, s, c);
       }},
      {"compute_environment", "", "LOCAL_MACHINE: nothing to do; AMAZON_SAGEMAKER: an error",
       OnlyOff("is not supported: only LOCAL_MACHINE", {"local_machine"})},
      {"debug", "ACCELERATE_DEBUG_MODE", "no effect (collectives are checked by the engines)",
       NoEffect("has no effect here (the engines check their collectives)")},
      {"downcast_bf16", "", "false/no only (a TPU setting)",
       OnlyOff("is a TPU setting; there is no TPU support here: set it to no")},
      {"enable_cpu_affinity", "ACCELERATE_CPU_AFFINITY",
       "no effect (tools/launch gives each rank its share of the CPUs)",
       NoEffect("has no effect here (tools/launch gives each rank its share of the CPUs)")},
      {"gpu_ids", "", "all (or unset) only",
       OnlyOff("is not supported: select GPUs with CUDA_VISIBLE_DEVICES", {"all"})},
      {"main_training_function", "", "no effect (a Python notebook setting)",
       NoEffect("has no effect here (it names a Python function)")},
      {"rdzv_backend", "", "no effect (the ranks meet at master_addr:master_port)",
       NoEffect("has no effect here (the ranks meet at main_process_ip:main_process_port)")},
      {"same_network", "", "no effect", NoEffect("has no effect here")},
      {"tpu_use_cluster", "", "false only", OnlyOff("is a TPU setting; no TPU support here")},
      {"tpu_use_sudo", "", "false only", OnlyOff("is a TPU setting; no TPU support here")},
      {"tpu_name", "", "unset only", Refuse("is a TPU setting; no TPU support here")},
      {"tpu_zone", "", "unset only", Refuse("is a TPU setting; no TPU support here")},
      {"tpu_env", "", "unset only", Refuse("is a TPU setting; no TPU support here")},
      {"tpu_vm", "", "unset only", Refuse("is a TPU setting; no TPU support here")},
      {"commands", "", "unset only", Refuse("is a TPU setting; no TPU support here")},
      {"command_file", "", "unset only", Refuse("is a TPU setting; no TPU support here")},
      {"dynamo_config.dynamo_backend", "ACCELERATE_DYNAMO_BACKEND",
       "NO only: torch.compile is refused (`fused_kernels` and `cuda_graphs` do its work)",
       OnlyOff("asks for torch.compile, which a C++ trainer has no use for: the decoder's fused "
               "kernels (args.fused_kernels) and CUDA graphs (args.cuda_graphs) do its work; "
               "set it to NO",
               {"no"})},
      {"dynamo_config.dynamo_mode", "ACCELERATE_DYNAMO_MODE", "no effect (no torch.compile)",
       NoEffect("has no effect here (no torch.compile)")},
      {"dynamo_config.dynamo_use_fullgraph", "ACCELERATE_DYNAMO_USE_FULLGRAPH",
       "no effect (no torch.compile)", NoEffect("has no effect here (no torch.compile)")},
      {"dynamo_config.dynamo_use_dynamic", "ACCELERATE_DYNAMO_USE_DYNAMIC",
       "no effect (no torch.compile)", NoEffect("has no effect here (no torch.compile)")},
      {"dynamo_config.dynamo_use_regional_compilation",
       "ACCELERATE_DYNAMO_USE_REGIONAL_COMPILATION", "no effect (no torch.compile)",
       NoEffect("has no effect here (no torch.compile)")},
      // ---- fsdp_config (with distributed_type FSDP) --------------------------------------
      {"fsdp_config.fsdp_version", "FSDP_VERSION", "`args.fsdp.version` (1 or 2)",
       [](const AccelerateSetting& s, Context& c) {
         if (s.value != "1" && s.value != "2") return c.Error(s, "is not 1 or 2");
         c.Set("args.fsdp.version", s.value);
       }},
      {"fsdp_config.fsdp_sharding_strategy", "FSDP_SHARDING_STRATEGY",
       "`args.fsdp.sharding_strategy` (FSDP1; ignored under FSDP2, as in Accelerate; "
       "fsdp_reshard_after_forward wins when it names a strategy)",
       ShardingStrategy},
      {"fsdp_config.fsdp_reshard_after_forward", "FSDP_RESHARD_AFTER_FORWARD",
       "FSDP2: `args.fsdp.reshard_after_forward`; FSDP1: a strategy name is "
       "`args.fsdp.sharding_strategy`",
       ReshardAfterForward},
      {"fsdp_config.fsdp_offload_params", "FSDP_OFFLOAD_PARAMS", "`args.fsdp.offload_params`",
       SetBool("args.fsdp.offload_params")},
      {"fsdp_config.fsdp_auto_wrap_policy", "FSDP_AUTO_WRAP_POLICY",
       "`args.fsdp.auto_wrap_policy`",
       SetEnum("args.fsdp.auto_wrap_policy",
               {"TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"})},
      {"fsdp_config.fsdp_transformer_layer_cls_to_wrap", "FSDP_TRANSFORMER_CLS_TO_WRAP",
       "`args.fsdp.transformer_layer_cls_to_wrap` (comma-separated)", WrapClasses},
      {"fsdp_config.fsdp_min_num_params", "FSDP_MIN_NUM_PARAMS",
       "`args.fsdp.min_num_params` under SIZE_BASED_WRAP (ignored under another policy, as in "
       "Accelerate, whose launcher always sets it)",
       [](const AccelerateSetting& s, Context& c) {
         const AccelerateSetting* policy = c.Find("fsdp_config.fsdp_auto_wrap_policy");
         if (policy == nullptr || absl::AsciiStrToUpper(policy->value) != "SIZE_BASED_WRAP") {
           return c.Note(s, "is ignored: fsdp_auto_wrap_policy is not SIZE_BASED_WRAP");
         }
         SetInt("args.fsdp.min_num_params", 0)(s, c);
       }},
      {"fsdp_config.fsdp_backward_prefetch", "FSDP_BACKWARD_PREFETCH",
       "`args.fsdp.backward_prefetch`",
       SetEnum("args.fsdp.backward_prefetch", {"BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH"})},
      {"fsdp_config.fsdp_forward_prefetch", "FSDP_FORWARD_PREFETCH",
       "`args.fsdp.forward_prefetch`", SetBool("args.fsdp.forward_prefetch")},
      {"fsdp_config.fsdp_state_dict_type", "FSDP_STATE_DICT_TYPE", "`args.fsdp.state_dict_type`",
       SetEnum("args.fsdp.state_dict_type",
               {"FULL_STATE_DICT", "LOCAL_STATE_DICT", "SHARDED_STATE_DICT"})},
      {"fsdp_config.fsdp_use_orig_params", "FSDP_USE_ORIG_PARAMS", "`args.fsdp.use_orig_params`",
       SetBool("args.fsdp.use_orig_params")},
      {"fsdp_config.fsdp_sync_module_states", "FSDP_SYNC_MODULE_STATES",
       "`args.fsdp.sync_module_states`", SetBool("args.fsdp.sync_module_states")},
      {"fsdp_config.fsdp_cpu_ram_efficient_loading", "FSDP_CPU_RAM_EFFICIENT_LOADING",
       "`args.fsdp.cpu_ram_efficient_loading`", SetBool("args.fsdp.cpu_ram_efficient_loading")},
      {"fsdp_config.fsdp_activation_checkpointing", "FSDP_ACTIVATION_CHECKPOINTING",
       "`args.fsdp.activation_checkpointing`", SetBool("args.fsdp.activation_checkpointing")},
      {"fsdp_config.fsdp_activation_checkpointing_offload", "FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD",
       "false only (no offload of checkpointed activations)",
       OnlyOff("is not supported: recomputed activations stay on the device; set it to false")},
      {"fsdp_config.fsdp_ignored_modules", "FSDP_IGNORED_MODULES", "unset only",
       Refuse("is not supported: every module is sharded or wrapped by the policy")},
      // ---- deepspeed_config (with distributed_type DEEPSPEED) ----------------------------
      {"deepspeed_config.deepspeed_config_file", "ACCELERATE_DEEPSPEED_CONFIG_FILE",
       "a DeepSpeed JSON converted by config/ds_config.h (as tools/ds_config_to_textproto)",
       [](const AccelerateSetting& s, Context& c) {
         if (!IsEmptyValue(s.value)) c.out->deepspeed_config_file = s.value;
       }},
      {"deepspeed_config.zero_stage", "ACCELERATE_DEEPSPEED_ZERO_STAGE", "`args.zero.stage` (1-3)",
       [](const AccelerateSetting& s, Context& c) {
         int stage = 0;
         if (!absl::SimpleAtoi(s.value, &stage) || stage < 0 || stage > 3) {
           return c.Error(s, "is not a ZeRO stage 0 to 3");
         }
         if (stage == 0) {
           return c.Error(s, "(ZeRO stage 0) is plain data parallelism: use distributed_type "
                             "MULTI_GPU (DDP)");
         }
         c.Set("args.zero.stage", std::to_string(stage));
       }},
      {"deepspeed_config.offload_optimizer_device", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE",
       "`args.zero.offload_optimizer_device` (none, cpu)",
       [](const AccelerateSetting& s, Context& c) {
         OffloadDevice("args.zero.offload_optimizer_device", s, c);
       }},
      {"deepspeed_config.offload_param_device", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE",
       "`args.zero.offload_param_device` (none, cpu)",
       [](const AccelerateSetting& s, Context& c) {
         OffloadDevice("args.zero.offload_param_device", s, c);
       }},
      {"deepspeed_config.offload_optimizer_nvme_path",
       "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_NVME_PATH", "none only",
       OnlyOff("is not supported: no NVMe offload here", {"none"})},
      {"deepspeed_config.offload_param_nvme_path", "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_NVME_PATH",
       "none only", OnlyOff("is not supported: no NVMe offload here", {"none"})},
      {"deepspeed_config.gradient_accumulation_steps", "ACCELERATE_GRADIENT_ACCUMULATION_STEPS",
       "`args.gradient_accumulation_steps` (auto: the job's)",
       AutoOr(SetInt("args.gradient_accumulation_steps", 1))},
      {"deepspeed_config.gradient_clipping", "ACCELERATE_GRADIENT_CLIPPING",
       "`args.max_grad_norm` (auto: the job's)",
       AutoOr([](const AccelerateSetting& s, Context& c) {
         double v = 0;
         if (!absl::SimpleAtod(s.value, &v) || !std::isfinite(v) || v < 0) {
           return c.Error(s, "is not a number >= 0");
         }
         c.Set("args.max_grad_norm", absl::StrFormat("%.17g", v));
       })},
      {"deepspeed_config.zero3_init_flag", "ACCELERATE_DEEPSPEED_ZERO3_INIT",
       "`args.zero.zero3_init_flag`", SetBool("args.zero.zero3_init_flag")},
      {"deepspeed_config.zero3_save_16bit_model", "ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL",
       "`args.zero.stage3_gather_16bit_weights_on_model_save`",
       SetBool("args.zero.stage3_gather_16bit_weights_on_model_save")},
      {"deepspeed_config.deepspeed_multinode_launcher", "",
       "no effect (tools/launch, torchrun, srun or mpirun start the ranks)",
       NoEffect("has no effect here (tools/launch, torchrun, srun or mpirun start the ranks)")},
      {"deepspeed_config.deepspeed_hostfile", "", "unset only",
       Refuse("is not supported: start one tools/launch per host (--nnodes, --node_rank)")},
      {"deepspeed_config.deepspeed_inclusion_filter", "", "unset only",
       Refuse("is not supported: start one tools/launch per host (--nnodes, --node_rank)")},
      {"deepspeed_config.deepspeed_exclusion_filter", "", "unset only",
       Refuse("is not supported: start one tools/launch per host (--nnodes, --node_rank)")},
      {"deepspeed_config.deepspeed_moe_layer_cls_names", "ACCELERATE_DEEPSPEED_MOE_LAYER_CLS_NAMES",
       "unset only", Refuse("is not supported: the decoders here have no mixture of experts")},
      {"deepspeed_config.deepspeed_fields_from_accelerate_config", "ACCELERATE_CONFIG_DS_FIELDS",
       "no effect (the keys above are mapped one by one)",
       NoEffect("has no effect here (the keys are mapped one by one)")},
  };
  return *rows;
}

const KeyRow* FindRow(const std::string& key) {
  for (const KeyRow& row : Rows()) {
    if (key == row.key) return &row;
  }
  return nullptr;
}

// fsdp_config.* needs distributed_type FSDP, deepspeed_config.* DEEPSPEED.
bool SectionApplies(const AccelerateSetting& s, Context& c) {
  const std::pair<const char*, const char*> sections[] = {{"fsdp_config.", "FSDP"},
                                                          {"deepspeed_config.", "DEEPSPEED"}};
  for (const auto& [prefix, type] : sections) {
    if (absl::StartsWith(s.key, prefix) && c.distributed_type != type) {
      c.Error(s, absl::StrCat("is set but distributed_type is ", c.distributed_type,
                              ": set distributed_type: ", type, " or remove it"));
      return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<AccelerateMapping> MapAccelerateSettings(
    const std::vector<AccelerateSetting>& settings) {
  AccelerateMapping mapping;
  std::vector<std::string> errors;
  Context c;
  c.out = &mapping;
  c.errors = &errors;
  for (const AccelerateSetting& s : settings) c.by_key[s.key] = &s;
  if (const AccelerateSetting* t = c.Find("distributed_type")) {
    c.distributed_type = absl::AsciiStrToUpper(t->value);
  }
  if (const AccelerateSetting* v = c.Find("fsdp_config.fsdp_version")) {
    c.fsdp_version = v->value == "2" ? 2 : 1;
  }
  // distributed_type first: it selects the engine the other keys fill in.
  std::vector<const AccelerateSetting*> ordered;
  for (const AccelerateSetting& s : settings) {
    (s.key == "distributed_type" ? ordered.insert(ordered.begin(), &s)
                                 : ordered.insert(ordered.end(), &s));
  }
  for (const AccelerateSetting* s : ordered) {
    const KeyRow* row = FindRow(s->key);
    if (row == nullptr) {
      c.Error(*s, "is not an Accelerate setting this framework knows (docs/ACCELERATE.md lists "
                  "them); remove it");
      continue;
    }
    if (SectionApplies(*s, c)) row->handle(*s, c);
  }
  if (c.distributed_type == "FSDP" && c.Find("fsdp_config.fsdp_version") == nullptr) {
    c.Set("args.fsdp.version", "1");  // Accelerate's default
  }
  if (!errors.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the Accelerate configuration cannot be used as it is:\n", absl::StrJoin(errors, "\n")));
  }
  return mapping;
}

std::vector<AccelerateSetting> AccelerateSettingsFromEnvironment(
    const std::vector<std::string>& environment) {
  std::map<std::string, std::string> env;
  for (const std::string& entry : environment) {
    const size_t eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  const auto is_true = [&](const char* name) {
    bool b = false;
    auto it = env.find(name);
    return it != env.end() && ParseBool(it->second, &b) && b;
  };
  std::vector<AccelerateSetting> settings;
  const bool fsdp = is_true("ACCELERATE_USE_FSDP");
  const bool deepspeed = is_true("ACCELERATE_USE_DEEPSPEED");
  if (!fsdp && !deepspeed && env.count("ACCELERATE_MIXED_PRECISION") == 0 &&
      env.count("ACCELERATE_USE_CPU") == 0) {
    return settings;
  }
  if (fsdp && deepspeed) {
    settings.push_back({"distributed_type", "FSDP and DEEPSPEED",
                        "ACCELERATE_USE_FSDP and ACCELERATE_USE_DEEPSPEED"});
  } else if (fsdp || deepspeed) {
    settings.push_back({"distributed_type", fsdp ? "FSDP" : "DEEPSPEED",
                        fsdp ? "ACCELERATE_USE_FSDP" : "ACCELERATE_USE_DEEPSPEED"});
  }
  const auto gated = [&](const std::string& name) {
    if (absl::StartsWith(name, "FSDP_")) return fsdp;
    if (absl::StartsWith(name, "ACCELERATE_DEEPSPEED_") || name == "ACCELERATE_CONFIG_DS_FIELDS" ||
        absl::StartsWith(name, "ACCELERATE_GRADIENT_")) {
      return deepspeed;
    }
    return true;
  };
  std::map<std::string, bool> known;
  for (const KeyRow& row : Rows()) {
    const std::string name = row.env;
    if (name.empty() || absl::StrContains(name, ",")) continue;
    known[name] = true;
    auto it = env.find(name);
    if (it != env.end() && gated(name)) settings.push_back({row.key, it->second, name});
  }
  for (const auto& [name, value] : env) {
    const bool ours = (fsdp && absl::StartsWith(name, "FSDP_")) ||
                      (deepspeed && absl::StartsWith(name, "ACCELERATE_DEEPSPEED_"));
    if (ours && known.count(name) == 0) settings.push_back({name, value, name});
  }
  return settings;
}

std::vector<AccelerateSetting> AccelerateSettingsFromEnvironment() {
  std::vector<std::string> environment;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) environment.emplace_back(*e);
  return AccelerateSettingsFromEnvironment(environment);
}

std::string AccelerateKeyTableMarkdown() {
  std::string out =
      "| YAML key (`accelerate config`) | variable (`accelerate launch`) | maps to |\n"
      "|---|---|---|\n";
  for (const KeyRow& row : Rows()) {
    const std::string env = row.env[0] == '\0' ? "" : absl::StrCat("`", row.env, "`");
    absl::StrAppend(&out, "| `", row.key, "` | ", env, " | ", row.maps_to, " |\n");
  }
  return out;
}

}  // namespace cpptrain
