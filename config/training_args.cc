#include "config/training_args.h"

#include <unistd.h>

#include <cstring>
#include <ctime>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <regex>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "config/hf_training_args.h"
#include "config/internal/validation.h"
#include "config/text_proto.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace cpptrain {

namespace {

using config_internal::Problems;
using proto::TrainingArguments;

// "nan", "inf" or "-inf" as a config would spell them.
std::string NonFiniteName(double value) {
  if (std::isnan(value)) return "nan";
  return value > 0 ? "inf" : "-inf";
}

// One problem per float or double field set to NaN or an infinity, anywhere in `message`
// (nested messages and repeated fields included), named by its path from `prefix`. Found by
// reflection, so a field added to the protos later is covered without a new rule: no field of
// a training config means anything when it is not finite, and the range rules below compare
// with < and >, which NaN passes.
void CheckFinite(const google::protobuf::Message& message, const std::string& prefix,
                 Problems* problems) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* reflection = message.GetReflection();
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    const std::string name = absl::StrCat(prefix, field->name());
    const int count = field->is_repeated() ? reflection->FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string path = field->is_repeated() ? absl::StrCat(name, "[", i, "]") : name;
      double value = 0;
      switch (field->cpp_type()) {
        case FieldDescriptor::CPPTYPE_DOUBLE:
          value = field->is_repeated() ? reflection->GetRepeatedDouble(message, field, i)
                                       : reflection->GetDouble(message, field);
          break;
        case FieldDescriptor::CPPTYPE_FLOAT:
          value = field->is_repeated() ? reflection->GetRepeatedFloat(message, field, i)
                                       : reflection->GetFloat(message, field);
          break;
        case FieldDescriptor::CPPTYPE_MESSAGE:
          CheckFinite(field->is_repeated() ? reflection->GetRepeatedMessage(message, field, i)
                                           : reflection->GetMessage(message, field),
                      absl::StrCat(path, "."), problems);
          continue;
        default:
          continue;
      }
      if (std::isfinite(value)) continue;
      problems->push_back(absl::StrCat(path, "=", NonFiniteName(value),
                                       " is not a finite number; set it to a finite value (or "
                                       "leave it unset for its default)"));
    }
  }
}

Problems TrainingArgumentsProblems(const TrainingArguments& args) {
  Problems problems;
  CheckFinite(args, "", &problems);
  config_internal::CheckSteps(args, &problems);
  config_internal::CheckLoop(args, &problems);
  config_internal::CheckOptimizerAndScheduler(args, &problems);
  config_internal::CheckEngine(args, &problems);
  return problems;
}

// One InvalidArgument error listing every problem on its own line, or OK.
absl::Status ToStatus(const std::string& what, const Problems& problems) {
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("invalid ", what, " (", problems.size(),
                                                 problems.size() == 1 ? " problem" : " problems",
                                                 "):\n  ", absl::StrJoin(problems, "\n  ")));
}

absl::Status WithSource(const std::string& path, const absl::Status& status) {
  if (status.ok() || path.empty()) return status;
  return absl::Status(status.code(), absl::StrCat(path, ": ", status.message()));
}

// The JSONL options: set only with format JSONL, and in range.
void CheckJsonlData(const proto::DataSpec& data, Problems* problems) {
  const bool jsonl = data.format() == proto::DataSpec::JSONL;
  if (!jsonl) {
    for (const auto& [set, name] :
         std::vector<std::pair<bool, const char*>>{
             {data.has_max_length(), "max_length"},
             {data.has_packing(), "packing"},
             {data.has_packing_strategy(), "packing_strategy"},
             {data.has_padding_free(), "padding_free"},
             {data.has_completion_only_loss(), "completion_only_loss"},
             {data.has_assistant_only_loss(), "assistant_only_loss"}}) {
      if (set) {
        problems->push_back(absl::StrCat("data.", name, " is set but data.format is ",
                                         proto::DataSpec::Format_Name(data.format()),
                                         "; it applies to data.format: JSONL only"));
      }
    }
    return;
  }
  if (data.has_builtin()) {
    problems->push_back(absl::StrCat("data.format=JSONL with data.builtin=\"", data.builtin(),
                                     "\": JSONL reads data.train_file; unset one of them"));
  }
  if (data.max_length() < 2) {
    problems->push_back(absl::StrCat("data.max_length=", data.max_length(),
                                     " must be >= 2 (a token and the one it predicts)"));
  }
  if (data.packing_strategy() != "bfd") {
    problems->push_back(absl::StrCat("data.packing_strategy=\"", data.packing_strategy(),
                                     "\" is not implemented; use \"bfd\" (best-fit decreasing)"));
  }
}

