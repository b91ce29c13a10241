// Rules on the engine oneof of TrainingArguments. Sources: HF TrainingArguments (fsdp_config),
// Trainer.create_accelerator_and_postprocess, Accelerate's FullyShardedDataParallelPlugin and
// DeepSpeed's zero_optimization keys.
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "config/internal/validation.h"

namespace cpptrain {
namespace config_internal {
namespace {

using proto::FsdpConfig;
using proto::TrainingArguments;
using proto::ZeroConfig;

void CheckLocal(const proto::LocalEngineConfig& local, Problems* problems) {
  const std::string& device = local.device();
  int index = 0;
  const bool cuda_index =
      absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) && index >= 0;
  if (device != "auto" && device != "cpu" && device != "cuda" && !cuda_index) {
    problems->push_back(absl::StrCat("local.device=\"", device,
                                     "\" is unknown; use \"auto\", \"cpu\", \"cuda\" or "
                                     "\"cuda:<index>\""));
  }
}

void CheckDdp(const proto::DdpConfig& ddp, Problems* problems) {
  if (!(ddp.bucket_cap_mb() > 0)) {
    problems->push_back(absl::StrCat("ddp.bucket_cap_mb=", Num(ddp.bucket_cap_mb()),
                                     " must be positive (default 25)"));
  }
}

// The FSDP1/FSDP2 split of the keys (Accelerate's FullyShardedDataParallelPlugin).
void CheckFsdpVersion(const FsdpConfig& fsdp, Problems* problems) {
  if (fsdp.version() != 1 && fsdp.version() != 2) {
    problems->push_back(absl::StrCat("fsdp.version=", fsdp.version(),
                                     " is unknown; use 1 (flat parameters) or 2 (fully_shard)"));
  }
  if (fsdp.version() == 2 && fsdp.has_sharding_strategy()) {
    problems->push_back(absl::StrCat(
        "fsdp.sharding_strategy=", FsdpConfig::ShardingStrategy_Name(fsdp.sharding_strategy()),
        " is FSDP1-only but fsdp.version=2; use fsdp.reshard_after_forward (false ~ "
        "SHARD_GRAD_OP) and fsdp.dp_replicate_size (> 1 ~ HYBRID_SHARD) instead"));
  }
  if (fsdp.version() == 1 && fsdp.has_reshard_after_forward()) {
    problems->push_back(
        absl::StrCat("fsdp.reshard_after_forward=", Bool(fsdp.reshard_after_forward()),
                     " is FSDP2-only but fsdp.version=1; use fsdp.sharding_strategy (FULL_SHARD or "
                     "SHARD_GRAD_OP) instead"));
  }
  if (fsdp.version() == 2 && fsdp.forward_prefetch()) {
    problems->push_back(
        "fsdp.forward_prefetch=true is not supported with fsdp.version=2; turn it off (FSDP2 "
        "prefetches on its own)");
  }
  if (fsdp.version() == 2 && fsdp.state_dict_type() == FsdpConfig::LOCAL_STATE_DICT) {
    problems->push_back(
        "fsdp.state_dict_type=LOCAL_STATE_DICT is not supported with fsdp.version=2; use "
        "SHARDED_STATE_DICT or FULL_STATE_DICT");
  }
}

bool IsHybrid(FsdpConfig::ShardingStrategy strategy) {
  return strategy == FsdpConfig::HYBRID_SHARD || strategy == FsdpConfig::HYBRID_SHARD_ZERO2;
}

// FSDP1's keys (PyTorch's FullyShardedDataParallel as Accelerate configures it).
void CheckFsdp1(const FsdpConfig& fsdp, Problems* problems) {
  if (fsdp.version() != 1) {
    if (fsdp.has_buffer_dtype()) {
      problems->push_back(absl::StrCat("fsdp.buffer_dtype=", proto::DType_Name(fsdp.buffer_dtype()),
                                       " is FSDP1-only but fsdp.version=", fsdp.version(),
                                       "; unset it (FSDP2 keeps buffers in their own dtype)"));
    }
    return;
  }
  const std::string strategy = FsdpConfig::ShardingStrategy_Name(fsdp.sharding_strategy());
  if (!fsdp.use_orig_params()) {
    problems->push_back(
        "fsdp.use_orig_params=false is not built: this FSDP1 keeps the original parameters as "
        "views of the flat parameter (use_orig_params=true), so the optimizer, weight-decay "
        "groups and frozen parameters see them; set fsdp.use_orig_params=true");
  }
  if (fsdp.dp_replicate_size() > 1 && !IsHybrid(fsdp.sharding_strategy())) {
    problems->push_back(absl::StrCat(
        "fsdp.dp_replicate_size=", fsdp.dp_replicate_size(),
        " replicates the model but "
        "fsdp.sharding_strategy=",
        strategy,
        " with fsdp.version=1 does not; use "
        "HYBRID_SHARD (or _HYBRID_SHARD_ZERO2) to shard inside a replica and replicate across, "
        "or set dp_replicate_size=1"));
  }
  if (fsdp.dp_shard_size() > 0 && !IsHybrid(fsdp.sharding_strategy())) {
    problems->push_back(absl::StrCat(
        "fsdp.dp_shard_size=", fsdp.dp_shard_size(),
        " is for HYBRID_SHARD with fsdp.version=1, "
        "but fsdp.sharding_strategy=",
        strategy, " (", strategy == "NO_SHARD" ? "no sharding" : "sharded over all ranks",
        "); unset dp_shard_size"));
  }
  if (fsdp.has_output_dtype()) {
    problems->push_back(
        absl::StrCat("fsdp.output_dtype=", proto::DType_Name(fsdp.output_dtype()),
                     " is FSDP2-only (its "
                     "MixedPrecisionPolicy) but fsdp.version=1; unset it or use fsdp.version=2"));
  }
  if (fsdp.state_dict_type() == FsdpConfig::LOCAL_STATE_DICT) {
    problems->push_back(
        "fsdp.state_dict_type=LOCAL_STATE_DICT is not built for fsdp.version=1 (its files only "
        "load at the same world size); use SHARDED_STATE_DICT or FULL_STATE_DICT");
  }
}

void CheckFsdpWrapping(const FsdpConfig& fsdp, Problems* problems) {
  if (fsdp.min_num_params() < 0) {
    problems->push_back(absl::StrCat("fsdp.min_num_params=", fsdp.min_num_params(),
                                     " is negative; use a parameter count >= 0"));
  }
  if (fsdp.min_num_params() > 0 && fsdp.transformer_layer_cls_to_wrap_size() > 0) {
    problems->push_back(absl::StrCat(
        "fsdp.min_num_params=", fsdp.min_num_params(), " and fsdp.transformer_layer_cls_to_wrap=[",
        fsdp.transformer_layer_cls_to_wrap(0),
        fsdp.transformer_layer_cls_to_wrap_size() > 1 ? ", ..." : "",
        "] are mutually exclusive; wrap by size or by layer class, not both"));
  }
  if (fsdp.min_num_params() > 0 && fsdp.auto_wrap_policy() != FsdpConfig::SIZE_BASED_WRAP) {
    problems->push_back(absl::StrCat("fsdp.min_num_params=", fsdp.min_num_params(),
                                     " needs fsdp.auto_wrap_policy="
                                     "SIZE_BASED_WRAP (saw ",
                                     FsdpConfig::AutoWrapPolicy_Name(fsdp.auto_wrap_policy()),
                                     "); set the policy or unset min_num_params"));
  }
}

void CheckFsdp(const TrainingArguments& args, Problems* problems) {
  const FsdpConfig& fsdp = args.fsdp();
  CheckFsdpVersion(fsdp, problems);
  CheckFsdp1(fsdp, problems);
  CheckFsdpWrapping(fsdp, problems);
  if (fsdp.offload_params() && fsdp.sharding_strategy() == FsdpConfig::NO_SHARD) {
    problems->push_back(
        "fsdp.offload_params=true with fsdp.sharding_strategy=NO_SHARD: offload must be "
        "combined with FULL_SHARD or SHARD_GRAD_OP");
  }
  if (!fsdp.sync_module_states() && fsdp.cpu_ram_efficient_loading()) {
    problems->push_back(
        "fsdp.cpu_ram_efficient_loading=true needs fsdp.sync_module_states=true (saw false): "
        "only rank 0 loads the weights and the others receive them by broadcast");
  }
  if (fsdp.activation_checkpointing() && args.gradient_checkpointing()) {
    problems->push_back(
        "fsdp.activation_checkpointing=true and gradient_checkpointing=true can't both be set; "
        "use fsdp.activation_checkpointing and set gradient_checkpointing=false");
  }
  if (args.save_only_model() && args.load_best_model_at_end()) {
    problems->push_back(
        "FSDP can't be used with save_only_model=true along with load_best_model_at_end=true; "
        "turn one of them off");
  }
  if (args.save_only_model() && fsdp.has_state_dict_type() &&
      fsdp.state_dict_type() == FsdpConfig::SHARDED_STATE_DICT) {
    problems->push_back(
        "save_only_model=true is not compatible with fsdp.state_dict_type=SHARDED_STATE_DICT; "
        "use FULL_STATE_DICT or turn save_only_model off");
  }
  if (fsdp.dp_replicate_size() < 1) {
    problems->push_back(absl::StrCat("fsdp.dp_replicate_size=", fsdp.dp_replicate_size(),
                                     " must be >= 1 (1: no replication)"));
  }
  if (fsdp.dp_shard_size() < 0) {
    problems->push_back(absl::StrCat("fsdp.dp_shard_size=", fsdp.dp_shard_size(),
                                     " is negative; use 0 (all ranks) or a shard group size"));
  }
}

void CheckZero(const TrainingArguments& args, Problems* problems) {
  const ZeroConfig& zero = args.zero();
  if (zero.stage() < 1 || zero.stage() > 3) {
    problems->push_back(absl::StrCat("zero.stage=", zero.stage(), " is unknown; use 1, 2 or 3"));
  }
  if (zero.stage() == 3 && args.auto_find_batch_size()) {
    problems->push_back(
        "auto_find_batch_size=true isn't supported with zero.stage=3; use stage 1 or 2, FSDP, "
        "or a fixed batch size");
  }
  if (zero.offload_param_device() == ZeroConfig::CPU && zero.stage() < 3) {
    problems->push_back(absl::StrCat(
        "zero.offload_param_device=CPU needs zero.stage=3 (saw stage ", zero.stage(),
        "): only stage 3 partitions parameters; use offload_optimizer_device or stage 3"));
  }
  if (zero.reduce_bucket_size() <= 0) {
    problems->push_back(absl::StrCat("zero.reduce_bucket_size=", zero.reduce_bucket_size(),
                                     " must be a positive element count"));
  }
  if (zero.allgather_bucket_size() <= 0) {
    problems->push_back(absl::StrCat("zero.allgather_bucket_size=", zero.allgather_bucket_size(),
                                     " must be a positive element count"));
  }
  if (args.save_only_model() && args.load_best_model_at_end()) {
    problems->push_back(
        "ZeRO can't be used with save_only_model=true along with load_best_model_at_end=true; "
        "turn one of them off");
  }
}

}  // namespace

// Hugging Face's flat ddp_* arguments: each must agree with the nested ddp field it maps onto;
// the two without one are checked for what can be honored.
void CheckHfDdpArguments(const TrainingArguments& args, Problems* problems) {
  const proto::DdpConfig& ddp = args.ddp();
  auto agree = [&](bool flat_set, bool nested_set, bool same, const std::string& flat,
                   const std::string& nested) {
    if (flat_set && nested_set && !same) {
      problems->push_back(absl::StrCat(flat, " and ", nested,
                                       " disagree (Hugging Face's flat name and the ddp block "
                                       "set the same thing); keep one of them"));
    }
  };
  agree(args.has_ddp_find_unused_parameters(), ddp.has_find_unused_parameters(),
        args.ddp_find_unused_parameters() == ddp.find_unused_parameters(),
        absl::StrCat("ddp_find_unused_parameters=", Bool(args.ddp_find_unused_parameters())),
        absl::StrCat("ddp.find_unused_parameters=", Bool(ddp.find_unused_parameters())));
  agree(args.has_ddp_bucket_cap_mb(), ddp.has_bucket_cap_mb(),
        args.ddp_bucket_cap_mb() == ddp.bucket_cap_mb(),
        absl::StrCat("ddp_bucket_cap_mb=", Num(args.ddp_bucket_cap_mb())),
        absl::StrCat("ddp.bucket_cap_mb=", Num(ddp.bucket_cap_mb())));
  agree(args.has_ddp_broadcast_buffers(), ddp.has_broadcast_buffers(),
        args.ddp_broadcast_buffers() == ddp.broadcast_buffers(),
        absl::StrCat("ddp_broadcast_buffers=", Bool(args.ddp_broadcast_buffers())),
        absl::StrCat("ddp.broadcast_buffers=", Bool(ddp.broadcast_buffers())));
  if (args.has_ddp_bucket_cap_mb() && !(args.ddp_bucket_cap_mb() > 0)) {
    problems->push_back(absl::StrCat("ddp_bucket_cap_mb=", Num(args.ddp_bucket_cap_mb()),
                                     " must be positive (default 25)"));
  }
  const std::string& backend = args.ddp_backend();
  if (!backend.empty() && backend != "nccl" && backend != "gloo") {
    problems->push_back(absl::StrCat(
        "ddp_backend=\"", backend, "\" is not built: the communicator follows the device, ",
        "\"nccl\" on CUDA and \"gloo\" on the CPU (use_cpu=true); set one of those or drop "
        "ddp_backend"));
  }
  if (backend == "nccl" && args.use_cpu()) {
    problems->push_back(
        "ddp_backend=\"nccl\" but use_cpu=true, which trains over Gloo: drop use_cpu to train "
        "on GPUs over NCCL, or set ddp_backend=gloo");
  }
  if (args.ddp_static_graph()) {
    problems->push_back(
        "ddp_static_graph=true has no equivalent: the DDP engine has no static-graph mode (its "
        "buckets follow the order gradients arrive in, and gradient checkpointing and unused "
        "parameters work without it, the latter with ddp.find_unused_parameters); drop "
        "ddp_static_graph or set it to false");
  }
}

void CheckEngine(const TrainingArguments& args, Problems* problems) {
  CheckHfDdpArguments(args, problems);
  switch (args.engine_case()) {
    case TrainingArguments::kLocal:
      CheckLocal(args.local(), problems);
      if (args.use_cpu() && absl::StartsWith(args.local().device(), "cuda")) {
        problems->push_back(absl::StrCat("use_cpu=true but local.device=\"", args.local().device(),
                                         "\"; drop one of them (use_cpu picks \"cpu\")"));
      }
      break;
    case TrainingArguments::kDdp:
      CheckDdp(args.ddp(), problems);
      break;
    case TrainingArguments::kFsdp:
      CheckFsdp(args, problems);
      break;
    case TrainingArguments::kZero:
      CheckZero(args, problems);
      break;
    case TrainingArguments::ENGINE_NOT_SET:
      break;
  }
}

void AddEngineWarnings(const TrainingArguments& args, std::vector<std::string>* warnings) {
  const bool hf_ddp = args.has_ddp_find_unused_parameters() || args.has_ddp_bucket_cap_mb() ||
                      args.has_ddp_broadcast_buffers() || args.has_ddp_static_graph();
  if (hf_ddp && (args.has_fsdp() || args.has_zero() || args.has_local())) {
    const std::string selected =
        args.GetDescriptor()->FindFieldByNumber(args.engine_case())->name();
    warnings->push_back(absl::StrCat(
        "ddp_find_unused_parameters / ddp_bucket_cap_mb / ddp_broadcast_buffers / "
        "ddp_static_graph apply to the DDP engine only and are ignored: the `", selected,
        "` engine is selected"));
  }
  if (!args.has_fsdp()) return;
  const FsdpConfig& fsdp = args.fsdp();
  // gradient_checkpointing and fsdp.activation_checkpointing are the same mechanism here:
  // recomputation runs inside each unit after its backward gather, so no extra all-gather.
  if (fsdp.auto_wrap_policy() == FsdpConfig::SIZE_BASED_WRAP && fsdp.min_num_params() == 0) {
    warnings->push_back(
        "fsdp.auto_wrap_policy=SIZE_BASED_WRAP with fsdp.min_num_params=0 wraps every module "
        "that has parameters; set min_num_params (e.g. 100000000)");
  }
  if (fsdp.transformer_layer_cls_to_wrap_size() > 0 &&
      fsdp.auto_wrap_policy() != FsdpConfig::TRANSFORMER_BASED_WRAP) {
    warnings->push_back(
        absl::StrCat("fsdp.transformer_layer_cls_to_wrap is ignored with fsdp.auto_wrap_policy=",
                     FsdpConfig::AutoWrapPolicy_Name(fsdp.auto_wrap_policy())));
  }
  if (fsdp.version() == 2) {
    // backward_prefetch is honoured by FSDP2 too (NO_PREFETCH turns the backward prefetch off).
    const std::pair<const char*, bool> fsdp1_only[] = {
        {"limit_all_gathers", fsdp.has_limit_all_gathers()},
        {"use_orig_params", fsdp.has_use_orig_params()},
    };
    for (const auto& [key, set] : fsdp1_only) {
      if (set) {
        warnings->push_back(
            absl::StrCat("fsdp.", key, " is an FSDP1 setting, ignored with fsdp.version=2"));
      }
    }
  }
}

}  // namespace config_internal
}  // namespace cpptrain
