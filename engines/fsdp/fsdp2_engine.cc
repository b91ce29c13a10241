#include "engines/fsdp/fsdp2_engine.h"

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "engines/fsdp/internal/fsdp_options.h"
#include "base/torch_status.h"

namespace cpptrain {
FullyShardOptions FullyShardOptionsFromConfig(const proto::FsdpConfig& config,
                                              MixedPrecision precision, c10::Device device) {
  FullyShardOptions options;
  options.device = device;
  options.wrap = fsdp_options::WrapPolicyOf(config);
  if (config.has_reshard_after_forward()) {
    options.reshard_after_forward = config.reshard_after_forward();
  }
  options.param_dtype = fsdp_options::ParamDtype(config, precision);
  options.reduce_dtype = fsdp_options::ReduceDtype(config, precision);
  if (config.has_output_dtype()) {
    options.output_dtype = fsdp_options::ToScalarType(config.output_dtype());
  }
  options.cast_forward_inputs = config.cast_forward_inputs();
  options.offload_params = config.offload_params();
  options.sync_module_states = config.sync_module_states();
  options.backward_prefetch = config.backward_prefetch() != proto::FsdpConfig::NO_PREFETCH;
  return options;
}

absl::StatusOr<std::unique_ptr<Fsdp2Engine>> Fsdp2Engine::Create(const proto::FsdpConfig& config,
                                                                 MixedPrecision precision,
                                                                 c10::Device device,
                                                                 ShardMesh mesh) {
  if (mesh.shard == nullptr) return absl::InvalidArgumentError("Fsdp2Engine needs a communicator");
  if (config.version() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fsdp.version is ", config.version(), " but this is the FSDP2 engine: set fsdp.version=2"));
  }
  if (precision == MixedPrecision::kFp16 && !device.is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the FSDP engine runs on ", device.str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  FullyShardOptions options = FullyShardOptionsFromConfig(config, precision, device);
  return std::unique_ptr<Fsdp2Engine>(
      new Fsdp2Engine(config, precision, device, std::move(mesh), std::move(options)));
}

namespace {

std::string DTypeName(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16:
      return "BF16";
    case at::kHalf:
      return "FP16";
    case at::kFloat:
      return "FP32";
    default:
      return c10::toString(dtype);
  }
}

// The dtypes a group gathers in and reduces in (unset: the parameters' own, fp32 here).
at::ScalarType GatherDtype(const FullyShardOptions& o) {
  return o.param_dtype.value_or(at::kFloat);
}
at::ScalarType ReduceDtype(const FullyShardOptions& o) {
  return o.reduce_dtype.value_or(GatherDtype(o));
}

void CompareDtypes(const FullyShardOptions& want, const FullyShardOptions& have, bool reduce_too,
                   std::vector<std::string>* out) {
  if (GatherDtype(want) != GatherDtype(have)) {
    out->push_back(absl::StrCat("param_dtype resolves to ", DTypeName(GatherDtype(want)),
                                " but the model gathers in ", DTypeName(GatherDtype(have))));
  }
  if (reduce_too && ReduceDtype(want) != ReduceDtype(have)) {
    out->push_back(absl::StrCat("reduce_dtype resolves to ", DTypeName(ReduceDtype(want)),
                                " but the model reduces in ", DTypeName(ReduceDtype(have))));
  }
}

void CompareMesh(const proto::FsdpConfig& config, const ShardMesh& mesh,
                 std::vector<std::string>* out) {
  const int replicas = mesh.replicate ? mesh.replicate->size() : 1;
  if (config.dp_replicate_size() != replicas) {
    out->push_back(absl::StrCat("fsdp.dp_replicate_size is ", config.dp_replicate_size(),
                                " but the model's mesh has ", replicas, " replica(s)"));
  }
  if (config.dp_shard_size() > 0 && config.dp_shard_size() != mesh.shard->size()) {
    out->push_back(absl::StrCat("fsdp.dp_shard_size is ", config.dp_shard_size(),
                                " but the model is sharded over ", mesh.shard->size(), " ranks"));
  }
}

void CompareWrapping(const proto::FsdpConfig& config, const FullyShardOptions& want,
                     const FullyShardOptions& have, std::vector<std::string>* out) {
  const bool asked = config.has_auto_wrap_policy() || config.has_min_num_params() ||
                     config.transformer_layer_cls_to_wrap_size() > 0;
  if (asked && (want.wrap.kind != have.wrap.kind || want.wrap.classes != have.wrap.classes ||
                want.wrap.min_num_params != have.wrap.min_num_params)) {
    out->push_back(absl::StrCat("fsdp.auto_wrap_policy is ",
                                proto::FsdpConfig::AutoWrapPolicy_Name(config.auto_wrap_policy()),
                                " (with its classes / min_num_params) but the model was wrapped "
                                "differently: its groups are fixed when it is sharded"));
  }
}

void CompareFlags(const proto::FsdpConfig& config, const FullyShardOptions& want,
                  const FullyShardOptions& have, std::vector<std::string>* out) {
  auto flag = [&](bool asked, bool wanted, bool had, const char* name) {
    if (asked && wanted != had) {
      out->push_back(absl::StrCat("fsdp.", name, " is ", wanted ? "true" : "false",
                                  " but the model was sharded with ", had ? "true" : "false"));
    }
  };
  flag(config.has_reshard_after_forward(), config.reshard_after_forward(),
       have.reshard_after_forward.value_or(true), "reshard_after_forward");
  flag(true, config.offload_params(), have.offload_params, "offload_params");
  flag(config.has_cast_forward_inputs(), want.cast_forward_inputs, have.cast_forward_inputs,
       "cast_forward_inputs");
  flag(config.has_backward_prefetch(), want.backward_prefetch, have.backward_prefetch,
       "backward_prefetch (BACKWARD_PRE)");
  if (config.has_output_dtype() && want.output_dtype != have.output_dtype) {
    out->push_back(absl::StrCat("fsdp.output_dtype is ", DTypeName(*want.output_dtype),
                                " but the model was sharded with ",
                                have.output_dtype ? DTypeName(*have.output_dtype) : "none"));
  }
}

}  // namespace

std::vector<std::string> DisagreementsWithShardedModel(const proto::FsdpConfig* config,
                                                       MixedPrecision precision,
                                                       const FullyShardedModel& sharded) {
  std::vector<std::string> out;
  const FullyShardOptions& have = sharded.options();
  const FullyShardOptions want = FullyShardOptionsFromConfig(config ? *config : proto::FsdpConfig(),
                                                             precision, sharded.device());
  if (config == nullptr) {
    // No fsdp block: the model's sharding rules, but bf16/fp16 must not be half ignored.
    if (precision != MixedPrecision::kNone) CompareDtypes(want, have, /*reduce_too=*/false, &out);
    for (std::string& line : out) line = absl::StrCat(line, " (from bf16/fp16)");
    return out;
  }
  CompareMesh(*config, sharded.mesh(), &out);
  CompareDtypes(want, have, /*reduce_too=*/true, &out);
  for (std::string& line : out) {
    if (absl::StartsWith(line, "param_dtype") || absl::StartsWith(line, "reduce_dtype")) {
      line = absl::StrCat("fsdp.", line);
    }
  }
  CompareWrapping(*config, want, have, &out);
  CompareFlags(*config, want, have, &out);
  return out;
}

absl::StatusOr<std::unique_ptr<Fsdp2Engine>> Fsdp2Engine::ForShardedModel(
    const TrainableModel& model, const proto::FsdpConfig* config, MixedPrecision precision) {
  FullyShardedModel* sharded = FullyShardedOf(model);
  if (sharded == nullptr) {
    return absl::InvalidArgumentError("Fsdp2Engine::ForShardedModel: the model is not sharded");
  }
  if (precision == MixedPrecision::kFp16 && !sharded->device().is_cuda()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fp16 is true but the sharded model lives on ", sharded->device().str(),
        ", where LibTorch has no fp16 autocast: use bf16 on the CPU, or CUDA devices"));
  }
  const std::vector<std::string> disagreements =
      DisagreementsWithShardedModel(config, precision, *sharded);
  if (!disagreements.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model was sharded at load time (FullyShard) with other settings than the training "
        "arguments ask for: ",
        absl::StrJoin(disagreements, "; "),
        ". Shard it with FullyShardOptionsFromConfig(args.fsdp(), MixedPrecisionFromArgs(args), "
        "device) over ShardMeshFromEnvironment(args.fsdp(), timeout), or change those fields"));
  }
  proto::FsdpConfig adopted = config ? *config : proto::FsdpConfig();
  adopted.set_version(2);
  return std::unique_ptr<Fsdp2Engine>(
      new Fsdp2Engine(adopted, precision, sharded->device(), sharded->mesh(), sharded->options()));
}