void CheckData(const proto::TrainJob& job, Problems* problems) {
  const proto::DataSpec& data = job.data();
  const bool builtin = data.has_builtin() && !data.builtin().empty();
  const bool train_file = data.has_train_file() && !data.train_file().empty();
  // Without training (args.do_train: false) neither is needed.
  if (builtin == train_file && (train_file || job.args().do_train())) {
    problems->push_back(
        absl::StrCat("data: give exactly one of data.train_file and data.builtin (saw train_file=",
                     train_file ? "\"" + data.train_file() + "\"" : "<unset>",
                     ", builtin=", builtin ? "\"" + data.builtin() + "\"" : "<unset>", ")"));
  }
  if (data.seq_len() < 1) {
    problems->push_back(absl::StrCat("data.seq_len=", data.seq_len(), " must be >= 1"));
  }
  CheckJsonlData(data, problems);
  if (builtin && data.builtin_train_samples() < 1) {
    problems->push_back(
        absl::StrCat("data.builtin_train_samples=", data.builtin_train_samples(), " must be >= 1"));
  }
  const TrainingArguments::Strategy eval = job.args().eval_strategy();
  if (eval == TrainingArguments::NO) return;
  const bool eval_file = data.has_eval_file() && !data.eval_file().empty();
  if (!eval_file && !builtin) {
    problems->push_back(absl::StrCat("args.eval_strategy=", TrainingArguments::Strategy_Name(eval),
                                     " needs evaluation data; set data.eval_file or use "
                                     "data.builtin, or set args.eval_strategy=NO"));
  } else if (!eval_file && data.builtin_eval_samples() < 1) {
    problems->push_back(absl::StrCat("args.eval_strategy=", TrainingArguments::Strategy_Name(eval),
                                     " needs evaluation data, but data.builtin_eval_samples=",
                                     data.builtin_eval_samples(), "; set it >= 1"));
  }
}


// Hugging Face's string form of `fsdp` ("full_shard auto_wrap", "shard_grad_op offload") as
// the text-format body of our FsdpConfig: FSDP1 (transformers' fsdp string without an fsdp
// version), the one sharding strategy named (FULL_SHARD when none), offload_params with
// "offload", and auto_wrap_policy TRANSFORMER_BASED_WRAP with "auto_wrap", NO_WRAP without it
// (transformers wraps nothing then). The same errors as transformers for offload alone and for
// two strategies. transformers 5's boolean form: true is FSDP with the block's defaults (FSDP2,
// as transformers' fsdp_config defaults to), false is "" (no FSDP).
absl::StatusOr<std::string> FsdpBodyFromHfString(absl::string_view value) {
  const std::string lower = absl::AsciiStrToLower(absl::StripAsciiWhitespace(value));
  if (lower == "true" || lower == "1") return std::string("{}");
  if (lower == "false" || lower == "0") return std::string();
  static constexpr std::pair<const char*, const char*> kStrategies[] = {
      {"full_shard", "FULL_SHARD"},       {"shard_grad_op", "SHARD_GRAD_OP"},
      {"no_shard", "NO_SHARD"},           {"hybrid_shard", "HYBRID_SHARD"},
      {"hybrid_shard_zero2", "HYBRID_SHARD_ZERO2"}};
  std::vector<std::string> strategies;
  bool offload = false;
  bool auto_wrap = false;
  for (absl::string_view word : absl::StrSplit(value, absl::ByAnyChar(" ,"), absl::SkipEmpty())) {
    const std::string option = absl::AsciiStrToLower(word);
    if (option == "offload") {
      offload = true;
    } else if (option == "auto_wrap") {
      auto_wrap = true;
    } else if (auto it = std::find_if(std::begin(kStrategies), std::end(kStrategies),
                                      [&](const auto& s) { return option == s.first; });
               it != std::end(kStrategies)) {
      strategies.push_back(it->second);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "fsdp=\"", value, "\": \"", word, "\" is not one of Hugging Face's fsdp options "
          "(full_shard, shard_grad_op, no_shard, hybrid_shard, hybrid_shard_zero2, offload, "
          "auto_wrap); or give the fsdp block in braces, fsdp={version: 2}"));
    }
  }
  if (strategies.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("fsdp=\"", value, "\" names ",
                                                   strategies.size(),
                                                   " sharding strategies; name one"));
  }
  if (offload && (strategies.empty() || (strategies[0] != "FULL_SHARD" &&
                                         strategies[0] != "SHARD_GRAD_OP"))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp=\"", value, "\": offload can't work on its own; add it to full_shard or "
        "shard_grad_op (\"full_shard offload\"), as in Hugging Face"));
  }
  return absl::StrCat("{version: 1 sharding_strategy: ",
                      strategies.empty() ? "FULL_SHARD" : strategies[0],
                      " auto_wrap_policy: ", auto_wrap ? "TRANSFORMER_BASED_WRAP" : "NO_WRAP",
                      offload ? " offload_params: true" : "", "}");
}

