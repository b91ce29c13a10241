// Writes every log record as one JSON object per line to <output_dir>/metrics.jsonl (world
// process 0 only), written through to the file after each line so a crashed run keeps what it
// logged. A resumed run's file holds the checkpoint's log history followed by the resumed
// steps. A write that fails (a full disk) is cut back to the last whole line where the file
// allows it, nothing more is written, and status() names the file and the cause: the Trainer
// ends the run with it.
//
//   trainer.AddCallback(std::make_shared<MetricsLogCallback>("/tmp/run/metrics.jsonl"));
#ifndef CPPTRAIN_TRAINER_METRICS_LOG_H_
#define CPPTRAIN_TRAINER_METRICS_LOG_H_

#include <string>

#include "absl/status/status.h"

#include "trainer/callbacks.h"

namespace cpptrain {

// {"epoch":0.5,"loss":1.25,"step":10} with keys in sorted order; integers print without a
// fraction; NaN and infinities print as null (JSON has no literal for them).
std::string MetricsToJson(const Metrics& metrics);

class MetricsLogCallback : public TrainerCallback {
 public:
  explicit MetricsLogCallback(std::string path) : path_(std::move(path)) {}
  // After a resume (global_step > 0): the file is rewritten with the restored log history,
  // so the steps after the checkpoint, which the resumed run logs again, appear once.
  void OnTrainBegin(const CallbackContext& c) override;
  void OnLog(const CallbackContext& c, const Metrics& logs) override;
  void OnTrainEnd(const CallbackContext& c) override;
  absl::Status status() const override { return status_; }
  const std::string& path() const { return path_; }
  ~MetricsLogCallback() override;

 private:
  void Close();

  std::string path_;
  int fd_ = -1;
  absl::Status status_;
};

// Shows progress: a bar with steps, rate, ETA and the last loss when stderr is a terminal;
// otherwise one line per log record on rank 0.
class ProgressCallback : public TrainerCallback {
 public:
  void OnTrainBegin(const CallbackContext& c) override;
  void OnStepEnd(const CallbackContext& c) override;
  void OnLog(const CallbackContext& c, const Metrics& logs) override;
  void OnTrainEnd(const CallbackContext& c) override;

 private:
  void Draw(const CallbackContext& c);

  bool terminal_ = false;
  double start_seconds_ = 0;
  int64_t start_step_ = 0;
  double last_loss_ = -1;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_METRICS_LOG_H_
