// TensorBoard scalars without TensorFlow: event files written here (TFRecord framing with masked
// CRC-32C, the Event/Summary messages of proto/tensorboard.proto), and the callback that
// report_to: "tensorboard" installs, which logs every metric the Trainer logs under Hugging
// Face's names ("loss" -> train/loss, "eval_loss" -> eval/loss, "test_..." -> test/...).
//
//   CT_ASSIGN_OR_RETURN(auto writer, TensorBoardWriter::Open("/tmp/run/runs/x"));
//   CT_RETURN_IF_ERROR(writer->AddScalar("train/loss", 2.5f, /*step=*/10));
//   CT_RETURN_IF_ERROR(writer->Flush());
//   trainer.AddCallback(std::make_shared<TensorBoardCallback>(ResolvedLoggingDir(args)));
#ifndef CPPTRAIN_TRAINER_TENSORBOARD_H_
#define CPPTRAIN_TRAINER_TENSORBOARD_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/callbacks.h"

namespace cpptrain {

// One event file, events.out.tfevents.<seconds>.<host>.<pid>, in `dir`.
class TensorBoardWriter {
 public:
  // Creates `dir` if needed and writes the file-version record. Errors name the path.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Open(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  const std::string& path() const { return path_; }
  absl::Status AddScalar(const std::string& tag, float value, int64_t step);
  // A text summary under "<tag>/text_summary", as torch.utils.tensorboard's add_text writes it
  // (TensorBoard's Text tab).
  absl::Status AddText(const std::string& tag, const std::string& text, int64_t step);
  // Makes what was written visible to readers (TensorBoard reads files as they grow).
  absl::Status Flush();

 private:
  TensorBoardWriter(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  absl::Status WriteRecord(absl::string_view data);

  std::string path_;
  std::FILE* file_;
};

// A record of the TFRecord format: length, masked CRC-32C of the length, data, masked
// CRC-32C of the data (little-endian). Exposed for tests.
std::string TfRecord(absl::string_view data);

// Hugging Face's TensorBoard tag for a logged key: "eval_loss" -> "eval/loss",
// "test_accuracy" -> "test/accuracy", anything else "train/<key>".
std::string TensorBoardTag(const std::string& key);

// Logs every metric of every log event (not "step", the x axis) on the world's process 0,
// opening its event file at the first one; at the start of training, as Hugging Face does, the
// training arguments ("args") and the model's configuration ("model_config", when
// TrainableModel::ConfigJson has one) as JSON text. A write that fails stops the writing, and
// status() names the file and the cause: the Trainer ends the run with it.
class TensorBoardCallback : public TrainerCallback {
 public:
  explicit TensorBoardCallback(std::string logging_dir) : dir_(std::move(logging_dir)) {}
  void OnTrainBegin(const CallbackContext& c) override;
  void OnLog(const CallbackContext& c, const Metrics& logs) override;
  void OnTrainEnd(const CallbackContext& c) override;
  absl::Status status() const override { return status_; }

 private:
  // Opens the event file on first use; false (with status_ set) when that fails.
  bool EnsureOpen();
  // Keeps the first failure of a write, said as a report_to failure.
  void Fail(const absl::Status& status);

  std::string dir_;
  std::unique_ptr<TensorBoardWriter> writer_;
  absl::Status status_;  // the first failure; nothing is written after it
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_TENSORBOARD_H_
