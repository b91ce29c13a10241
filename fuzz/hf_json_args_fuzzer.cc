// Fuzzes TrainingArguments' JSON-valued fields as transformers takes them
// (config/hf_json_args.h): the first byte picks deepspeed, fsdp_config or accelerator_config,
// the rest is the inline JSON (inputs that would name a file are skipped: no file system here).
// A refused input's error starts with the field's name; an accepted one's assignments all
// apply to a TrainingArguments (the translation checks each value, so none may reach
// ApplyOverride malformed).
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "config/hf_json_args.h"
#include "config/text_proto.h"
#include "fuzz/fuzz_util.h"
#include "glog/logging.h"
#include "proto/training_args.pb.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  static const char* const kNames[] = {"deepspeed", "fsdp_config", "accelerator_config"};
  const std::string name = kNames[data[0] % 3];
  const std::string json(reinterpret_cast<const char*>(data + 1), size - 1);
  // Only the inline form: a value that does not open an object is a path.
  const absl::string_view stripped = absl::StripAsciiWhitespace(json);
  if (stripped.empty() || stripped.front() != '{') return 0;
  const auto translation = cpptrain::TranslateHfJsonArgument(name, json);
  if (!translation.ok()) {
    FUZZ_CHECK(absl::StartsWith(translation.status().message(), name + "="),
               "an error that does not start with " << name << "=: " << translation.status());
    return 0;
  }
  cpptrain::proto::TrainingArguments args;
  const absl::Status applied = cpptrain::ApplyOverrides(translation->assignments, &args);
  FUZZ_CHECK(applied.ok(), "the translation made assignments that do not apply: "
                               << applied << "\n" << absl::StrJoin(translation->assignments, "\n"));
  return 0;
}
