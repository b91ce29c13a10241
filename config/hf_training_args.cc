#include "config/hf_training_args.h"

#include <algorithm>
#include <optional>
#include <regex>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/logging.h"
#include "config/hf_json_args.h"

namespace cpptrain {
namespace {

enum class Status { kMapped, kNoEffect, kRefused };

using Translation = absl::StatusOr<std::vector<std::string>>;
// A value-dependent rule; `refuse` builds the entry's refusal for a value it does not take.
using Rule = Translation (*)(absl::string_view value);

struct Entry {
  const char* name;
  Status status;
  const char* hf_default;  // as transformers prints it
  // kMapped: what it maps to; kNoEffect: why nothing changes; kRefused: why, and the
  // equivalent here.
  const char* text;
  Rule rule = nullptr;  // null: kNoEffect takes any value, the others only the default
  // Also a field of ours (accelerator_config): only Hugging Face's form of the value (a JSON
  // file's path or a JSON object, config/hf_json_args.h) goes through the table.
  bool our_field = false;
};

constexpr char kCompile[] =
    "LibTorch has no TorchDynamo; the compiled speed comes from fused_kernels (default true: "
    "fused RMSNorm, rotary, SwiGLU, LM head with the loss) and cuda_graphs: true (one graph "
    "launch per step)";
constexpr char kHub[] =
    "there is no Hugging Face Hub client here; a checkpoint's model is Hugging Face safetensors "
    "under output_dir: upload it with `hf upload <repo_id> <output_dir>`";
constexpr char kTrackio[] =
    "Trackio is not an integration here; report_to: tensorboard (metrics.jsonl is always "
    "written)";
constexpr char kCheckpointingKwargs[] =
    "{\"use_reentrant\": true or false} is accepted and changes nothing: recomputation here is "
    "the reentrant kind (models/recompute.h), and either gives the same gradients; other keys "
    "are refused";
constexpr char kHalfEval[] =
    "there is no separate evaluation precision: evaluation runs the model in the precision "
    "training set up (bf16, fp16 or fp32)";

// Lowercase, unquoted; None, null and empty containers are "".
std::string Normalized(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
      value.back() == value.front()) {
    value = value.substr(1, value.size() - 2);
  }
  std::string out = absl::AsciiStrToLower(value);
  if (out == "none" || out == "null" || out == "[]" || out == "{}") return "";
  return out;
}

std::optional<bool> AsBool(absl::string_view value) {
  const std::string v = Normalized(value);
  if (v == "true" || v == "1") return true;
  if (v == "false" || v == "0") return false;
  return std::nullopt;
}

Translation Nothing() { return std::vector<std::string>{}; }

// deepspeed, fsdp_config, accelerator_config: a JSON file or object (config/hf_json_args.h);
// its notes are logged once, from rank 0.
Translation JsonArgument(absl::string_view name, absl::string_view value) {
  absl::StatusOr<HfJsonTranslation> translation = TranslateHfJsonArgument(name, value);
  if (!translation.ok()) return translation.status();
  for (const std::string& note : translation->notes) CT_LOG_RANK0(WARNING) << note;
  return std::move(translation->assignments);
}

constexpr char kDeepSpeed[] =
    "a DeepSpeed JSON (path or object) converted by config/ds_config.h: zero { } from "
    "zero_optimization; bf16, fp16, max_grad_norm, batch sizes, AdamW's settings and the "
    "WarmupLR/WarmupDecayLR/WarmupCosineLR scheduler from their keys; \"auto\" keeps the "
    "training arguments' value (docs/ACCELERATE.md, \"deepspeed=, fsdp_config=, "
    "accelerator_config=\")";
constexpr char kFsdpConfig[] =
    "a JSON (path or object) of FSDP settings, keys with or without fsdp_: fsdp.* as "
    "Accelerate's fsdp_config keys map (version, reshard_after_forward, cpu_offload, "
    "auto_wrap_policy, transformer_layer_cls_to_wrap, ...); selects FSDP (docs/ACCELERATE.md)";
constexpr char kAcceleratorConfig[] =
    "the field of the same name; also a JSON (path or object) with transformers' keys, each "
    "onto accelerator_config.<key> (docs/ACCELERATE.md)";

Translation Refuse(absl::string_view name, absl::string_view value, absl::string_view why) {
  const std::string shown = name == "hub_token" ? "<hidden>" : std::string(value);
  return absl::InvalidArgumentError(absl::StrCat(
      name, "=", shown, " (Hugging Face TrainingArguments): ", why,
      "; leave it unset (Hugging Face's default changes nothing)"));
}

Translation NotBool(absl::string_view name, absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat(name, "=", value, " is not a boolean; give true or false"));
}

