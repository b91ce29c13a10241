#include "config/ds_config.h"

#include <cmath>
#include <functional>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "checkpoint/internal/json.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/text_format.h"

namespace cpptrain {
namespace {

using checkpoint_internal::JsonGrammar;
using checkpoint_internal::JsonToString;
using checkpoint_internal::JsonValue;
using proto::TrainingArguments;
using proto::ZeroConfig;

// Keys that only steer DeepSpeed's own logging, profiling or bookkeeping: dropped with a note.
const std::set<std::string>& HarmlessKeys() {
  static const auto* keys = new std::set<std::string>{"steps_per_print",
                                                      "wall_clock_breakdown",
                                                      "memory_breakdown",
                                                      "dump_state",
                                                      "flops_profiler",
                                                      "tensorboard",
                                                      "wandb",
                                                      "csv_monitor",
                                                      "comet",
                                                      "comms_logger",
                                                      "zero_allow_untested_optimizer",
                                                      "zero_force_ds_cpu_optimizer"};
  return *keys;
}

bool IsAuto(const JsonValue& v) { return v.is_string() && v.string == "auto"; }

class Converter {
 public:
  Converter(absl::string_view source) : source_(source) {}

  absl::StatusOr<DeepSpeedConversion> Run(const JsonValue& root);

 private:
  using Handler = std::function<absl::Status(const std::string& path, const JsonValue& value)>;

  // Calls the handler of each key of `object` (at `path`), "auto" values noted and skipped;
  // a key with no handler is an error naming it and the keys that are known.
  absl::Status Walk(const JsonValue& object, const std::string& path,
                    const std::map<std::string, Handler>& handlers);

  absl::Status Error(const std::string& path, const JsonValue& value, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": ", path, " = ", JsonToString(value), ": ", what));
  }
  void Note(std::string line) { out_.notes.push_back(std::move(line)); }

  absl::StatusOr<double> Number(const std::string& path, const JsonValue& v);
  absl::StatusOr<int64_t> Integer(const std::string& path, const JsonValue& v);
  absl::StatusOr<bool> Bool(const std::string& path, const JsonValue& v);

  absl::Status Zero(const std::string& path, const JsonValue& v);
  absl::Status Offload(const std::string& path, const JsonValue& v, bool optimizer);
  absl::Status Fp16(const std::string& path, const JsonValue& v);
  absl::Status Bf16(const std::string& path, const JsonValue& v);
  absl::Status Optimizer(const std::string& path, const JsonValue& v);
  absl::Status Scheduler(const std::string& path, const JsonValue& v);
  absl::Status TrainBatchSize(const std::string& path, const JsonValue& v);

  // Handlers that set an int64, int32, double or bool field through `set`.
  Handler IntTo(std::function<void(int64_t)> set) {
    return [this, set](const std::string& p, const JsonValue& v) -> absl::Status {
      CT_ASSIGN_OR_RETURN(int64_t x, Integer(p, v));
      set(x);
      return absl::OkStatus();
    };
  }
  Handler DoubleTo(std::function<void(double)> set) {
    return [this, set](const std::string& p, const JsonValue& v) -> absl::Status {
      CT_ASSIGN_OR_RETURN(double x, Number(p, v));
      set(x);
      return absl::OkStatus();
    };
  }
  Handler BoolTo(std::function<void(bool)> set) {
    return [this, set](const std::string& p, const JsonValue& v) -> absl::Status {
      CT_ASSIGN_OR_RETURN(bool x, Bool(p, v));
      set(x);
      return absl::OkStatus();
    };
  }
  // A key this engine has no counterpart for, accepted only at the value that is DeepSpeed's
  // default behaviour (`ok`), otherwise an error saying `fix`.
  Handler OnlyBool(bool ok, std::string fix) {
    return [this, ok, fix](const std::string& p, const JsonValue& v) -> absl::Status {
      CT_ASSIGN_OR_RETURN(bool x, Bool(p, v));
      if (x != ok) return Error(p, v, fix);
      return absl::OkStatus();
    };
  }
  Handler Dropped(std::string why) {
    return [this, why](const std::string& p, const JsonValue& v) {
      Note(absl::StrCat(p, " = ", JsonToString(v), " is dropped: ", why));
      return absl::OkStatus();
    };
  }

  std::string source_;
  DeepSpeedConversion out_;
  ZeroConfig* zero_ = out_.args.mutable_zero();
  bool fp16_disabled_ = false;  // fp16.enabled written as false
  std::vector<std::pair<std::string, JsonValue>> fp16_scale_keys_;
  int64_t micro_batch_ = 0, accumulation_ = 0;  // 0: unset or "auto"
  const JsonValue* train_batch_size_ = nullptr;
};