// The overrides with `fsdp_path`=<Hugging Face's string form> turned into fsdp={...}.
absl::StatusOr<std::vector<std::string>> WithFsdpStringForm(
    const std::vector<std::string>& overrides, absl::string_view fsdp_path) {
  std::vector<std::string> out;
  for (const std::string& assignment : overrides) {
    const size_t eq = assignment.find('=');
    const absl::string_view value =
        eq == std::string::npos ? ""
                                : absl::StripAsciiWhitespace(absl::string_view(assignment).substr(eq + 1));
    if (eq == std::string::npos ||
        absl::StripAsciiWhitespace(absl::string_view(assignment).substr(0, eq)) != fsdp_path ||
        value.empty() || value.front() == '{') {
      out.push_back(assignment);
      continue;
    }
    absl::StatusOr<std::string> body = FsdpBodyFromHfString(value);
    if (!body.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--set=", assignment, ": ", body.status().message()));
    }
    if (!body->empty()) out.push_back(absl::StrCat(fsdp_path, "=", *body));
  }
  return out;
}

// A config file's `fsdp: "full_shard auto_wrap"` (Hugging Face's string form, where our fsdp
// is a message) as `fsdp {...}` on the same line. Only TrainingArguments has a field named
// fsdp; a quoted value after it is never valid text format, so nothing else is changed.
absl::StatusOr<std::string> WithFsdpStringInText(const std::string& text,
                                                 const std::string& path) {
  static const std::regex kFsdpString(
      R"re((^|[\s{;,])fsdp(\s*:\s*)(?:"([^"\\\n]*)"|(true|false|True|False)\b))re");
  std::string out;
  size_t done = 0;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kFsdpString);
       it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    absl::StatusOr<std::string> body = FsdpBodyFromHfString(m[3].matched ? m[3].str() : m[4].str());
    if (!body.ok()) {
      const int line = 1 + std::count(text.begin(), text.begin() + m.position(0), '\n');
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line, ": ", body.status().message()));
    }
    absl::StrAppend(&out, text.substr(done, m.position(0) - done), m[1].str(),
                    body->empty() ? "" : absl::StrCat("fsdp ", *body));
    done = m.position(0) + m.length(0);
  }
  absl::StrAppend(&out, text.substr(done));
  return out;
}