Fsdp2Engine::Fsdp2Engine(const proto::FsdpConfig& config, MixedPrecision precision,
                         c10::Device device, ShardMesh mesh, FullyShardOptions options)
    : ShardedEngine(device, precision, std::move(mesh)),
      config_(config),
      options_(std::move(options)) {}

absl::StatusOr<ShardingCore*> Fsdp2Engine::ShardModel(TrainableModel& model) {
  // Recomputation runs inside each unit's hooks, so it can be switched on after sharding too.
  if (config_.activation_checkpointing()) model.SetGradientCheckpointing(true);
  FullyShardedModel* sharded = FullyShardedOf(model);
  if (sharded != nullptr) {
    // Sharded at load time: adopt its shards as they are.
    if (sharded->mesh().world_size() != mesh_.world_size() ||
        sharded->mesh().shard->size() != mesh_.shard->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model was sharded over ", sharded->mesh().shard->size(), " shard ranks (world ",
          sharded->mesh().world_size(), ") but the FSDP engine spans ", mesh_.shard->size(),
          " (world ", mesh_.world_size(),
          "): shard it over the same ranks, or leave it unsharded "
          "and let the engine shard it"));
    }
    if (sharded->device() != device_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model's shards live on ", sharded->device().str(), " but the FSDP engine runs on ",
          device_.str(), ": shard it with device ", device_.str()));
    }
    CT_LOG_RANK0(INFO) << "FSDP2: adopting the shards of a model sharded at load time ("
                       << sharded->num_groups() << " groups)";
  } else {
    CT_ASSIGN_OR_RETURN(sharded, FullyShard(model, mesh_, options_));
  }
  sharded_ = sharded;
  return sharded;
}

}  // namespace cpptrain
