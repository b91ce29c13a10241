// StopSignals in forked children (a signal's default action ends the process): the first
// SIGTERM or SIGINT is recorded, a copy within a second is the same request, a second request
// later ends the process as the signal would, and the previous handlers come back.
#include "trainer/stop_signals.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace cpptrain {
namespace {

// Runs `body` in a child and returns its wait status.
template <typename Body>
int InChild(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

TEST(StopSignalsTest, TheFirstSignalIsRecordedAndADuplicateIsTheSameRequest) {
  for (int signal : {SIGTERM, SIGINT}) {
    const int status = InChild([signal] {
      StopSignals stop;
      raise(signal);
      raise(signal);  // delivered twice at once: scheduler and launcher
      return StopSignals::Requested() == signal ? 0 : 1;
    });
    ASSERT_TRUE(WIFEXITED(status)) << "signal " << signal << " ended the child";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "signal " << signal;
  }
}

TEST(StopSignalsTest, ASecondRequestLaterEndsTheProcess) {
  const int status = InChild([] {
    StopSignals stop;
    raise(SIGTERM);
    // Past the window in which a copy counts as the same signal.
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    raise(SIGINT);
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGINT);
}

TEST(StopSignalsTest, ThePreviousHandlersComeBack) {
  const int status = InChild([] {
    { StopSignals stop; }
    raise(SIGTERM);  // the default action again
    return 0;
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
}

}  // namespace
}  // namespace cpptrain
