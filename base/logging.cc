// Debian's glog 0.6 library is built with custom-prefix support, but its installed header
// does not define the switch that declares it.
#define GLOG_CUSTOM_PREFIX_SUPPORT 1
#include "base/logging.h"

#include <atomic>
#include <cstdlib>
#include <string>
#include <iomanip>
#include <ostream>

namespace cpptrain {
namespace {

std::atomic<int> g_rank{0};
std::atomic<bool> g_initialized{false};
// Set when //tools:launch already prefixes every output line with the rank.
std::atomic<bool> g_prefixed_by_launcher{false};

void RankPrefix(std::ostream& s, const google::LogMessageInfo& info, void*) {
  if (!g_prefixed_by_launcher.load()) s << "[rank " << g_rank.load() << "] ";
  s << info.severity[0] << std::setw(2)
    << std::setfill('0') << 1 + info.time.month() << std::setw(2) << info.time.day() << ' '
    << std::setw(2) << info.time.hour() << ':' << std::setw(2) << info.time.min() << ':'
    << std::setw(2) << info.time.sec() << ' ' << info.filename << ':' << info.line_number
    << ']';
}

}  // namespace

void InitLogging(const char* argv0, int rank) {
  g_rank.store(rank);
  const char* prefixed = std::getenv("CPPTRAIN_OUTPUT_PREFIXED");
  g_prefixed_by_launcher.store(prefixed != nullptr && std::string(prefixed) == "1");
  bool expected = false;
  if (g_initialized.compare_exchange_strong(expected, true) &&
      !google::IsGoogleLoggingInitialized()) {
    FLAGS_logtostderr = true;
    google::InitGoogleLogging(argv0, &RankPrefix, nullptr);
  }
}

int LogRank() { return g_rank.load(); }

}  // namespace cpptrain
