#include "trainer/metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/logging.h"

namespace cpptrain {
namespace {

std::string JsonNumber(double v) {
  if (!std::isfinite(v)) return "null";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.10g", v);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

// Writes all of `text` to `fd`, retrying short writes and EINTR. On failure: the error, naming
// `path`, how much of the text went out and the file's size before; the file is cut back to
// that size where it is a regular file, so it ends at a whole line.
absl::Status WriteAll(int fd, const std::string& path, const std::string& text) {
  struct stat before = {};
  const bool regular = fstat(fd, &before) == 0 && S_ISREG(before.st_mode);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const int error = n < 0 ? errno : EIO;
    std::string cut = "";
    if (regular && done > 0) {
      cut = ftruncate(fd, before.st_size) == 0
                ? "; the part written was removed, so the file ends at its last whole record"
                : absl::StrCat("; the part written could not be removed (",
                               std::strerror(errno), "), so the file ends mid-record");
    }
    return absl::Status(
        error == ENOSPC || error == EDQUOT ? absl::StatusCode::kResourceExhausted
                                           : absl::StatusCode::kDataLoss,
        absl::StrCat("cannot write metrics log '", path, "': ", std::strerror(error), " (",
                     done, " of ", text.size(), " bytes written", cut,
                     "); free space on its disk or set output_dir to another one"));
  }
  return absl::OkStatus();
}

std::string FormatDuration(double seconds) {
  const int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  return absl::StrFormat("%02d:%02d:%02d", s / 3600, (s / 60) % 60, s % 60);
}

}  // namespace

std::string MetricsToJson(const Metrics& metrics) {
  std::string out = "{";
  for (const auto& [key, value] : metrics) {
    if (out.size() > 1) out += ",";
    absl::StrAppend(&out, JsonString(key), ":", JsonNumber(value));
  }
  return out + "}";
}

MetricsLogCallback::~MetricsLogCallback() { Close(); }

void MetricsLogCallback::Close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void MetricsLogCallback::OnTrainBegin(const CallbackContext& c) {
  // Opened again by the next log: overwrite_output_dir may have removed the file.
  Close();
  status_ = absl::OkStatus();
  if (!c.state.is_world_process_zero || c.state.global_step == 0) return;
  const std::string temp = path_ + ".tmp";
  std::string text;
  for (const Metrics& record : c.state.log_history) absl::StrAppend(&text, MetricsToJson(record), "\n");
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  absl::Status written =
      fd < 0 ? absl::DataLossError(absl::StrCat("cannot create metrics log '", temp, "': ",
                                                std::strerror(errno)))
             : WriteAll(fd, temp, text);
  if (fd >= 0 && ::close(fd) != 0 && written.ok()) {
    written = absl::DataLossError(
        absl::StrCat("cannot write metrics log '", temp, "': ", std::strerror(errno)));
  }
  if (written.ok() && std::rename(temp.c_str(), path_.c_str()) != 0) {
    written = absl::DataLossError(absl::StrCat("cannot replace metrics log '", path_, "' by '",
                                               temp, "': ", std::strerror(errno)));
  }
  if (!written.ok()) {
    std::remove(temp.c_str());
    status_ = written;
  }
}

void MetricsLogCallback::OnLog(const CallbackContext& c, const Metrics& logs) {
  if (!c.state.is_world_process_zero || !status_.ok()) return;
  if (fd_ < 0) {
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      status_ = absl::DataLossError(absl::StrCat("cannot open metrics log '", path_,
                                                 "' for appending: ", std::strerror(errno)));
      return;
    }
  }
  status_ = WriteAll(fd_, path_, MetricsToJson(logs) + "\n");
  if (!status_.ok()) Close();
}

void MetricsLogCallback::OnTrainEnd(const CallbackContext& c) {
  // A disk that reports its errors only at close (NFS) fails here.
  if (fd_ >= 0 && ::close(fd_) != 0 && status_.ok()) {
    status_ = absl::DataLossError(
        absl::StrCat("cannot write metrics log '", path_, "': ", std::strerror(errno)));
  }
  fd_ = -1;
}

void ProgressCallback::OnTrainBegin(const CallbackContext& c) {
  terminal_ = isatty(STDERR_FILENO) && !c.args.disable_tqdm() && c.state.is_world_process_zero;
  start_seconds_ = MonotonicSeconds();
  start_step_ = c.state.global_step;
}

void ProgressCallback::Draw(const CallbackContext& c) {
  const int64_t step = c.state.global_step;
  const int64_t total = std::max<int64_t>(1, c.state.max_steps);
  const double elapsed = MonotonicSeconds() - start_seconds_;
  const double rate = elapsed > 0 ? (step - start_step_) / elapsed : 0;
  const double eta = rate > 0 ? (total - step) / rate : 0;
  constexpr int kWidth = 30;
  const int filled = static_cast<int>(kWidth * std::min<double>(1.0, double(step) / total));
  std::string bar(filled, '#');
  bar.append(kWidth - filled, '.');
  std::string loss = last_loss_ >= 0 ? absl::StrFormat(" loss %.4g", last_loss_) : "";
  std::fprintf(stderr, "\r[%s] %lld/%lld %.2f it/s ETA %s%s   ", bar.c_str(),
               static_cast<long long>(step), static_cast<long long>(total), rate,
               FormatDuration(eta).c_str(), loss.c_str());
  std::fflush(stderr);
}

void ProgressCallback::OnStepEnd(const CallbackContext& c) {
  if (terminal_) Draw(c);
}

void ProgressCallback::OnLog(const CallbackContext& c, const Metrics& logs) {
  if (auto it = logs.find("loss"); it != logs.end()) last_loss_ = it->second;
  if (terminal_) {
    std::fprintf(stderr, "\n%s\n", MetricsToJson(logs).c_str());
    Draw(c);
  } else {
    CT_LOG_RANK0(INFO) << MetricsToJson(logs);
  }
}

void ProgressCallback::OnTrainEnd(const CallbackContext& c) {
  if (terminal_) std::fprintf(stderr, "\n");
}

}  // namespace cpptrain
