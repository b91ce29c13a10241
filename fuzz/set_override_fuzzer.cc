// Fuzzes the --set overrides (config/text_proto.h ApplyOverride and ApplyOverrides) on a
// proto::TrainJob like tools/demo.textproto. The input is up to 8 assignments, one per line. Each
// is applied alone and must either fail leaving the job unchanged, or change nothing but the
// field its path names (and that field's oneof); ApplyOverrides of all of them must succeed
// exactly when each succeeds in turn, with the same result, and leave the job unchanged on error.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "config/text_proto.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/proto_util.h"
#include "google/protobuf/descriptor.h"
#include "proto/job.pb.h"

namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

constexpr char kBaseJob[] = R"pb(
  args {
    output_dir: "/tmp/cpptrain_demo"
    per_device_train_batch_size: 32
    gradient_accumulation_steps: 1
    max_steps: 300
    learning_rate: 3e-3
    lr_scheduler_type: COSINE
    warmup_steps: 0.05
    logging_steps: 10
    eval_strategy: STEPS
    eval_steps: 100
    save_strategy: NO
    seed: 42
    local { device: "auto" }
  }
  model { name: "demo" }
  data { builtin: "arithmetic" seq_len: 64 }
)pb";

// Clears `field` of `message`, and the rest of its oneof.
void ClearFieldAndOneof(Message* message, const FieldDescriptor* field) {
  if (field->containing_oneof() != nullptr) {
    message->GetReflection()->ClearOneof(message, field->containing_oneof());
  }
  message->GetReflection()->ClearField(message, field);
}

// Whether `after` differs from `before` only in the field at parts[i:] (parts name fields of
// singular messages down to the leaf, as ApplyOverride's path does).
bool OnlyPathChanged(const Message& before, const Message& after,
                     const std::vector<std::string>& parts, size_t i) {
  const FieldDescriptor* field = before.GetDescriptor()->FindFieldByName(parts[i]);
  if (field == nullptr) return false;
  if (i + 1 < parts.size()) {
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
      return false;
    }
    if (!OnlyPathChanged(before.GetReflection()->GetMessage(before, field),
                         after.GetReflection()->GetMessage(after, field), parts, i + 1)) {
      return false;
    }
  }
  std::unique_ptr<Message> b(before.New()), a(after.New());
  b->CopyFrom(before);
  a->CopyFrom(after);
  ClearFieldAndOneof(b.get(), field);
  ClearFieldAndOneof(a.get(), field);
  return cpptrain::fuzz::SameMessage(*b, *a);
}

std::vector<std::string> PathOf(absl::string_view assignment) {
  const absl::string_view path =
      absl::StripAsciiWhitespace(assignment.substr(0, assignment.find('=')));
  return absl::StrSplit(path, '.');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const cpptrain::proto::TrainJob* const base = [] {
    auto* job = new cpptrain::proto::TrainJob();
    const absl::Status parsed = cpptrain::ParseTextProto(kBaseJob, "base job", job);
    FUZZ_CHECK(parsed.ok(), parsed);
    return job;
  }();
  std::vector<std::string> assignments =
      absl::StrSplit(absl::string_view(reinterpret_cast<const char*>(data), size), '\n');
  if (assignments.size() > 8) assignments.resize(8);

  cpptrain::proto::TrainJob job = *base;
  bool all_ok = true;
  for (const std::string& assignment : assignments) {
    const cpptrain::proto::TrainJob before = job;
    const absl::Status applied = cpptrain::ApplyOverride(assignment, &job);
    if (!applied.ok()) {
      all_ok = false;
      FUZZ_CHECK(cpptrain::fuzz::SameMessage(before, job),
                 "a failed --set=" << assignment << " changed the job: " << applied);
      continue;
    }
    FUZZ_CHECK(OnlyPathChanged(before, job, PathOf(assignment), 0),
               "--set=" << assignment << " changed fields other than its own:\nbefore:\n"
                        << before.DebugString() << "after:\n"
                        << job.DebugString());
  }

  cpptrain::proto::TrainJob together = *base;
  const absl::Status all = cpptrain::ApplyOverrides(assignments, &together);
  FUZZ_CHECK(all.ok() == all_ok, "ApplyOverrides: " << all << " (one at a time: "
                                                    << (all_ok ? "all passed" : "some failed")
                                                    << ")");
  FUZZ_CHECK(cpptrain::fuzz::SameMessage(together, all.ok() ? job : *base),
             "ApplyOverrides gave another job than the assignments one at a time");
  return 0;
}
