#include "jobs/job_model.h"

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf_model.h"
#include "checkpoint/manifest.h"
#include "engines/engine_factory.h"
#include "google/protobuf/text_format.h"
#include "models/configs.h"

namespace cpptrain {
namespace {

std::string FieldText(const google::protobuf::Message& message,
                      const google::protobuf::FieldDescriptor* field) {
  std::string text;
  if (field->is_repeated()) {
    const auto* reflection = message.GetReflection();
    std::vector<std::string> items;
    for (int i = 0; i < reflection->FieldSize(message, field); ++i) {
      std::string item;
      google::protobuf::TextFormat::PrintFieldValueToString(message, field, i, &item);
      items.push_back(item);
    }
    return absl::StrCat("[", absl::StrJoin(items, ", "), "]");
  }
  google::protobuf::TextFormat::PrintFieldValueToString(message, field, -1, &text);
  return text;
}

// Every field set in `given` equals `saved`'s value.
absl::Status CheckGivenFields(const proto::DecoderConfig& given, const proto::DecoderConfig& saved,
                              const std::string& dir) {
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  given.GetReflection()->ListFields(given, &fields);
  for (const auto* field : fields) {
    const std::string want = FieldText(given, field);
    const std::string have = FieldText(saved, field);
    if (want != have) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.decoder.", field->name(), " is ", want, " but model.pretrained '", dir, "' has ",
          field->name(), " ", have,
          " in its config.json: remove the field from model.decoder (the directory gives the "
          "shape) or point pretrained at a model of that shape"));
    }
  }
  return absl::OkStatus();
}

// config.json names the weights' dtype; the model trains from fp32 master weights, with the
// arguments' bf16/fp16 for compute.
void ReportDtype(const std::string& dir, const proto::TrainingArguments& args) {
  absl::StatusOr<std::string> dtype = HfConfigDtype(dir + "/config.json");
  if (!dtype.ok() || dtype->empty()) return;
  CT_LOG_RANK0(INFO) << "model.pretrained '" << dir << "': weights saved as " << *dtype
                     << ", loaded into fp32 parameters";
  if (*dtype == "bfloat16" && !args.bf16()) {
    CT_LOG_RANK0(WARNING) << "config.json's dtype is bfloat16 but args.bf16 is false: compute "
                             "runs in fp32 (set args.bf16: true to train as it was saved)";
  }
}

// The engines that shard a pretrained model as it loads, each rank reading only its own part:
// FSDP2 always, FSDP1 with cpu_ram_efficient_loading, ZeRO-3 with zero3_init_flag.
bool ShardsAtLoad(const proto::TrainingArguments& args) {
  if (args.has_fsdp()) {
    return args.fsdp().version() == 2 || args.fsdp().cpu_ram_efficient_loading();
  }
  return args.has_zero() && args.zero().stage() == 3 && args.zero().zero3_init_flag();
}

}  // namespace

absl::StatusOr<proto::DecoderConfig> ResolveJobModelConfig(const proto::ModelSpec& spec) {
  if (!spec.has_pretrained()) return ResolveModelSpec(spec);
  if (spec.has_name()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model sets both pretrained '", spec.pretrained(), "' and name \"",
                     spec.name(), "\": drop name, the directory's config.json gives the shape (on the command line, "
        "--set='model={pretrained: \"DIR\"}' replaces the whole model)"));
  }
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config,
                      DecoderConfigFromHfConfig(spec.pretrained() + "/config.json"));
  if (spec.has_decoder()) {
    CT_RETURN_IF_ERROR(CheckGivenFields(spec.decoder(), config, spec.pretrained()));
  }
  return config;
}

absl::StatusOr<JobModel> BuildJobModel(const proto::TrainJob& job) {
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config, ResolveJobModelConfig(job.model()));
  JobModel out;
  if (!job.model().has_pretrained()) {
    CT_ASSIGN_OR_RETURN(out.model, BuildDecoder(config));
    return out;
  }
  const std::string& dir = job.model().pretrained();
  ReportDtype(dir, job.args());
  // load_strict governs pretrained weights as it governs checkpoints.
  HfLoadOptions options;
  options.strict = job.args().load_strict();
  if (!ShardsAtLoad(job.args())) {
    CT_ASSIGN_OR_RETURN(out.model, LoadHfDecoder(dir, options));
    return out;
  }
  CT_ASSIGN_OR_RETURN(out.model, BuildDecoder(config, {DecoderInit::Mode::kDeferred, 0}));
  CT_ASSIGN_OR_RETURN(out.engine, CreateEngine(job.args()));
  CT_RETURN_IF_ERROR(out.engine->PrepareForInference(out.model));
  CT_RETURN_IF_ERROR(LoadHfWeights(dir, *out.model, options));
  return out;
}

absl::StatusOr<std::shared_ptr<DecoderLM>> LoadHfDecoder(const std::string& dir,
                                                         const HfLoadOptions& options) {
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config,
                      DecoderConfigFromHfConfig(absl::StrCat(dir, "/config.json")));
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
                      BuildDecoder(config, {DecoderInit::Mode::kDeferred, 0}));
  CT_RETURN_IF_ERROR(LoadHfWeights(dir, *model, options));
  return model;
}

absl::StatusOr<std::shared_ptr<DecoderLM>> LoadDecoderDir(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "manifest.pb")) {
    return LoadHfDecoder(dir);
  }
  CT_ASSIGN_OR_RETURN(proto::CheckpointManifest manifest, ReadManifest(dir));
  proto::DecoderConfig config;
  if (manifest.has_decoder()) {
    config = manifest.decoder();
  } else {
    CT_ASSIGN_OR_RETURN(config, DecoderConfigFromHfConfig(dir + "/config.json"));
  }
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
  CT_RETURN_IF_ERROR(LoadModelState(dir, *model, /*optimizer=*/nullptr));
  return model;
}

}  // namespace cpptrain
