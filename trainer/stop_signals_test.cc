// StopSignals in forked children (a signal's default action ends the process): the first
// SIGTERM or SIGINT is recorded, a copy within a second is the same request, a second request
// later ends the process as the signal would, so does the grace period running out (and
// nothing does without one, or once the StopSignals is gone), the previous handlers come
// back, and CPPTRAIN_STOP_GRACE_S is read or refused.
#include "trainer/stop_signals.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include <gmock/gmock.h>
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

// A step stuck after the first request: the process ends as SIGTERM would, after the grace
// period, with a line on stderr saying why.
TEST(StopSignalsTest, AProcessStillRunningAfterTheGracePeriodEnds) {
  int err[2];
  ASSERT_EQ(pipe(err), 0);
  const auto start = std::chrono::steady_clock::now();
  const int status = InChild([&err] {
    dup2(err[1], STDERR_FILENO);
    StopSignals stop(absl::Seconds(1));
    raise(SIGTERM);
    std::this_thread::sleep_for(std::chrono::seconds(20));  // the stuck step
    return 0;
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(err[1]);
  char buffer[512] = {};
  const ssize_t n = read(err[0], buffer, sizeof(buffer) - 1);
  close(err[0]);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the child exited instead";
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_GE(seconds, 0.9);
  EXPECT_LT(seconds, 10.0);
  ASSERT_GT(n, 0);
  EXPECT_THAT(std::string(buffer), ::testing::HasSubstr(
                                       "still running 1 s after the stop signal (the step or "
                                       "the checkpoint save is stuck)"));
}

TEST(StopSignalsTest, WithoutAGracePeriodOrOnceDestroyedNothingEndsTheProcess) {
  const int unlimited = InChild([] {
    StopSignals stop(absl::ZeroDuration());
    raise(SIGINT);
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return StopSignals::Requested() == SIGINT ? 0 : 1;
  });
  ASSERT_TRUE(WIFEXITED(unlimited)) << "signal " << WTERMSIG(unlimited);
  EXPECT_EQ(WEXITSTATUS(unlimited), 0);
  const int destroyed = InChild([] {
    {
      StopSignals stop(absl::Seconds(1));
      raise(SIGTERM);
    }  // training returned after its save: no grace period runs on
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    return 0;
  });
  ASSERT_TRUE(WIFEXITED(destroyed)) << "signal " << WTERMSIG(destroyed);
  EXPECT_EQ(WEXITSTATUS(destroyed), 0);
}

TEST(StopSignalsTest, TheGracePeriodComesFromTheEnvironment) {
  unsetenv("CPPTRAIN_STOP_GRACE_S");
  EXPECT_EQ(*StopGraceFromEnvironment(), absl::Seconds(60));
  setenv("CPPTRAIN_STOP_GRACE_S", "0", 1);
  EXPECT_EQ(*StopGraceFromEnvironment(), absl::ZeroDuration());
  setenv("CPPTRAIN_STOP_GRACE_S", "300", 1);
  EXPECT_EQ(*StopGraceFromEnvironment(), absl::Seconds(300));
  for (const char* bad : {"-1", "1.5", "soon", "86401"}) {
    setenv("CPPTRAIN_STOP_GRACE_S", bad, 1);
    absl::StatusOr<absl::Duration> grace = StopGraceFromEnvironment();
    ASSERT_FALSE(grace.ok()) << bad;
    EXPECT_THAT(std::string(grace.status().message()),
                ::testing::HasSubstr(std::string("CPPTRAIN_STOP_GRACE_S=\"") + bad + "\""));
  }
  unsetenv("CPPTRAIN_STOP_GRACE_S");
}

}  // namespace
}  // namespace cpptrain