Translation CheckpointingKwargs(absl::string_view name, absl::string_view value) {
  static const std::regex kReentrantOnly(
      R"re(\{\s*["']?use_reentrant["']?\s*:\s*(true|false|True|False|0|1)\s*,?\s*\})re");
  if (std::regex_match(std::string(absl::StripAsciiWhitespace(value)), kReentrantOnly)) {
    return Nothing();
  }
  return Refuse(name, value,
                "only use_reentrant is understood (and changes nothing: recomputation here is "
                "the reentrant kind, models/recompute.h); gradient_checkpointing: true turns "
                "recomputation on");
}

const std::vector<Entry>& Entries() {
  static const std::vector<Entry>* const kEntries = new std::vector<Entry>{
      {"optim_args", Status::kRefused, "None",
       "the optimizer's settings are fields here: adam_beta1, adam_beta2, adam_epsilon, "
       "weight_decay (optim: adamw_torch_fused, adamw_torch or sgd)"},
      {"optim_target_modules", Status::kRefused, "None",
       "only GaLore/APOLLO-style optimizers read it, and none is implemented; optim is "
       "adamw_torch_fused, adamw_torch or sgd"},
      {"bf16_full_eval", Status::kRefused, "False", kHalfEval},
      {"fp16_full_eval", Status::kRefused, "False", kHalfEval},
      {"tf32", Status::kRefused, "None",
       "TF32 matmuls stay off (LibTorch's default), so false changes nothing; for tensor-core "
       "matmuls train in bf16: true",
       [](absl::string_view v) -> Translation {
         const std::optional<bool> on = AsBool(v);
         if (!on) return NotBool("tf32", v);
         if (!*on) return Nothing();
         return Refuse("tf32", v,
                       "TF32 matmuls are not switched on here; train in bf16: true for "
                       "tensor-core matmuls");
       }},
      {"activation_checkpointing", Status::kMapped, "None", "gradient_checkpointing",
       [](absl::string_view v) -> Translation {
         const std::optional<bool> on = AsBool(v);
         if (!on) return NotBool("activation_checkpointing", v);
         return std::vector<std::string>{
             absl::StrCat("gradient_checkpointing=", *on ? "true" : "false")};
       }},
      {"activation_checkpointing_kwargs", Status::kNoEffect, "None", kCheckpointingKwargs,
       [](absl::string_view v) {
         return CheckpointingKwargs("activation_checkpointing_kwargs", v);
       }},
      {"gradient_checkpointing_kwargs", Status::kNoEffect, "None", kCheckpointingKwargs,
       [](absl::string_view v) { return CheckpointingKwargs("gradient_checkpointing_kwargs", v); }},
      {"torch_compile", Status::kRefused, "False", kCompile},
      {"torch_compile_backend", Status::kRefused, "None", kCompile},
      {"torch_compile_mode", Status::kRefused, "None", kCompile},
      {"use_liger_kernel", Status::kMapped, "False",
       "fused_kernels: true (false leaves fused_kernels, default true; fused_kernels: false is "
       "the eager reference)",
       [](absl::string_view v) -> Translation {
         const std::optional<bool> on = AsBool(v);
         if (!on) return NotBool("use_liger_kernel", v);
         if (!*on) return Nothing();
         return std::vector<std::string>{"fused_kernels=true"};
       }},
      {"liger_kernel_config", Status::kRefused, "None",
       "fused_kernels switches all of the model's fused kernels together; there is no "
       "per-kernel configuration"},
      {"use_cache", Status::kRefused, "False",
       "the model keeps no KV cache, in training or in tools/generate"},
      {"neftune_noise_alpha", Status::kRefused, "None",
       "NEFTune's embedding noise is not implemented"},
      {"torch_empty_cache_steps", Status::kRefused, "None",
       "the CUDA caching allocator is never emptied on a schedule; against fragmentation set "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (LibTorch reads it too)"},
      {"log_on_each_node", Status::kNoEffect, "True",
       "progress lines come from global rank 0 only; every rank's warnings and errors carry "
       "its rank"},
      {"include_num_input_tokens_seen", Status::kNoEffect, "'no'",
       "num_input_tokens_seen is always counted, as \"non_padding\" (tokens the attention mask "
       "marks); \"all\" is refused",
       [](absl::string_view v) -> Translation {
         if (Normalized(v) == "all") {
           return Refuse("include_num_input_tokens_seen", v,
                         "num_input_tokens_seen counts non-padding tokens (\"non_padding\"), "
                         "always; padding is not counted");
         }
         return Nothing();
       }},
      {"log_level", Status::kRefused, "'passive'",
       "the log level is glog's: set GLOG_minloglevel (0 info, 1 warning, 2 error, 3 fatal) in "
       "the environment",
       [](absl::string_view v) -> Translation {
         const std::string level = Normalized(v);
         if (level == "passive") return Nothing();
         const char* number = level == "debug" || level == "info" ? "0"
                              : level == "warning"                ? "1"
                              : level == "error"                  ? "2"
                              : level == "critical"               ? "3"
                                                                  : nullptr;
         if (number == nullptr) {
           return absl::InvalidArgumentError(absl::StrCat(
               "log_level=", v, " is not one of Hugging Face's levels (debug, info, warning, "
               "error, critical, passive)"));
         }
         return Refuse("log_level", v,
                       absl::StrCat("the log level is glog's, set in the environment: "
                                    "GLOG_minloglevel=", number));
       }},
      {"log_level_replica", Status::kRefused, "'warning'",
       "every rank logs at the one glog level (GLOG_minloglevel); progress lines come from rank "
       "0 only"},
      {"project", Status::kRefused, "'huggingface'", kTrackio},
      {"trackio_space_id", Status::kRefused, "None", kTrackio},
      {"trackio_bucket_id", Status::kRefused, "None", kTrackio},
      {"trackio_static_space_id", Status::kRefused, "None", kTrackio},
      {"prediction_loss_only", Status::kNoEffect, "False",
       "evaluation gathers logits only when a compute_metrics is set, else reports the loss "
       "alone; do_predict writes predictions"},
      {"eval_do_concat_batches", Status::kRefused, "True",
       "gathered predictions are always concatenated across batches (padded with -100) for "
       "compute_metrics"},
      {"eval_use_gather_object", Status::kRefused, "False",
       "predictions are gathered as tensors (ranks need equal batches)"},
      {"include_for_metrics", Status::kRefused, "[]",
       "compute_metrics receives predictions and labels only (no inputs or losses)"},
      {"batch_eval_metrics", Status::kRefused, "False",
       "compute_metrics runs once over all gathered predictions; there is no per-batch mode"},
      {"save_on_each_node", Status::kRefused, "False",
       "each checkpoint is written once, into output_dir; there are no per-node copies"},
      {"enable_jit_checkpoint", Status::kNoEffect, "False",
       "always on: SIGTERM or SIGINT finishes the step and saves a checkpoint "
       "(trainer/stop_signals.h)"},
      {"push_to_hub", Status::kRefused, "False", kHub},
      {"hub_token", Status::kRefused, "None", kHub},
      {"hub_private_repo", Status::kRefused, "None", kHub},
      {"hub_model_id", Status::kRefused, "None", kHub},
      {"hub_strategy", Status::kRefused, "'every_save'", kHub},
      {"hub_always_push", Status::kRefused, "False", kHub},
      {"hub_revision", Status::kRefused, "None", kHub},
      {"ignore_data_skip", Status::kRefused, "False",
       "resume_from_checkpoint always continues the data where the checkpoint left it"},
      {"restore_callback_states_from_checkpoint", Status::kRefused, "False",
       "a checkpoint holds the trainer state, not callbacks' states"},
      {"full_determinism", Status::kRefused, "False",
       "there is no switch to deterministic kernels; seed and data_seed fix the "
       "initialization and the data order"},
      {"parallelism_config", Status::kRefused, "None",
       "the engine block says the parallelism: fsdp { dp_replicate_size: R dp_shard_size: S } "
       "for HSDP; tensor, context and sequence parallelism are not implemented"},
      {"dataloader_multiprocessing_context", Status::kRefused, "None",
       "the data loader's workers are threads of this process, not processes"},
      {"dataloader_in_order", Status::kRefused, "True", "batches are always delivered in order"},
      {"remove_unused_columns", Status::kNoEffect, "True",
       "token files hold only the model's inputs, so there are no columns to remove"},
      {"label_names", Status::kRefused, "None",
       "the labels are the batch's labels (Hugging Face's default, [\"labels\"]); other names "
       "are not read",
       [](absl::string_view v) -> Translation {
         std::string names = Normalized(v);
         names.erase(std::remove_if(names.begin(), names.end(),
                                    [](char c) { return c == '[' || c == ']' || c == '"' ||
                                                        c == '\'' || absl::ascii_isspace(c); }),
                     names.end());
         if (names.empty() || names == "labels") return Nothing();
         return Refuse("label_names", v,
                       "the labels are the batch's labels ([\"labels\"]); other names are not "
                       "read: name the column labels in the data");
       }},
      {"train_sampling_strategy", Status::kMapped, "'random'",
       "\"group_by_length\": group_by_length: true; \"random\" changes nothing; \"sequential\" "
       "is refused",
       [](absl::string_view v) -> Translation {
         const std::string strategy = Normalized(v);
         if (strategy == "random") return Nothing();
         if (strategy == "group_by_length") {
           return std::vector<std::string>{"group_by_length=true"};
         }
         return Refuse("train_sampling_strategy", v,
                       "training samples are shuffled by data_seed (\"random\") or grouped by "
                       "length (\"group_by_length\"); there is no sequential sampler");
       }},
      {"length_column_name", Status::kNoEffect, "'length'",
       "group_by_length measures each sample's tokens; there is no length column"},
      {"fsdp_config", Status::kMapped, "None", kFsdpConfig,
       [](absl::string_view v) { return JsonArgument("fsdp_config", v); }},
      {"deepspeed", Status::kMapped, "None", kDeepSpeed,
       [](absl::string_view v) { return JsonArgument("deepspeed", v); }},
      {"accelerator_config", Status::kMapped, "None", kAcceleratorConfig,
       [](absl::string_view v) { return JsonArgument("accelerator_config", v); },
       /*our_field=*/true},
      {"debug", Status::kRefused, "''",
       "underflow_overflow and tpu_metrics_debug are not implemented; non-finite losses are "
       "handled by logging_nan_inf_filter"},
      {"skip_memory_metrics", Status::kRefused, "True",
       "Hugging Face's per-stage memory metrics (*_mem_*_delta) are not reported"},
      {"local_rank", Status::kNoEffect, "-1",
       "the rank comes from the launcher's environment (LOCAL_RANK, RANK, WORLD_SIZE)"},
  };
  return *kEntries;
}

const Entry* Find(absl::string_view name) {
  for (const Entry& entry : Entries()) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

const char* StatusName(Status status) {
  switch (status) {
    case Status::kMapped:
      return "mapped";
    case Status::kNoEffect:
      return "accepted, no effect";
    case Status::kRefused:
      return "refused unless default";
  }
  return "";
}

// "a|b|c" of the table's names (our_field ones too), longest first so no name matches a prefix
// of another.
std::string NameAlternation() {
  std::vector<std::string> names;
  for (const Entry& entry : Entries()) names.push_back(entry.name);
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
  return absl::StrJoin(names, "|");
}

}  // namespace

bool IsHfOnlyArgument(absl::string_view name) {
  const Entry* entry = Find(name);
  return entry != nullptr && !entry->our_field;
}

const std::vector<std::string>& HfOnlyArgumentNames() {
  static const std::vector<std::string>* const kNames = [] {
    auto* names = new std::vector<std::string>;
    for (const Entry& entry : Entries()) {
      if (!entry.our_field) names->push_back(entry.name);
    }
    return names;
  }();
  return *kNames;
}

absl::StatusOr<std::vector<std::string>> TranslateHfArgument(absl::string_view name,
                                                             absl::string_view value) {
  const Entry* entry = Find(name);
  if (entry == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("\"", name, "\" is not a Hugging Face name outside our fields"));
  }
  if (Normalized(value) == Normalized(entry->hf_default)) return Nothing();
  if (entry->rule != nullptr) return entry->rule(value);
  if (entry->status == Status::kNoEffect) return Nothing();
  return Refuse(name, value, entry->text);
}