// The rewrite of a config file: fsdp's string form, then Hugging Face's names outside our fields
// (config/hf_training_args.h), whose assignments go to `hf_assignments` and the names they come
// from to `origins`.
TextRewrite HfRewrite(const std::string& path, absl::string_view prefix,
                      std::vector<std::string>* hf_assignments, std::vector<std::string>* origins) {
  return [path, prefix, hf_assignments,
          origins](const std::string& text) -> absl::StatusOr<std::string> {
    CT_ASSIGN_OR_RETURN(const std::string with_fsdp, WithFsdpStringInText(text, path));
    return ExtractHfArguments(with_fsdp, path, prefix, hf_assignments, origins);
  };
}

// Whether the field a dotted path ("args.fused_kernels") names is set in `msg`.
bool PathIsSet(const google::protobuf::Message& msg, absl::string_view path) {
  const google::protobuf::Message* at = &msg;
  const std::vector<absl::string_view> parts = absl::StrSplit(path, '.');
  for (size_t i = 0; i < parts.size(); ++i) {
    const google::protobuf::FieldDescriptor* field =
        at->GetDescriptor()->FindFieldByName(std::string(parts[i]));
    if (field == nullptr || field->is_repeated() || !at->GetReflection()->HasField(*at, field)) {
      return false;
    }
    if (i + 1 == parts.size()) return true;
    if (field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) return false;
    at = &at->GetReflection()->GetMessage(*at, field);
  }
  return false;
}

// A Hugging Face name in the file maps onto a field the file also sets, to another value
// (use_liger_kernel: true beside fused_kernels: false): an error naming both, not a silent
// choice.
absl::Status CheckMappedAgainstFile(const std::vector<std::string>& from_file,
                                    const std::vector<std::string>& origins,
                                    const google::protobuf::Message& msg) {
  for (size_t i = 0; i < from_file.size(); ++i) {
    const std::string& assignment = from_file[i];
    const size_t eq = assignment.find('=');
    if (eq == std::string::npos) continue;
    const std::string field = assignment.substr(0, eq);
    if (!PathIsSet(msg, field)) continue;
    std::unique_ptr<google::protobuf::Message> mapped(msg.New());
    mapped->CopyFrom(msg);
    CT_RETURN_IF_ERROR(ApplyOverrides({assignment}, mapped.get()));
    if (mapped->SerializeAsString() == msg.SerializeAsString()) continue;
    return absl::InvalidArgumentError(absl::StrCat(
        "a Hugging Face name in the file",
        i < origins.size() ? absl::StrCat(" (", origins[i], ")") : std::string(), " sets ",
        assignment, ", but the file also sets ", field,
        " to another value; keep one of the two"));
  }
  return absl::OkStatus();
}

// The file at `path` (none when empty) into `msg`, then what its Hugging Face names stand for,
// then the overrides (fsdp's string form and Hugging Face's names translated).
absl::Status LoadWithHfNames(const std::string& path, const std::vector<std::string>& overrides,
                             absl::string_view prefix, google::protobuf::Message* msg) {
  std::vector<std::string> from_file;
  std::vector<std::string> origins;
  if (!path.empty()) {
    CT_RETURN_IF_ERROR(
        LoadTextProtoFile(path, msg, HfRewrite(path, prefix, &from_file, &origins)));
  }
  CT_RETURN_IF_ERROR(WithSource(path, CheckMappedAgainstFile(from_file, origins, *msg)));
  CT_RETURN_IF_ERROR(WithSource(path, ApplyOverrides(from_file, msg)));
  CT_ASSIGN_OR_RETURN(const std::vector<std::string> with_fsdp,
                      WithFsdpStringForm(overrides, absl::StrCat(prefix, "fsdp")));
  CT_ASSIGN_OR_RETURN(const std::vector<std::string> assignments,
                      TranslateHfOverrides(with_fsdp, prefix));
  return ApplyOverrides(assignments, msg);
}

}  // namespace

absl::StatusOr<TrainingArguments> LoadTrainingArguments(const std::string& path,
                                                        const std::vector<std::string>& overrides) {
  TrainingArguments args;
  CT_RETURN_IF_ERROR(LoadWithHfNames(path, overrides, "", &args));
  CT_RETURN_IF_ERROR(WithSource(path, ValidateTrainingArguments(args)));
  return args;
}