absl::Status Converter::Walk(const JsonValue& object, const std::string& path,
                             const std::map<std::string, Handler>& handlers) {
  if (!object.is_object()) return Error(path, object, "expected a JSON object");
  for (size_t i = 0; i < object.keys.size(); ++i) {
    const std::string& key = object.keys[i];
    const std::string key_path = path.empty() ? key : absl::StrCat(path, ".", key);
    auto it = handlers.find(key);
    if (it == handlers.end()) {
      std::vector<std::string> known;
      for (const auto& [k, h] : handlers) known.push_back(k);
      return Error(key_path, object.values[i],
                   absl::StrCat("not a key the ZeRO engine supports; remove it (keys read here: ",
                                absl::StrJoin(known, ", "), ")"));
    }
    if (IsAuto(object.values[i])) {
      Note(absl::StrCat(key_path, " = \"auto\": left unset (the training arguments' "
                        "own value applies, the value Hugging Face fills in)"));
      continue;
    }
    CT_RETURN_IF_ERROR(it->second(key_path, object.values[i]));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Converter::Number(const std::string& path, const JsonValue& v) {
  if (!v.is_number()) return Error(path, v, "expected a number");
  return v.AsDouble();
}

absl::StatusOr<int64_t> Converter::Integer(const std::string& path, const JsonValue& v) {
  if (v.is_integer()) return v.integer;
  // DeepSpeed configs write sizes as 5e8.
  if (v.is_double() && std::floor(v.number) == v.number && std::fabs(v.number) < 9.0e18) {
    return static_cast<int64_t>(v.number);
  }
  return Error(path, v, "expected an integer");
}

absl::StatusOr<bool> Converter::Bool(const std::string& path, const JsonValue& v) {
  if (!v.is_bool()) return Error(path, v, "expected true or false");
  return v.boolean;
}

absl::Status Converter::Offload(const std::string& path, const JsonValue& v, bool optimizer) {
  auto set_device = [this, optimizer](ZeroConfig::OffloadDevice d) {
    optimizer ? zero_->set_offload_optimizer_device(d) : zero_->set_offload_param_device(d);
  };
  auto device = [this, set_device](const std::string& p, const JsonValue& d) -> absl::Status {
    if (!d.is_string() || (d.string != "cpu" && d.string != "none" && d.string != "nvme")) {
      return Error(p, d, "expected \"cpu\", \"none\" or \"nvme\"");
    }
    if (d.string == "nvme") {
      return Error(p, d, "NVMe offload is not implemented by the ZeRO engine; use \"cpu\"");
    }
    set_device(d.string == "cpu" ? ZeroConfig::CPU : ZeroConfig::NONE);
    return absl::OkStatus();
  };
  auto pin = BoolTo([this, optimizer](bool b) {
    optimizer ? zero_->set_offload_optimizer_pin_memory(b) : zero_->set_offload_param_pin_memory(b);
  });
  auto nvme_only = Dropped("it tunes DeepSpeed's NVMe/AIO swapping, which this engine lacks");
  std::map<std::string, Handler> handlers = {
      {"device", device},           {"pin_memory", pin},           {"nvme_path", nvme_only},
      {"buffer_count", nvme_only},  {"buffer_size", nvme_only},    {"max_in_cpu", nvme_only},
      {"pipeline_read", nvme_only}, {"pipeline_write", nvme_only}, {"fast_init", nvme_only}};
  if (optimizer) {
    handlers["ratio"] = [this](const std::string& p, const JsonValue& r) -> absl::Status {
      CT_ASSIGN_OR_RETURN(double x, Number(p, r));
      if (x != 1.0) {
        return Error(p, r,
                     "partial optimizer offload (ZeRO++ Twin-Flow) is not implemented; remove "
                     "the key or set 1.0");
      }
      return absl::OkStatus();
    };
  }
  return Walk(v, path, handlers);
}

absl::Status Converter::Zero(const std::string& path, const JsonValue& v) {
  auto z = zero_;
  auto stage = [this, z](const std::string& p, const JsonValue& s) -> absl::Status {
    CT_ASSIGN_OR_RETURN(int64_t x, Integer(p, s));
    if (x == 0) {
      return Error(p, s,
                   "stage 0 is plain data parallelism: use the ddp engine (args { ddp {} }) "
                   "instead, or set stage 1, 2 or 3");
    }
    if (x < 0 || x > 3) return Error(p, s, "expected a ZeRO stage, 1, 2 or 3");
    z->set_stage(static_cast<int32_t>(x));
    return absl::OkStatus();
  };
  const std::string unsupported = "is not implemented by the ZeRO engine; remove the key";
  auto dropped_tuning = Dropped("DeepSpeed-internal tuning with no counterpart here");
  std::map<std::string, Handler> handlers = {
      {"stage", stage},
      {"overlap_comm", BoolTo([z](bool b) { z->set_overlap_comm(b); })},
      {"contiguous_gradients", BoolTo([z](bool b) { z->set_contiguous_gradients(b); })},
      {"reduce_bucket_size", IntTo([z](int64_t x) { z->set_reduce_bucket_size(x); })},
      {"allgather_bucket_size", IntTo([z](int64_t x) { z->set_allgather_bucket_size(x); })},
      {"round_robin_gradients", BoolTo([z](bool b) { z->set_round_robin_gradients(b); })},
      {"stage3_prefetch_bucket_size",
       IntTo([z](int64_t x) { z->set_stage3_prefetch_bucket_size(x); })},
      {"stage3_param_persistence_threshold",
       IntTo([z](int64_t x) { z->set_stage3_param_persistence_threshold(x); })},
      {"stage3_max_live_parameters",
       IntTo([z](int64_t x) { z->set_stage3_max_live_parameters(x); })},
      {"stage3_max_reuse_distance", IntTo([z](int64_t x) { z->set_stage3_max_reuse_distance(x); })},
      {"stage3_gather_16bit_weights_on_model_save",
       BoolTo([z](bool b) { z->set_stage3_gather_16bit_weights_on_model_save(b); })},
      {"stage3_gather_fp16_weights_on_model_save",  // DeepSpeed's older name
       BoolTo([z](bool b) { z->set_stage3_gather_16bit_weights_on_model_save(b); })},
      {"zero3_init_flag", BoolTo([z](bool b) { z->set_zero3_init_flag(b); })},
      {"offload_optimizer",
       [this](const std::string& p, const JsonValue& o) { return Offload(p, o, true); }},
      {"offload_param",
       [this](const std::string& p, const JsonValue& o) { return Offload(p, o, false); }},
      {"cpu_offload",  // DeepSpeed's older spelling of offload_optimizer.device = cpu
       BoolTo([z](bool b) {
         z->set_offload_optimizer_device(b ? ZeroConfig::CPU : ZeroConfig::NONE);
       })},
      {"reduce_scatter",
       OnlyBool(true, "gradients are always reduce-scattered here; remove the key")},
      {"allgather_partitions",
       OnlyBool(true, "updated parameters are always all-gathered here; remove the key")},
      {"elastic_checkpoint", OnlyBool(false, "elastic checkpoints " + unsupported)},
      {"zero_quantized_weights", OnlyBool(false, "ZeRO++ weight quantization " + unsupported)},
      {"zero_quantized_gradients", OnlyBool(false, "ZeRO++ gradient quantization " + unsupported)},
      {"sub_group_size", dropped_tuning},
      {"load_from_fp32_weights", dropped_tuning},
      {"ignore_unused_parameters", dropped_tuning},
      {"stage3_max_reuse_distance_bytes", dropped_tuning},
  };
  return Walk(v, path, handlers);
}

absl::Status Converter::Fp16(const std::string& path, const JsonValue& v) {
  auto scale_key = [this](const std::string& p, const JsonValue& x) -> absl::Status {
    fp16_scale_keys_.emplace_back(p, x);
    return absl::OkStatus();
  };
  auto z = zero_;
  std::map<std::string, Handler> handlers = {
      {"enabled", BoolTo([this](bool b) {
         fp16_disabled_ = !b;
         out_.args.set_fp16(b);
       })},
      {"loss_scale", scale_key},
      {"initial_scale_power", scale_key},
      {"loss_scale_window", scale_key},
      {"hysteresis", scale_key},
      {"min_loss_scale", scale_key},
      {"consecutive_hysteresis",
       OnlyBool(false, "consecutive hysteresis is not implemented; remove the key")},
      {"auto_cast",
       OnlyBool(false, "fp16 auto_cast (casting inputs) is not implemented; remove the key")},
      {"fp16_master_weights_and_grads",
       OnlyBool(false, "master weights are fp32 here; remove the key")},
  };
  CT_RETURN_IF_ERROR(Walk(v, path, handlers));
  for (const auto& [p, x] : fp16_scale_keys_) {
    const std::string key = p.substr(p.rfind('.') + 1);
    if (key == "loss_scale") {
      CT_ASSIGN_OR_RETURN(double s, Number(p, x));
      z->set_loss_scale(s);
    } else if (key == "min_loss_scale") {
      CT_ASSIGN_OR_RETURN(double s, Number(p, x));
      z->set_min_loss_scale(s);
    } else {
      CT_ASSIGN_OR_RETURN(int64_t n, Integer(p, x));
      if (key == "initial_scale_power") z->set_initial_scale_power(static_cast<int32_t>(n));
      if (key == "loss_scale_window") z->set_loss_scale_window(static_cast<int32_t>(n));
      if (key == "hysteresis") z->set_hysteresis(static_cast<int32_t>(n));
    }
  }
  return absl::OkStatus();
}

absl::Status Converter::Bf16(const std::string& path, const JsonValue& v) {
  std::map<std::string, Handler> handlers = {
      {"enabled", BoolTo([this](bool b) { out_.args.set_bf16(b); })},
      {"immediate_grad_update", Dropped("gradients are accumulated in fp32 here")},
  };
  return Walk(v, path, handlers);
}

absl::Status Converter::Optimizer(const std::string& path, const JsonValue& v) {
  TrainingArguments* args = &out_.args;
  auto type = [this](const std::string& p, const JsonValue& t) -> absl::Status {
    if (!t.is_string() ||
        (t.string != "AdamW" && t.string != "Adam" && t.string != "adamw" && t.string != "adam")) {
      return Error(p, t,
                   "the ZeRO engine steps AdamW only (its fused GPU or CPU kernel); use "
                   "\"AdamW\"");
    }
    return absl::OkStatus();
  };
  auto betas = [this, args](const std::string& p, const JsonValue& b) -> absl::Status {
    if (!b.is_array() || b.values.size() != 2 || !b.values[0].is_number() ||
        !b.values[1].is_number()) {
      return Error(p, b, "expected [beta1, beta2]");
    }
    args->set_adam_beta1(b.values[0].AsDouble());
    args->set_adam_beta2(b.values[1].AsDouble());
    return absl::OkStatus();
  };
  std::map<std::string, Handler> params = {
      {"lr", DoubleTo([args](double x) { args->set_learning_rate(x); })},
      {"betas", betas},
      {"eps", DoubleTo([args](double x) { args->set_adam_epsilon(x); })},
      {"weight_decay", DoubleTo([args](double x) { args->set_weight_decay(x); })},
      {"adam_w_mode", OnlyBool(true,
                               "L2-regularized Adam is not implemented; weight decay is decoupled "
                               "(AdamW): remove the key")},
      {"amsgrad", OnlyBool(false, "AMSGrad is not implemented; remove the key")},
      {"torch_adam", Dropped("the engine picks its own AdamW kernel")},
      {"fused", Dropped("the engine picks its own AdamW kernel")},
  };
  std::map<std::string, Handler> handlers = {
      {"type", type},
      {"params",
       [this, params](const std::string& p, const JsonValue& x) { return Walk(x, p, params); }},
  };
  return Walk(v, path, handlers);
}

absl::Status Converter::Scheduler(const std::string& path, const JsonValue& v) {
  TrainingArguments* args = &out_.args;
  const JsonValue* type = v.is_object() ? v.Find("type") : nullptr;
  if (type == nullptr || !type->is_string()) {
    return Error(path, v, "expected an object with a \"type\" string");
  }
  const std::string t = type->string;
  if (t == "WarmupLR") {
    args->set_lr_scheduler_type(TrainingArguments::CONSTANT_WITH_WARMUP);
  } else if (t == "WarmupDecayLR") {
    args->set_lr_scheduler_type(TrainingArguments::LINEAR);
  } else if (t == "WarmupCosineLR") {
    args->set_lr_scheduler_type(TrainingArguments::COSINE_WARMUP_WITH_MIN_LR);
  } else {
    return Error(path + ".type", *type,
                 "no counterpart among lr_scheduler_type's options; use WarmupLR, WarmupDecayLR "
                 "or WarmupCosineLR, or drop the scheduler block and set lr_scheduler_type");
  }
  auto warmup_steps = DoubleTo([args](double x) { args->set_warmup_steps(x); });
  auto total = IntTo([args](int64_t x) { args->set_max_steps(x); });
  auto warmup_type = [this](const std::string& p, const JsonValue& w) -> absl::Status {
    if (!w.is_string() || (w.string != "linear" && w.string != "log")) {
      return Error(p, w, "expected \"linear\" or \"log\"");
    }
    if (w.string == "log") {
      Note(absl::StrCat(p, " = \"log\": the warm-up here is linear (Hugging Face's)"));
    }
    return absl::OkStatus();
  };
  auto zero_min_lr = [this](const std::string& p, const JsonValue& x) -> absl::Status {
    CT_ASSIGN_OR_RETURN(double lr, Number(p, x));
    if (lr != 0) {
      return Error(p, x,
                   "the warm-up here starts at 0 (Hugging Face's schedulers); set 0 or remove it");
    }
    return absl::OkStatus();
  };
  std::map<std::string, Handler> params;
  if (t == "WarmupCosineLR") {
    auto kw = args->mutable_lr_scheduler_kwargs();
    params = {{"total_num_steps", total},
              {"warmup_num_steps", warmup_steps},
              {"warmup_type", warmup_type},
              {"warmup_min_ratio", DoubleTo([kw](double x) { kw->set_warmup_lr_rate(x); })},
              {"cos_min_ratio", DoubleTo([kw](double x) { kw->set_min_lr_rate(x); })}};
  } else {
    params = {{"warmup_min_lr", zero_min_lr},
              {"warmup_max_lr", DoubleTo([args](double x) { args->set_learning_rate(x); })},
              {"warmup_num_steps", warmup_steps},
              {"warmup_type", warmup_type}};
    if (t == "WarmupDecayLR") params["total_num_steps"] = total;
  }
  std::map<std::string, Handler> handlers = {
      {"type", [](const std::string&, const JsonValue&) { return absl::OkStatus(); }},
      {"params",
       [this, params](const std::string& p, const JsonValue& x) { return Walk(x, p, params); }},
  };
  CT_RETURN_IF_ERROR(Walk(v, path, handlers));
  const JsonValue* p = v.Find("params");
  if (p == nullptr || p->Find("warmup_type") == nullptr) {
    Note(absl::StrCat(path,
                      ".params.warmup_type is unset: DeepSpeed's default is \"log\"; the "
                      "warm-up here is linear (Hugging Face's)"));
  }
  if (t == "WarmupCosineLR" && (p == nullptr || p->Find("cos_min_ratio") == nullptr)) {
    args->mutable_lr_scheduler_kwargs()->set_min_lr_rate(0.0001);  // DeepSpeed's default
  }
  return absl::OkStatus();
}

absl::Status Converter::TrainBatchSize(const std::string& path, const JsonValue& v) {
  if (!v.is_integer() || v.integer < 1) return Error(path, v, "expected a positive integer");
  train_batch_size_ = &v;
  return absl::OkStatus();
}

absl::StatusOr<DeepSpeedConversion> Converter::Run(const JsonValue& root) {
  TrainingArguments* args = &out_.args;
  bool has_zero = false;
  std::map<std::string, Handler> handlers = {
      {"zero_optimization",
       [this, &has_zero](const std::string& p, const JsonValue& x) {
         has_zero = true;
         return Zero(p, x);
       }},
      {"fp16", [this](const std::string& p, const JsonValue& x) { return Fp16(p, x); }},
      {"bf16", [this](const std::string& p, const JsonValue& x) { return Bf16(p, x); }},
      {"bfloat16", [this](const std::string& p, const JsonValue& x) { return Bf16(p, x); }},
      {"optimizer", [this](const std::string& p, const JsonValue& x) { return Optimizer(p, x); }},
      {"scheduler", [this](const std::string& p, const JsonValue& x) { return Scheduler(p, x); }},
      {"gradient_clipping", DoubleTo([args](double x) { args->set_max_grad_norm(x); })},
      {"train_micro_batch_size_per_gpu", IntTo([this, args](int64_t x) {
         micro_batch_ = x;
         args->set_per_device_train_batch_size(static_cast<int32_t>(x));
       })},
      {"gradient_accumulation_steps", IntTo([this, args](int64_t x) {
         accumulation_ = x;
         args->set_gradient_accumulation_steps(static_cast<int32_t>(x));
       })},
      {"train_batch_size",
       [this](const std::string& p, const JsonValue& x) { return TrainBatchSize(p, x); }},
      {"prescale_gradients",
       OnlyBool(false, "gradients are averaged after the reduction here; remove the key")},
      {"gradient_predivide_factor", DoubleTo([](double) {})},  // checked below
  };
  for (const std::string& key : HarmlessKeys()) {
    handlers[key] = Dropped("it steers DeepSpeed's logging or bookkeeping only");
  }
  CT_RETURN_IF_ERROR(Walk(root, "", handlers));
  if (const JsonValue* f = root.Find("gradient_predivide_factor");
      f != nullptr && !IsAuto(*f) && f->AsDouble() != 1.0) {
    return Error("gradient_predivide_factor", *f,
                 "only 1.0 is implemented (gradients are averaged once); remove the key");
  }
  if (!has_zero) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_,
                     ": zero_optimization is missing: DeepSpeed then runs stage 0 (plain data "
                     "parallelism); use the ddp engine for that, or add \"zero_optimization\": "
                     "{\"stage\": 1}"));
  }
  if (fp16_disabled_ && !fp16_scale_keys_.empty()) {
    Note(
        "fp16.enabled = false: the loss-scale keys are kept in args.zero but apply only with "
        "fp16");
  }
  if (train_batch_size_ != nullptr) {
    const int64_t total = train_batch_size_->integer;
    if (micro_batch_ > 0 && accumulation_ > 0 && total % (micro_batch_ * accumulation_) == 0) {
      Note(absl::StrCat("train_batch_size = ", total, " means ",
                        total / (micro_batch_ * accumulation_), " processes at micro-batch ",
                        micro_batch_, " and accumulation ", accumulation_, ": launch that many"));
    } else if (micro_batch_ > 0 && accumulation_ > 0) {
      return Error("train_batch_size", *train_batch_size_,
                   absl::StrCat("not a multiple of train_micro_batch_size_per_gpu x "
                                "gradient_accumulation_steps = ",
                                micro_batch_ * accumulation_, "; fix one of the three"));
    } else {
      return Error("train_batch_size", *train_batch_size_,
                   "the batch here is set per process: give train_micro_batch_size_per_gpu and "
                   "gradient_accumulation_steps instead (or \"auto\" for train_batch_size)");
    }
  }
  return std::move(out_);
}

}  // namespace

