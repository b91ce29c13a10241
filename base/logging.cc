// Debian's glog 0.6 library is built with custom-prefix support, but its installed header
// does not define the switch that declares it.
#define GLOG_CUSTOM_PREFIX_SUPPORT 1
#include "base/logging.h"

#include <atomic>
#include <iomanip>
#include <ostream>

namespace cpptrain {
namespace {

std::atomic<int> g_rank{0};
std::atomic<bool> g_initialized{false};

void RankPrefix(std::ostream& s, const google::LogMessageInfo& info, void*) {
  s << "[rank " << g_rank.load() << "] " << info.severity[0] << std::setw(2)
    << std::setfill('0') << 1 + info.time.month() << std::setw(2) << info.time.day() << ' '
    << std::setw(2) << info.time.hour() << ':' << std::setw(2) << info.time.min() << ':'
    << std::setw(2) << info.time.sec() << ' ' << info.filename << ':' << info.line_number
    << ']';
}

}  // namespace

void InitLogging(const char* argv0, int rank) {
  g_rank.store(rank);
  bool expected = false;
  if (g_initialized.compare_exchange_strong(expected, true) &&
      !google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging(argv0, &RankPrefix, nullptr);
  }
}

int LogRank() { return g_rank.load(); }

}  // namespace cpptrain