absl::StatusOr<proto::TrainJob> LoadTrainJob(const std::string& path,
                                             const std::vector<std::string>& overrides) {
  proto::TrainJob job;
  CT_RETURN_IF_ERROR(LoadWithHfNames(path, overrides, "args.", &job));
  CT_RETURN_IF_ERROR(WithSource(path, ValidateTrainJob(job)));
  return job;
}

proto::DdpConfig ResolvedDdpConfig(const TrainingArguments& args) {
  proto::DdpConfig ddp = args.ddp();
  if (args.has_ddp_find_unused_parameters()) {
    ddp.set_find_unused_parameters(args.ddp_find_unused_parameters());
  }
  if (args.has_ddp_bucket_cap_mb()) ddp.set_bucket_cap_mb(args.ddp_bucket_cap_mb());
  if (args.has_ddp_broadcast_buffers()) ddp.set_broadcast_buffers(args.ddp_broadcast_buffers());
  return ddp;
}

absl::Status ValidateTrainingArguments(const TrainingArguments& args) {
  return ToStatus("training arguments", TrainingArgumentsProblems(args));
}

absl::Status ValidateTrainJob(const proto::TrainJob& job) {
  Problems problems;
  for (const std::string& problem : TrainingArgumentsProblems(job.args())) {
    problems.push_back(absl::StrCat("args: ", problem));
  }
  // args was checked above; every other part of the job here.
  proto::TrainJob rest = job;
  rest.clear_args();
  CheckFinite(rest, "", &problems);
  const proto::ModelSpec& model = job.model();
  if (model.has_pretrained() && model.pretrained().empty()) {
    problems.push_back(
        "model.pretrained is \"\"; set it to a Hugging Face model directory (config.json and "
        "safetensors weights)");
  } else if (model.has_pretrained() && model.has_name()) {
    problems.push_back(absl::StrCat(
        "model sets both pretrained \"", model.pretrained(), "\" and name \"", model.name(),
        "\"; the directory's config.json gives the shape: drop name (on the command line, "
        "--set='model={pretrained: \"DIR\"}' replaces the whole model)"));
  } else if (!model.has_pretrained() && (model.model_case() == proto::ModelSpec::MODEL_NOT_SET ||
                                         (model.has_name() && model.name().empty()))) {
    problems.push_back(
        "model: no model given; set model.name (a named config such as \"tiny\"), "
        "model.decoder, or model.pretrained (a Hugging Face directory)");
  }
  CheckData(job, &problems);
  return ToStatus("train job", problems);
}

std::vector<std::string> TrainingArgumentsWarnings(const TrainingArguments& args) {
  std::vector<std::string> warnings;
  if (args.accelerator_config().non_blocking() && !args.dataloader_pin_memory()) {
    warnings.push_back(
        "accelerator_config.non_blocking=true with dataloader_pin_memory=false: host-to-device "
        "copies from pageable memory are synchronous; enable both for overlap");
  }
  if (args.load_best_model_at_end() && args.eval_strategy() == TrainingArguments::NO) {
    warnings.push_back(
        "load_best_model_at_end=true with eval_strategy=NO never evaluates, so no best model "
        "is tracked; set eval_strategy (and a matching save_strategy)");
  }
  config_internal::AddEngineWarnings(args, &warnings);
  return warnings;
}