absl::StatusOr<DeepSpeedConversion> ConvertDeepSpeedConfig(absl::string_view json_text,
                                                           absl::string_view source_name) {
  absl::StatusOr<JsonValue> root = checkpoint_internal::ParseJson(json_text, JsonGrammar::kFull);
  if (!root.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source_name, ": not valid JSON: ", root.status().message()));
  }
  return Converter(source_name).Run(*root);
}

std::vector<std::string> DeepSpeedConversionOverrides(const DeepSpeedConversion& conversion,
                                                      absl::string_view prefix) {
  std::vector<std::string> out;
  const google::protobuf::Reflection* reflection = conversion.args.GetReflection();
  std::vector<const google::protobuf::FieldDescriptor*> fields;
  reflection->ListFields(conversion.args, &fields);
  google::protobuf::TextFormat::Printer printer;
  printer.SetSingleLineMode(true);
  for (const google::protobuf::FieldDescriptor* field : fields) {
    std::string value;
    if (field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) {
      printer.PrintToString(reflection->GetMessage(conversion.args, field), &value);
      value = absl::StrCat("{", value, "}");
    } else if (field->is_repeated()) {
      for (int i = 0; i < reflection->FieldSize(conversion.args, field); ++i) {
        std::string item;
        printer.PrintFieldValueToString(conversion.args, field, i, &item);
        absl::StrAppend(&value, i == 0 ? "[" : ", ", item);
      }
      absl::StrAppend(&value, "]");
    } else {
      printer.PrintFieldValueToString(conversion.args, field, -1, &value);
    }
    out.push_back(absl::StrCat(prefix, field->name(), "=", value));
  }
  return out;
}

std::string DeepSpeedConversionText(const DeepSpeedConversion& conversion,
                                    absl::string_view source_name, const proto::TrainJob* base) {
  proto::TrainJob job;
  if (base != nullptr) job = *base;
  // A base naming another engine: the converted ZeRO config replaces it.
  if (!job.args().has_zero()) job.mutable_args()->clear_engine();
  job.mutable_args()->MergeFrom(conversion.args);
  std::string text =
      absl::StrCat("# Converted from ", source_name, " by tools/ds_config_to_textproto.\n");
  for (const std::string& note : conversion.notes) absl::StrAppend(&text, "# ", note, "\n");
  std::string body;
  google::protobuf::TextFormat::PrintToString(job, &body);
  return text + body;
}

}  // namespace cpptrain
