#include "trainer/run_identity.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>

#include "absl/strings/str_format.h"
#include "checkpoint/crc32c.h"

namespace cpptrain {

const std::vector<std::string>& RunIdentityIgnoredFields() {
  static const std::vector<std::string>* fields = new std::vector<std::string>{
      "output_dir", "num_train_epochs", "max_steps", "resume_from_checkpoint",
      "overwrite_output_dir", "logging_dir", "run_name",
      // schedules of logging, evaluation and saving
      "logging_strategy", "logging_steps", "logging_first_step", "logging_nan_inf_filter",
      "eval_strategy", "eval_steps", "eval_delay", "eval_on_start", "eval_accumulation_steps",
      "per_device_eval_batch_size", "save_strategy", "save_steps", "save_total_limit",
      "save_only_model", "load_best_model_at_end", "metric_for_best_model", "greater_is_better",
      // data-loading performance
      "dataloader_num_workers", "dataloader_pin_memory", "dataloader_persistent_workers",
      "dataloader_prefetch_factor",
      // engines: checkpoints load into any engine and world size
      "local", "ddp", "fsdp", "zero", "use_cpu",
      // switches that leave the step's mathematics as it is
      "fused_kernels", "cuda_graphs", "gradient_checkpointing", "disable_tqdm", "report_to",
      "ddp_timeout", "load_strict", "auto_find_batch_size", "do_train", "do_eval", "do_predict",
      "predict_top_k"};
  return *fields;
}

std::string RunIdentity(const proto::TrainingArguments& args, const std::string& job_extra) {
  proto::TrainingArguments kept = args;
  const google::protobuf::Reflection* reflection = kept.GetReflection();
  for (const std::string& name : RunIdentityIgnoredFields()) {
    const google::protobuf::FieldDescriptor* field = kept.GetDescriptor()->FindFieldByName(name);
    if (field != nullptr) reflection->ClearField(&kept, field);
  }
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    kept.SerializeToCodedStream(&coded);
  }
  bytes += job_extra;
  return absl::StrFormat("%08x%08x", Crc32c(bytes), Crc32cExtend(0x9e3779b9u, bytes.data(), bytes.size()));
}

}  // namespace cpptrain
