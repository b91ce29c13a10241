// The one place glog is included (Debian 12's Abseil has no absl/log; switching later means
// changing this header only). Every line carries the process rank once InitLogging ran.
//
//   cpptrain::InitLogging(argv[0], rank);
//   LOG(INFO) << "step " << step;          // "[rank 1] I1129 ... step 3"
//   CT_LOG_RANK0(INFO) << "progress only once";
#ifndef CPPTRAIN_BASE_LOGGING_H_
#define CPPTRAIN_BASE_LOGGING_H_

#include <glog/logging.h>

namespace cpptrain {

// Sets the rank shown on every log line and initializes glog (once per process; later calls
// only update the rank). Logs go to stderr.
void InitLogging(const char* argv0, int rank);

// The rank given to InitLogging, 0 before it.
int LogRank();

}  // namespace cpptrain

// Logs only on rank 0.
#define CT_LOG_RANK0(severity) LOG_IF(severity, ::cpptrain::LogRank() == 0)

#endif  // CPPTRAIN_BASE_LOGGING_H_