absl::Status ValidateForWorld(const TrainingArguments& args, int world_size) {
  Problems problems;
  if (world_size < 1) {
    problems.push_back(absl::StrCat("world_size=", world_size, " must be >= 1"));
    return ToStatus("training arguments for this world", problems);
  }
  if (args.accelerator_config().split_batches()) {
    const std::pair<const char*, int> batches[] = {
        {"per_device_train_batch_size", args.per_device_train_batch_size()},
        {"per_device_eval_batch_size", args.per_device_eval_batch_size()},
    };
    for (const auto& [name, batch] : batches) {
      if (batch % world_size == 0) continue;
      problems.push_back(absl::StrCat(
          "accelerator_config.split_batches=true: to use a data loader in split_batches mode, "
          "the batch size (",
          name, "=", batch, ") needs to be a round multiple of the number of processes (",
          world_size, "); change the batch size or turn split_batches off"));
    }
  }
  if (args.has_fsdp()) {
    const proto::FsdpConfig& fsdp = args.fsdp();
    const int replicate = fsdp.dp_replicate_size();
    const int shard = fsdp.dp_shard_size();
    if (replicate >= 1 && shard > 0 && replicate * shard != world_size) {
      problems.push_back(absl::StrCat("fsdp.dp_replicate_size=", replicate,
                                      " x fsdp.dp_shard_size=", shard, " = ", replicate * shard,
                                      " does not match the world size ", world_size,
                                      "; make the product equal the number of processes"));
    } else if (replicate >= 1 && shard == 0 && world_size % replicate != 0) {
      problems.push_back(absl::StrCat("fsdp.dp_replicate_size=", replicate,
                                      " does not divide the world size ", world_size,
                                      " (fsdp.dp_shard_size=0 shards over the rest)"));
    }
  }
  return ToStatus("training arguments for this world", problems);
}

double ResolvedEvalSteps(const TrainingArguments& args) {
  return args.has_eval_steps() && args.eval_steps() != 0 ? args.eval_steps() : args.logging_steps();
}

std::string ResolvedMetricForBestModel(const TrainingArguments& args) {
  const std::string metric =
      args.has_metric_for_best_model() && !args.metric_for_best_model().empty()
          ? args.metric_for_best_model()
          : "loss";
  return absl::StartsWith(metric, "eval_") ? metric : absl::StrCat("eval_", metric);
}

bool ReportsTo(const TrainingArguments& args, const std::string& integration) {
  for (const std::string& entry : args.report_to()) {
    if (entry == integration || entry == "all") return true;
  }
  return false;
}

std::string ResolvedLoggingDir(const TrainingArguments& args) {
  if (args.has_logging_dir() && !args.logging_dir().empty()) return args.logging_dir();
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "host");
  char when[64] = {};
  const std::time_t now = std::time(nullptr);
  std::tm local = {};
  localtime_r(&now, &local);
  std::strftime(when, sizeof(when), "%b%d_%H-%M-%S", &local);
  std::string dir = args.output_dir();
  if (!dir.empty() && dir.back() != '/') dir += '/';
  return absl::StrCat(dir, "runs/", when, "_", host);
}

std::string ResolvedRunName(const TrainingArguments& args) {
  return args.has_run_name() && !args.run_name().empty() ? args.run_name() : args.output_dir();
}

const std::vector<std::string>& SupportedOptimizers() {
  static const std::vector<std::string> kNames = {"adamw_torch_fused", "adamw_torch", "sgd"};
  return kNames;
}

bool ResolvedGreaterIsBetter(const TrainingArguments& args) {
  if (args.has_greater_is_better()) return args.greater_is_better();
  return !absl::EndsWith(ResolvedMetricForBestModel(args), "loss");
}

int64_t ResolveStepInterval(double steps, int64_t max_steps) {
  if (steps > 0 && steps < 1) {
    return static_cast<int64_t>(std::ceil(static_cast<double>(max_steps) * steps));
  }
  return static_cast<int64_t>(steps);
}

int64_t ResolveWarmupSteps(const TrainingArguments& args, int64_t total_steps) {
  const double warmup = args.warmup_steps();
  if (warmup >= 1) return static_cast<int64_t>(warmup);
  return static_cast<int64_t>(std::ceil(static_cast<double>(total_steps) * warmup));
}

int64_t ResolvedDataSeed(const TrainingArguments& args) {
  return args.has_data_seed() ? args.data_seed() : args.seed();
}

int32_t ResolvedGradientAccumulationSteps(const TrainingArguments& args) {
  const proto::GradientAccumulationKwargs& ga =
      args.accelerator_config().gradient_accumulation_kwargs();
  return ga.has_num_steps() ? ga.num_steps() : args.gradient_accumulation_steps();
}

}  // namespace cpptrain