std::string HfArgumentNote(absl::string_view name) {
  const Entry* entry = Find(name);
  if (entry == nullptr) return "";
  switch (entry->status) {
    case Status::kMapped:
      return absl::StrCat("Hugging Face's TrainingArguments.", name, " maps to ", entry->text);
    case Status::kNoEffect:
      return absl::StrCat("Hugging Face's TrainingArguments.", name,
                          " is accepted and changes nothing: ", entry->text);
    case Status::kRefused:
      return absl::StrCat("Hugging Face's TrainingArguments.", name, " (default ",
                          entry->hf_default, ") has no equivalent field: ", entry->text);
  }
  return "";
}

absl::StatusOr<std::vector<std::string>> TranslateHfOverrides(
    const std::vector<std::string>& overrides, absl::string_view prefix) {
  std::vector<std::string> out;
  for (const std::string& assignment : overrides) {
    const size_t eq = assignment.find('=');
    const absl::string_view whole = assignment;
    absl::string_view path =
        eq == std::string::npos ? "" : absl::StripAsciiWhitespace(whole.substr(0, eq));
    const absl::string_view value =
        eq == std::string::npos ? "" : absl::StripAsciiWhitespace(whole.substr(eq + 1));
    const Entry* entry = nullptr;
    if (eq != std::string::npos && absl::ConsumePrefix(&path, prefix)) entry = Find(path);
    if (entry == nullptr || (entry->our_field && !IsHfJsonValue(value))) {
      out.push_back(assignment);
      continue;
    }
    absl::StatusOr<std::vector<std::string>> ours = TranslateHfArgument(path, value);
    if (!ours.ok()) {
      const std::string shown =
          path == "hub_token" ? absl::StrCat(prefix, path, "=<hidden>") : assignment;
      return absl::InvalidArgumentError(
          absl::StrCat("--set=", shown, ": ", ours.status().message()));
    }
    for (const std::string& mapped : *ours) out.push_back(absl::StrCat(prefix, mapped));
  }
  return out;
}

