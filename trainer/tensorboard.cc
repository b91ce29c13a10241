#include "trainer/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <filesystem>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "checkpoint/crc32c.h"
#include "module/trainable_model.h"
#include "proto/tensorboard.pb.h"

namespace cpptrain {
namespace {

// TFRecord's masking of a CRC-32C (so CRCs of data that holds CRCs stay well mixed).
uint32_t Masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

double WallTime() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string HostName() {
  char name[256] = {};
  return gethostname(name, sizeof(name) - 1) == 0 ? std::string(name) : std::string("host");
}

}  // namespace

std::string TfRecord(absl::string_view data) {
  std::string length;
  AppendLittleEndian(data.size(), 8, &length);
  std::string record = length;
  AppendLittleEndian(Masked(Crc32c(length)), 4, &record);
  record.append(data.data(), data.size());
  AppendLittleEndian(Masked(Crc32c(data)), 4, &record);
  return record;
}

std::string TensorBoardTag(const std::string& key) {
  if (absl::StartsWith(key, "eval_")) return absl::StrCat("eval/", key.substr(5));
  if (absl::StartsWith(key, "test_")) return absl::StrCat("test/", key.substr(5));
  return absl::StrCat("train/", key);
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Open(
    const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat("logging_dir \"", dir, "\" cannot be created: ",
                                                      error.message()));
  }
  const auto seconds = static_cast<int64_t>(WallTime());
  std::string path = (std::filesystem::path(dir) /
                      absl::StrCat("events.out.tfevents.", seconds, ".", HostName(), ".", getpid()))
                         .string();
  // For tests of a failing disk: the event file is this path instead (/dev/full).
  if (const char* file = std::getenv("CPPTRAIN_TEST_TENSORBOARD_EVENT_FILE"); file != nullptr) {
    path = file;
  }
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create TensorBoard event file ", path, ": ", std::strerror(errno)));
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, file));
  proto::tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_file_version("brain.Event:2");
  CT_RETURN_IF_ERROR(writer->WriteRecord(event.SerializeAsString()));
  CT_RETURN_IF_ERROR(writer->Flush());
  return writer;
}

TensorBoardWriter::~TensorBoardWriter() { std::fclose(file_); }

absl::Status TensorBoardWriter::WriteRecord(absl::string_view data) {
  const std::string record = TfRecord(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) {
    return absl::DataLossError(
        absl::StrCat("cannot write TensorBoard event file '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status TensorBoardWriter::AddScalar(const std::string& tag, float value, int64_t step) {
  proto::tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  proto::tensorboard::SummaryValue* scalar = event.mutable_summary()->add_value();
  scalar->set_tag(tag);
  scalar->set_simple_value(value);
  return WriteRecord(event.SerializeAsString());
}

absl::Status TensorBoardWriter::AddText(const std::string& tag, const std::string& text,
                                       int64_t step) {
  constexpr int kDtString = 7;  // TensorFlow's DT_STRING
  proto::tensorboard::Event event;
  event.set_wall_time(WallTime());
  event.set_step(step);
  proto::tensorboard::SummaryValue* value = event.mutable_summary()->add_value();
  value->set_tag(tag + "/text_summary");
  value->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  proto::tensorboard::TensorValue* tensor = value->mutable_tensor();
  tensor->set_dtype(kDtString);
  tensor->mutable_tensor_shape()->add_dim()->set_size(1);
  tensor->add_string_val(text);
  return WriteRecord(event.SerializeAsString());
}

absl::Status TensorBoardWriter::Flush() {
  if (std::fflush(file_) != 0) {
    return absl::DataLossError(
        absl::StrCat("cannot write TensorBoard event file '", path_, "': ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

bool TensorBoardCallback::EnsureOpen() {
  if (writer_ != nullptr) return true;
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> opened = TensorBoardWriter::Open(dir_);
  if (!opened.ok()) {
    Fail(opened.status());
    return false;
  }
  writer_ = std::move(*opened);
  return true;
}

void TensorBoardCallback::Fail(const absl::Status& status) {
  // report_to asked for the dashboard: a run that silently stops feeding it is not what was
  // asked for, so the Trainer ends the run (after a checkpoint) with this.
  if (status.ok() || !status_.ok()) return;
  status_ = absl::Status(status.code(), absl::StrCat("report_to tensorboard: ", status.message(),
                                                     "; free space on that disk or set "
                                                     "logging_dir to another one"));
}

void TensorBoardCallback::OnTrainBegin(const CallbackContext& c) {
  if (!c.state.is_world_process_zero || !status_.ok() || !EnsureOpen()) return;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string args;
  absl::Status status = absl::OkStatus();
  if (google::protobuf::util::MessageToJsonString(c.args, &args, options).ok()) {
    status = writer_->AddText("args", args, c.state.global_step);
  }
  const std::string config = c.model != nullptr ? c.model->ConfigJson() : "";
  if (status.ok() && !config.empty()) {
    status = writer_->AddText("model_config", config, c.state.global_step);
  }
  if (status.ok()) status = writer_->Flush();
  Fail(status);
}

void TensorBoardCallback::OnLog(const CallbackContext& c, const Metrics& logs) {
  if (!c.state.is_world_process_zero || !status_.ok() || !EnsureOpen()) return;
  absl::Status status = absl::OkStatus();
  for (const auto& [key, value] : logs) {
    if (!status.ok() || key == "step") continue;
    status = writer_->AddScalar(TensorBoardTag(key), static_cast<float>(value),
                                c.state.global_step);
  }
  if (status.ok()) status = writer_->Flush();
  Fail(status);
}

void TensorBoardCallback::OnTrainEnd(const CallbackContext& c) {
  if (writer_ != nullptr && status_.ok()) {
    const absl::Status flushed = writer_->Flush();
    if (!flushed.ok()) status_ = flushed;
  }
}

}  // namespace cpptrain
