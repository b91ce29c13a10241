#include "print_metrics_callback.h"

#include <iomanip>
#include <string>

namespace example {
namespace {

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

void PrintMetricsCallback::Prefix(const cpptrain::TrainerState& state) {
  out_ << "[step " << state.global_step << " | epoch " << std::fixed << std::setprecision(2)
       << state.epoch << "]";
}

void PrintMetricsCallback::OnLog(const cpptrain::CallbackContext& c,
                                 const cpptrain::Metrics& logs) {
  if (!c.state.is_world_process_zero || logs.count("loss") == 0) return;
  Prefix(c.state);
  for (const char* key : {"loss", "learning_rate", "grad_norm"}) {
    auto it = logs.find(key);
    if (it != logs.end()) out_ << " " << key << " " << std::setprecision(4) << it->second;
  }
  out_ << "\n";
}

void PrintMetricsCallback::OnEvaluate(const cpptrain::CallbackContext& c,
                                      const cpptrain::Metrics& metrics) {
  ++evaluations_;
  if (!c.state.is_world_process_zero) return;
  Prefix(c.state);
  out_ << " eval";
  for (const auto& [key, value] : metrics) {
    // Speed figures (eval_runtime, eval_samples_per_second, ...) are left out.
    if (!StartsWith(key, "eval_") || key.find("runtime") != std::string::npos ||
        key.find("per_second") != std::string::npos) {
      continue;
    }
    out_ << " " << key.substr(5) << " " << std::setprecision(4) << value;
  }
  out_ << "\n";
}

void PrintMetricsCallback::OnTrainEnd(const cpptrain::CallbackContext& c) {
  if (!c.state.is_world_process_zero) return;
  out_ << "training ended after " << c.state.global_step << " of " << c.state.max_steps << " steps";
  if (c.state.best_metric.has_value()) {
    out_ << "; best " << std::setprecision(4) << *c.state.best_metric << " at step "
         << c.state.best_global_step.value_or(0);
  }
  out_ << std::endl;
}

}  // namespace example