absl::StatusOr<std::string> ExtractHfArguments(const std::string& text, const std::string& path,
                                               absl::string_view prefix,
                                               std::vector<std::string>* assignments,
                                               std::vector<std::string>* origins) {
  // name: "str" | 'str' | [list] | {body} | token, or name {body}; one line each except a body.
  static const std::regex* const kHfField = new std::regex(absl::StrCat(
      R"re((^|[\s{;,])()re", NameAlternation(),
      R"re()(\s*:\s*("[^"\n]*"|'[^'\n]*'|\[[^\]\n]*\]|\{[^{}]*\}|[^\s,;#{}\[\]]+))re",
      R"re(|\s*(\{[^{}]*\})))re"));
  // Matched on a copy with # comments blanked and strings' contents replaced by 'x' (the same
  // length), so a commented-out setting or a string holding "name: value" is left alone; values
  // are read from `text`.
  std::string masked = text;
  char quote = 0;
  for (size_t i = 0; i < masked.size(); ++i) {
    const char c = masked[i];
    if (quote != 0) {
      if (c == quote || c == '\n') {
        quote = 0;
      } else {
        masked[i] = 'x';
        if (c == '\\' && i + 1 < masked.size() && masked[i + 1] != '\n') masked[++i] = 'x';
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '#') {
      for (; i < masked.size() && masked[i] != '\n'; ++i) masked[i] = ' ';
    }
  }
  // Only names in the TrainingArguments block count: FsdpConfig has its own
  // activation_checkpointing. `open` is the stack of blocks open at `scanned`.
  const std::vector<std::string> scope =
      prefix.empty() ? std::vector<std::string>{}
                     : std::vector<std::string>{std::string(absl::StripSuffix(prefix, "."))};
  std::vector<std::string> open;
  std::string last_name;
  size_t scanned = 0;
  auto is_name_char = [](char c) { return absl::ascii_isalnum(c) || c == '_'; };
  auto scan_to = [&](size_t end) {
    for (; scanned < end; ++scanned) {
      const char c = masked[scanned];
      if (is_name_char(c)) {
        if (scanned == 0 || !is_name_char(masked[scanned - 1])) last_name.clear();
        last_name.push_back(c);
      } else if (c == '{' || c == '<') {
        open.push_back(last_name);
      } else if ((c == '}' || c == '>') && !open.empty()) {
        open.pop_back();
      }
    }
  };
  std::string out = text;
  for (auto it = std::sregex_iterator(masked.begin(), masked.end(), *kHfField);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    scan_to(m.position(2));
    if (open != scope) continue;
    const int group = m[4].matched ? 4 : 5;
    const std::string value = text.substr(m.position(group), m.length(group));
    // A field of ours keeps its text-format value; only a quoted path or JSON is Hugging Face's.
    if (Find(m[2].str())->our_field &&
        (group != 4 || (value.front() != '"' && value.front() != '\'') || !IsHfJsonValue(value))) {
      continue;
    }
    absl::StatusOr<std::vector<std::string>> ours = TranslateHfArgument(m[2].str(), value);
    if (!ours.ok()) {
      const int line = 1 + std::count(masked.begin(), masked.begin() + m.position(2), '\n');
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": ", ours.status().message()));
    }
    for (const std::string& mapped : *ours) {
      assignments->push_back(absl::StrCat(prefix, mapped));
      if (origins != nullptr) origins->push_back(m[2].str());
    }
    // Blank the assignment, keeping its newlines so later errors keep their lines.
    for (size_t i = m.position(2); i < static_cast<size_t>(m.position(0) + m.length(0)); ++i) {
      if (out[i] != '\n') out[i] = ' ';
    }
  }
  return out;
}

std::string HfTrainingArgumentsTableMarkdown(
    const std::vector<std::string>& hf_fields,
    const std::function<bool(const std::string&)>& is_our_field) {
  std::string out =
      "| transformers field | status | here |\n"
      "|---|---|---|\n";
  for (const std::string& name : hf_fields) {
    const Entry* entry = Find(name);
    if (is_our_field(name) && (entry == nullptr || !entry->our_field)) {
      absl::StrAppend(&out, "| `", name, "` | accepted | the field of the same name |\n");
    } else if (entry != nullptr) {
      std::string text = entry->text;
      for (size_t at = text.find('|'); at != std::string::npos; at = text.find('|', at + 2)) {
        text.replace(at, 1, "\\|");
      }
      absl::StrAppend(&out, "| `", name, "` | ", StatusName(entry->status), " (default `",
                      entry->hf_default, "`) | ", text, " |\n");
    } else {
      absl::StrAppend(&out, "| `", name, "` | missing | not in config/hf_training_args.cc |\n");
    }
  }
  return out;
}

}  // namespace cpptrain
