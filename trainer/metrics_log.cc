#include "trainer/metrics_log.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

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

void MetricsLogCallback::OnTrainBegin(const CallbackContext& c) {
  // Opened again by the next log: overwrite_output_dir may have removed the file.
  if (out_.is_open()) out_.close();
  if (!c.state.is_world_process_zero || c.state.global_step == 0) return;
  const std::string temp = path_ + ".tmp";
  {
    std::ofstream rewritten(temp, std::ios::trunc);
    for (const Metrics& record : c.state.log_history) rewritten << MetricsToJson(record) << '\n';
    if (!rewritten.flush()) {
      LOG(ERROR) << "cannot write " << temp << "; " << path_ << " keeps the replayed steps";
      std::remove(temp.c_str());
      return;
    }
  }
  if (std::rename(temp.c_str(), path_.c_str()) != 0) {
    LOG(ERROR) << "cannot replace " << path_ << " by " << temp << "; it keeps the replayed steps";
    std::remove(temp.c_str());
  }
}

void MetricsLogCallback::OnLog(const CallbackContext& c, const Metrics& logs) {
  if (!c.state.is_world_process_zero) return;
  if (!out_.is_open()) {
    out_.open(path_, std::ios::app);
    if (!out_) {
      LOG(ERROR) << "cannot open metrics log " << path_
                 << " for appending; metrics go to the log only";
      return;
    }
  }
  out_ << MetricsToJson(logs) << '\n';
  out_.flush();
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
