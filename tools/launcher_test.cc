#include "tools/launcher.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/strings/substitute.h"

extern char** environ;

namespace cpptrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;

// Upper bound for anything the tests wait on; reaching it is a failure, never a sync point.
constexpr auto kDeadline = std::chrono::seconds(60);

std::string Runfile(const std::string& path) {
  return absl::StrCat(getenv("TEST_SRCDIR"), "/", getenv("TEST_WORKSPACE"), "/", path);
}

const std::string& WaitForever() {
  static const std::string* path =
      new std::string(Runfile("tools/testdata/launch/wait_forever.sh"));
  return *path;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

bool Exists(const std::string& path) {
  struct stat info;
  return stat(path.c_str(), &info) == 0;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  return lines;
}

// Lines starting with `prefix`, in order.
std::vector<std::string> LinesOf(const std::string& text, const std::string& prefix) {
  std::vector<std::string> found;
  for (const std::string& line : Lines(text)) {
    if (absl::StartsWith(line, prefix)) found.push_back(line);
  }
  return found;
}

pid_t ReadPid(const std::string& path) {
  int pid = 0;
  EXPECT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadFile(path)), &pid)) << path;
  return pid;
}

// A zombie (killed, not yet reaped by whoever inherited it) counts as gone.
bool IsAlive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  const std::string stat = ReadFile(absl::StrCat("/proc/", pid, "/stat"));
  const size_t paren = stat.rfind(')');
  return paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] != 'Z';
}

double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::vector<std::string> Sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

// A listening socket on 127.0.0.1 with a port the kernel picked.
class Listener {
 public:
  Listener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(addr);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &length), 0);
    port_ = ntohs(addr.sin_port);
  }
  ~Listener() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

bool CanListenOn(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok =
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && listen(fd, 1) == 0;
  close(fd);
  return ok;
}

// ---------------------------------------------------------------------------------------
// Command line and options.

TEST(SplitLauncherArgsTest, AcceptsBothSpellingsAndStopsAtProgram) {
  absl::StatusOr<SplitArgs> split =
      SplitLauncherArgs({"--nproc-per-node=2", "--master_addr", "10.0.0.1", "--max-restarts", "3",
                         "--standalone", "./train", "--nproc_per_node=7", "--config", "x"});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_THAT(split->flags,
              ElementsAre(Pair("nproc_per_node", "2"), Pair("master_addr", "10.0.0.1"),
                          Pair("max_restarts", "3"), Pair("standalone", "true")));
  EXPECT_THAT(split->command, ElementsAre("./train", "--nproc_per_node=7", "--config", "x"));
  EXPECT_FALSE(split->help);
}

TEST(SplitLauncherArgsTest, BooleanFormsDoubleDashAndHelp) {
  absl::StatusOr<SplitArgs> split =
      SplitLauncherArgs({"--nostandalone", "--standalone=false", "--help", "--", "-x", "y"});
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_THAT(split->flags, ElementsAre(Pair("standalone", "false"), Pair("standalone", "false")));
  EXPECT_THAT(split->command, ElementsAre("-x", "y"));
  EXPECT_TRUE(split->help);
}

TEST(SplitLauncherArgsTest, RejectsUnknownFlagsAndMissingValues) {
  absl::StatusOr<SplitArgs> unknown = SplitLauncherArgs({"--rdzv_backend=c10d", "prog"});
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown flag --rdzv_backend=c10d"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("--nproc_per_node"));
  absl::StatusOr<SplitArgs> no_value = SplitLauncherArgs({"--nnodes"});
  ASSERT_FALSE(no_value.ok());
  EXPECT_THAT(no_value.status().message(), HasSubstr("--nnodes needs a value"));
}

LaunchOptions ValidOptions() {
  LaunchOptions options;
  options.command = {"/bin/true"};
  options.master_port = 0;
  return options;
}

void ExpectInvalid(const LaunchOptions& options, const std::string& message) {
  absl::StatusOr<LaunchOptions> resolved = ResolveLaunchOptions(options);
  ASSERT_FALSE(resolved.ok()) << "expected an error containing: " << message;
  EXPECT_EQ(resolved.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(resolved.status().message(), HasSubstr(message));
}

TEST(ResolveLaunchOptionsTest, RejectsBadValuesNamingThem) {
  LaunchOptions options = ValidOptions();
  options.command.clear();
  ExpectInvalid(options, "missing PROGRAM");
  options = ValidOptions();
  options.nproc_per_node = 0;
  ExpectInvalid(options, "--nproc_per_node=0");
  options = ValidOptions();
  options.nnodes = 2;
  options.node_rank = 2;
  ExpectInvalid(options, "--node_rank=2 is outside [0, --nnodes=2)");
  options.node_rank = -1;
  ExpectInvalid(options, "--node_rank=-1");
  options = ValidOptions();
  options.master_port = 65536;
  ExpectInvalid(options, "--master_port=65536 is not a TCP port");
  options.master_port = -1;
  ExpectInvalid(options, "--master_port=-1");
  options = ValidOptions();
  options.max_restarts = -1;
  ExpectInvalid(options, "--max_restarts=-1");
  options = ValidOptions();
  options.grace_period = absl::Seconds(-1);
  ExpectInvalid(options, "--grace_period_s=-1");
  options = ValidOptions();
  options.nnodes = 2;
  ExpectInvalid(options, "--master_port=0 picks a port on this node only");
}

TEST(ResolveLaunchOptionsTest, PortInUseNamesThePortAndSuggestsZero) {
  Listener listener;
  LaunchOptions options = ValidOptions();
  options.master_port = listener.port();
  ExpectInvalid(options, absl::StrCat("--master_port=", listener.port(), " is already in use"));
  ExpectInvalid(options, "--master_port=0");
}

TEST(ResolveLaunchOptionsTest, PortZeroPicksAUsablePort) {
  absl::StatusOr<LaunchOptions> resolved = ResolveLaunchOptions(ValidOptions());
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_GT(resolved->master_port, 0);
  EXPECT_LE(resolved->master_port, 65535);
  EXPECT_TRUE(CanListenOn(resolved->master_port));
  EXPECT_FALSE(resolved->run_id.empty());
}

TEST(ResolveLaunchOptionsTest, StandaloneIsOneLocalNodeWithAFreePort) {
  LaunchOptions options = ValidOptions();
  options.standalone = true;
  options.nnodes = 4;
  options.node_rank = 3;
  options.master_addr = "10.9.9.9";
  options.master_port = 29500;
  absl::StatusOr<LaunchOptions> resolved = ResolveLaunchOptions(options);
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(resolved->nnodes, 1);
  EXPECT_EQ(resolved->node_rank, 0);
  EXPECT_EQ(resolved->master_addr, "127.0.0.1");
  EXPECT_NE(resolved->master_port, 0);
}

TEST(RankEnvironmentTest, ReplacesTorchrunVariablesAndKeepsTheRest) {
  LaunchOptions options;
  options.nproc_per_node = 4;
  options.nnodes = 3;
  options.node_rank = 2;
  options.master_addr = "host0";
  options.master_port = 1234;
  options.max_restarts = 5;
  options.run_id = "job7";
  const std::vector<std::string> env =
      RankEnvironment(options, 1, 2, {"RANK=99", "PATH=/x", "OMP_NUM_THREADS=4"});
  std::map<std::string, std::string> vars;
  for (const std::string& entry : env) {
    const std::vector<std::string> parts = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    EXPECT_TRUE(vars.emplace(parts[0], parts[1]).second) << "duplicate " << parts[0];
  }
  EXPECT_EQ(vars["RANK"], "9");  // 2 * 4 + 1
  EXPECT_EQ(vars["LOCAL_RANK"], "1");
  EXPECT_EQ(vars["WORLD_SIZE"], "12");
  EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(vars["GROUP_RANK"], "2");
  EXPECT_EQ(vars["ROLE_RANK"], "9");
  EXPECT_EQ(vars["ROLE_WORLD_SIZE"], "12");
  EXPECT_EQ(vars["MASTER_ADDR"], "host0");
  EXPECT_EQ(vars["MASTER_PORT"], "1234");
  EXPECT_EQ(vars["TORCHELASTIC_RESTART_COUNT"], "2");
  EXPECT_EQ(vars["TORCHELASTIC_MAX_RESTARTS"], "5");
  EXPECT_EQ(vars["TORCHELASTIC_RUN_ID"], "job7");
  EXPECT_EQ(vars["PATH"], "/x");
  EXPECT_EQ(vars["OMP_NUM_THREADS"], "4");
  EXPECT_EQ(RankEnvironment(options, 0, 0, {}).back(),
            absl::StrCat("OMP_NUM_THREADS=", ThreadsPerRank(UsableCpus(), 4)));
}

TEST(LauncherUnitTest, EachLocalRankGetsItsShareOfTheCpus) {
  EXPECT_EQ(ThreadsPerRank(16, 1), 16);
  EXPECT_EQ(ThreadsPerRank(16, 4), 4);
  EXPECT_EQ(ThreadsPerRank(17, 4), 4);
  EXPECT_EQ(ThreadsPerRank(3, 4), 1);
  EXPECT_EQ(ThreadsPerRank(16, 0), 16);
  EXPECT_GE(UsableCpus(), 1);
  EXPECT_EQ(CpusOfQuota("200000", "100000"), 2);  // docker --cpus=2
  EXPECT_EQ(CpusOfQuota("150000", "100000"), 2);  // --cpus=1.5: rounded up
  EXPECT_EQ(CpusOfQuota("50000", "100000"), 1);
  EXPECT_EQ(CpusOfQuota("max", "100000"), 0);  // v2: no quota
  EXPECT_EQ(CpusOfQuota("-1", "100000"), 0);   // v1: no quota
  EXPECT_EQ(CpusOfQuota("", ""), 0);           // no such file
}

TEST(LauncherCreateTest, MissingProgramIsAnError) {
  LaunchOptions options = ValidOptions();
  options.command = {"no-such-program-for-launcher-test"};
  absl::StatusOr<std::unique_ptr<Launcher>> launcher = Launcher::Create(options);
  ASSERT_FALSE(launcher.ok());
  EXPECT_EQ(launcher.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(launcher.status().message(), HasSubstr("no-such-program-for-launcher-test"));
}

// ---------------------------------------------------------------------------------------
// The library with real processes.

class LauncherTest : public ::testing::Test {
 protected:
  struct Outcome {
    LaunchResult result;
    std::string out;
    std::string err;
    double seconds = 0;
  };

  void SetUp() override {
    dir_ = absl::StrCat(getenv("TEST_TMPDIR"), "/",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0) << dir_;
  }

  LaunchOptions Options(int nproc, std::vector<std::string> command) {
    LaunchOptions options;
    options.nproc_per_node = nproc;
    options.master_port = 0;
    options.grace_period = absl::Seconds(2);
    options.command = std::move(command);
    return options;
  }

  // Runs to the end with the ranks' output in files.
  Outcome Launch(const LaunchOptions& requested) {
    Outcome outcome;
    absl::StatusOr<LaunchOptions> options = ResolveLaunchOptions(requested);
    EXPECT_TRUE(options.ok()) << options.status();
    if (!options.ok()) return outcome;
    const std::string out_path = dir_ + "/launcher.out";
    const std::string err_path = dir_ + "/launcher.err";
    options->stdout_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    options->stderr_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    absl::StatusOr<std::unique_ptr<Launcher>> launcher = Launcher::Create(*options);
    EXPECT_TRUE(launcher.ok()) << launcher.status();
    if (launcher.ok()) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<LaunchResult> result = (*launcher)->Run();
      outcome.seconds = SecondsSince(start);
      EXPECT_TRUE(result.ok()) << result.status();
      if (result.ok()) outcome.result = *result;
    }
    close(options->stdout_fd);
    close(options->stderr_fd);
    outcome.out = ReadFile(out_path);
    outcome.err = ReadFile(err_path);
    return outcome;
  }

  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  // Runs to the end like Launch, requesting a stop with `signal` (`copies` times at once, as a
  // scheduler and a process-group kill deliver it) once every rank printed "ready".
  Outcome LaunchAndStop(const LaunchOptions& requested, int signal, int copies = 1) {
    Outcome outcome;
    absl::StatusOr<LaunchOptions> options = ResolveLaunchOptions(requested);
    EXPECT_TRUE(options.ok()) << options.status();
    if (!options.ok()) return outcome;
    int out[2];
    EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
    const std::string err_path = Path("launcher.err");
    options->stdout_fd = out[1];
    options->stderr_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    absl::StatusOr<std::unique_ptr<Launcher>> launcher = Launcher::Create(*options);
    EXPECT_TRUE(launcher.ok()) << launcher.status();
    if (launcher.ok()) {
      Launcher* raw = launcher->get();
      const int ranks = options->nproc_per_node;
      std::thread reader([&outcome, &out, raw, ranks, signal, copies] {
        bool stopped = false;
        char buffer[4096];
        ssize_t n;
        while ((n = read(out[0], buffer, sizeof(buffer))) > 0) {
          outcome.out.append(buffer, static_cast<size_t>(n));
          bool all_ready = true;
          for (int rank = 0; rank < ranks; ++rank) {
            all_ready &= absl::StrContains(outcome.out, absl::StrCat("[rank ", rank, "] ready"));
          }
          if (!stopped && all_ready) {
            for (int i = 0; i < copies; ++i) raw->RequestStop(signal);
            stopped = true;
          }
        }
      });
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<LaunchResult> result = raw->Run();
      outcome.seconds = SecondsSince(start);
      close(out[1]);
      reader.join();
      EXPECT_TRUE(result.ok()) << result.status();
      if (result.ok()) outcome.result = *result;
    } else {
      close(out[1]);
    }
    close(out[0]);
    close(options->stderr_fd);
    outcome.err = ReadFile(err_path);
    return outcome;
  }


  // The pids wait_forever.sh recorded for `rank` (the rank's process and its child).
  std::vector<pid_t> RecordedPids(int rank) {
    return {ReadPid(Path(absl::StrCat("pid.", rank))), ReadPid(Path(absl::StrCat("child.", rank)))};
  }

  void ExpectAllGone(const std::vector<int>& ranks) {
    for (int rank : ranks) {
      for (pid_t pid : RecordedPids(rank)) {
        EXPECT_FALSE(IsAlive(pid)) << "rank " << rank << " pid " << pid;
      }
    }
  }

  // A script in which rank `rank` waits until the ranks `others` have written their pid files,
  // then runs `action`; the other ranks run wait_forever.sh.
  std::string AfterOthersReady(int rank, const std::vector<int>& others,
                               const std::string& action) {
    std::string wait;
    for (int other : others) {
      absl::StrAppend(&wait, "while [ ! -f '", Path(absl::StrCat("pid.", other)),
                      "' ]; do sleep 0.01; done; ");
    }
    return absl::Substitute("if [ \"$$RANK\" = $0 ]; then $1$2; fi; exec '$3' '$4'", rank, wait,
                            action, WaitForever(), dir_);
  }

  std::string dir_;
};

TEST_F(LauncherTest, AllRanksSucceed) {
  Outcome run = Launch(Options(3, Sh("exit 0")));
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_EQ(run.result.attempts, 1);
  EXPECT_EQ(run.result.failure, "");
  EXPECT_EQ(run.err, "");
}

TEST_F(LauncherTest, ExitCodeOfTheFailedRankIsPropagated) {
  Outcome run = Launch(Options(2, Sh(AfterOthersReady(1, {0}, "exit 3"))));
  EXPECT_EQ(run.result.exit_code, 3);
  EXPECT_EQ(run.result.failure, "rank 1 exited with exit code 3");
  EXPECT_THAT(run.err, HasSubstr("launch: rank 1 exited with exit code 3 (local rank 1"));
  EXPECT_LT(run.seconds, 30);
  ExpectAllGone({0});
}

TEST_F(LauncherTest, RankKilledBySignalTearsDownEverything) {
  Outcome run = Launch(Options(3, Sh(AfterOthersReady(1, {0, 2}, "kill -KILL $$"))));
  EXPECT_EQ(run.result.exit_code, 137);
  EXPECT_EQ(run.result.failure, "rank 1 was killed by signal SIGKILL");
  EXPECT_THAT(run.err, HasSubstr("rank 1 was killed by signal SIGKILL"));
  EXPECT_LT(run.seconds, 30);
  ExpectAllGone({0, 2});
}

TEST_F(LauncherTest, SigtermFirstThenSigkillAfterTheGracePeriod) {
  // Rank 0 exits on SIGTERM; rank 1 ignores it and must be SIGKILLed; rank 2 fails.
  const std::string script = absl::StrCat(
      "case $RANK in 0) exec '", WaitForever(), "' '", dir_, "' trap-term;; 1) exec '",
      WaitForever(), "' '", dir_, "' ignore-term;; esac; ", AfterOthersReady(2, {0, 1}, "exit 1"));
  LaunchOptions options = Options(3, Sh(script));
  options.grace_period = absl::Seconds(1);
  Outcome run = Launch(options);
  EXPECT_EQ(run.result.exit_code, 1);
  EXPECT_TRUE(Exists(Path("term.0"))) << "rank 0 did not get SIGTERM";
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat("rank 1 (pid ", RecordedPids(1)[0],
                                              ") did not exit within 1s of SIGTERM; "
                                              "sending SIGKILL")));
  EXPECT_THAT(run.err, Not(HasSubstr("rank 0 (pid")));
  EXPECT_GE(run.seconds, 1.0);
  EXPECT_LT(run.seconds, 30);
  ExpectAllGone({0, 1});
}

TEST_F(LauncherTest, DescendantHoldingTheOutputPipeDoesNotHoldTheLauncher) {
  // The rank exits 0 while its child keeps the rank's stdout and stderr open.
  Outcome run = Launch(Options(1, Sh(absl::StrCat("sleep 100000 & echo $! > \"", dir_,
                                                  "/child\"; echo done; echo failing >&2"))));
  const pid_t child = ReadPid(Path("child"));
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_EQ(run.out, "[rank 0] done\n");
  EXPECT_EQ(run.err, "[rank 0] failing\n");
  EXPECT_LT(run.seconds, 30);
  // Descendants of a successful rank are left alone.
  EXPECT_TRUE(IsAlive(child));
  kill(child, SIGKILL);
}

TEST_F(LauncherTest, OutputLinesArePrefixedWithTheRank) {
  Outcome run = Launch(Options(2, Sh("echo \"out $RANK\"; echo \"err $RANK\" >&2; "
                                     "echo \"second $RANK\"; printf \"partial $RANK\"")));
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_THAT(LinesOf(run.out, "[rank 0] "),
              ElementsAre("[rank 0] out 0", "[rank 0] second 0", "[rank 0] partial 0"));
  EXPECT_THAT(LinesOf(run.out, "[rank 1] "),
              ElementsAre("[rank 1] out 1", "[rank 1] second 1", "[rank 1] partial 1"));
  EXPECT_EQ(Lines(run.out).size(), 6u);
  EXPECT_EQ(Lines(run.err).size(), 2u);
  EXPECT_THAT(LinesOf(run.err, "[rank 0] "), ElementsAre("[rank 0] err 0"));
  EXPECT_THAT(LinesOf(run.err, "[rank 1] "), ElementsAre("[rank 1] err 1"));
}

TEST_F(LauncherTest, LinesOfDifferentRanksNeverMix) {
  constexpr int kRanks = 4;
  constexpr int kLinesPerRank = 3000;
  const std::string padding(200, 'x');
  Outcome run = Launch(
      Options(kRanks, Sh(absl::Substitute("i=0; while [ $$i -lt $0 ]; do echo \"$$RANK $$i $1\"; "
                                          "i=$$((i+1)); done",
                                          kLinesPerRank, padding))));
  EXPECT_EQ(run.result.exit_code, 0);
  std::vector<int> next(kRanks, 0);
  for (const std::string& line : Lines(run.out)) {
    int rank = -1;
    int index = -1;
    const std::vector<std::string> parts = absl::StrSplit(line, ' ');
    ASSERT_EQ(parts.size(), 5u) << line;
    ASSERT_TRUE(absl::SimpleAtoi(parts[3], &index)) << line;
    ASSERT_TRUE(absl::SimpleAtoi(parts[2], &rank)) << line;
    ASSERT_TRUE(rank >= 0 && rank < kRanks) << line;
    ASSERT_EQ(parts[0] + " " + parts[1], absl::StrCat("[rank ", rank, "]")) << line;
    ASSERT_EQ(index, next[rank]) << line;
    ASSERT_EQ(parts[4], padding) << line;
    ++next[rank];
  }
  EXPECT_THAT(next, ::testing::Each(kLinesPerRank));
}

TEST_F(LauncherTest, EnvironmentOfNodeRank1Of2) {
  unsetenv("OMP_NUM_THREADS");
  LaunchOptions options = Options(3, Sh(absl::StrCat("env > \"", dir_, "/env.$LOCAL_RANK\"")));
  options.nnodes = 2;
  options.node_rank = 1;
  options.master_addr = "10.1.2.3";
  options.master_port = 29511;
  options.max_restarts = 2;
  Outcome run = Launch(options);
  setenv("OMP_NUM_THREADS", "1", 1);
  EXPECT_EQ(run.result.exit_code, 0);
  std::string run_id;
  for (int local = 0; local < 3; ++local) {
    std::map<std::string, std::string> vars;
    for (const std::string& line : Lines(ReadFile(Path(absl::StrCat("env.", local))))) {
      const std::vector<std::string> parts = absl::StrSplit(line, absl::MaxSplits('=', 1));
      if (parts.size() == 2) vars[parts[0]] = parts[1];
    }
    SCOPED_TRACE(absl::StrCat("local rank ", local));
    EXPECT_EQ(vars["RANK"], std::to_string(3 + local));
    EXPECT_EQ(vars["LOCAL_RANK"], std::to_string(local));
    EXPECT_EQ(vars["WORLD_SIZE"], "6");
    EXPECT_EQ(vars["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(vars["GROUP_RANK"], "1");
    EXPECT_EQ(vars["ROLE_RANK"], std::to_string(3 + local));
    EXPECT_EQ(vars["ROLE_WORLD_SIZE"], "6");
    EXPECT_EQ(vars["MASTER_ADDR"], "10.1.2.3");
    EXPECT_EQ(vars["MASTER_PORT"], "29511");
    EXPECT_EQ(vars["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(vars["TORCHELASTIC_MAX_RESTARTS"], "2");
    EXPECT_EQ(vars["OMP_NUM_THREADS"], std::to_string(ThreadsPerRank(UsableCpus(), 3)));
    EXPECT_FALSE(vars["TORCHELASTIC_RUN_ID"].empty());
    if (local == 0) run_id = vars["TORCHELASTIC_RUN_ID"];
    EXPECT_EQ(vars["TORCHELASTIC_RUN_ID"], run_id);
  }
  EXPECT_FALSE(Exists(Path("env.3"))) << "only the 3 local ranks are launched";
}

TEST_F(LauncherTest, OmpNumThreadsIsKeptWhenSet) {
  setenv("OMP_NUM_THREADS", "7", 1);
  Outcome run = Launch(Options(1, Sh("echo \"omp=$OMP_NUM_THREADS\"")));
  setenv("OMP_NUM_THREADS", "1", 1);
  EXPECT_EQ(run.out, "[rank 0] omp=7\n");
}

TEST_F(LauncherTest, RestartsTheGroupAfterAFailure) {
  // Attempt 0: rank 1 fails while rank 0 waits forever (so it must be stopped before the
  // restart). Attempt 1: both succeed.
  const std::string script = absl::StrCat(
      "echo x >> \"", dir_, "/attempts.$RANK\"; echo \"restart $TORCHELASTIC_RESTART_COUNT\"; ",
      "[ \"$TORCHELASTIC_RESTART_COUNT\" = 1 ] && exit 0; ", AfterOthersReady(1, {0}, "exit 4"));
  LaunchOptions options = Options(2, Sh(script));
  options.max_restarts = 1;
  Outcome run = Launch(options);
  EXPECT_EQ(run.result.exit_code, 0);
  EXPECT_EQ(run.result.attempts, 2);
  EXPECT_EQ(ReadFile(Path("attempts.0")), "x\nx\n");
  EXPECT_EQ(ReadFile(Path("attempts.1")), "x\nx\n");
  EXPECT_THAT(LinesOf(run.out, "[rank 1] "),
              ElementsAre("[rank 1] restart 0", "[rank 1] restart 1"));
  EXPECT_THAT(run.err, HasSubstr("rank 1 exited with exit code 4"));
  EXPECT_THAT(run.err, HasSubstr("restarting all 2 ranks (restart 1 of 1)"));
  ExpectAllGone({0});
}

TEST_F(LauncherTest, FailsAfterTheLastRestart) {
  LaunchOptions options = Options(
      2,
      Sh(absl::StrCat("echo x >> \"", dir_, "/attempts.$RANK\"; [ $RANK = 1 ] && exit 4; exit 0")));
  options.max_restarts = 2;
  Outcome run = Launch(options);
  EXPECT_EQ(run.result.exit_code, 4);
  EXPECT_EQ(run.result.attempts, 3);
  EXPECT_EQ(ReadFile(Path("attempts.1")), "x\nx\nx\n");
  EXPECT_THAT(run.err, HasSubstr("exiting with code 4: rank 1 exited with exit code 4 (after 2 "
                                 "restarts)"));
}

TEST_F(LauncherTest, RequestStopForwardsTheSignalAndExits128PlusIt) {
  Outcome run = LaunchAndStop(Options(2, {WaitForever(), dir_}), SIGINT);
  EXPECT_EQ(run.result.exit_code, 130);
  EXPECT_EQ(run.result.failure, "stopped by SIGINT");
  EXPECT_THAT(run.err, HasSubstr("got SIGINT; forwarding it to all ranks"));
  ExpectAllGone({0, 1});
}

// Ranks that save for 3 s on SIGTERM (longer than the 2 s grace period) and then exit 143;
// the stop is requested twice within a millisecond, as when a scheduler signals the launcher
// and its process group: one request, no SIGKILL, and the launcher waits for the saves.
TEST_F(LauncherTest, AForwardedStopWaitsForTheRanksAndADuplicateIsNotASecondRequest) {
  const std::string script = absl::StrCat(
      "trap 'sleep 3; echo saved > \"", dir_, "/saved.$RANK\"; exit 143' TERM; echo ready; ",
      "while :; do sleep 0.1; done");
  Outcome run = LaunchAndStop(Options(2, Sh(script)), SIGTERM, /*copies=*/2);
  EXPECT_EQ(run.result.exit_code, 143);
  EXPECT_THAT(run.err, Not(HasSubstr("SIGKILL now"))) << run.err;
  EXPECT_THAT(run.err, Not(HasSubstr("did not exit"))) << run.err;
  EXPECT_EQ(ReadFile(Path("saved.0")), "saved\n");
  EXPECT_EQ(ReadFile(Path("saved.1")), "saved\n");
}

// A rank that never exits after a forwarded SIGTERM (stopped, or stuck where its handler
// cannot end it) is SIGKILLed after --stop_timeout_s, and the launcher exits.
TEST_F(LauncherTest, AForwardedStopEndsInStopTimeout) {
  LaunchOptions options = Options(2, {WaitForever(), dir_, "ignore-term"});
  options.stop_timeout = absl::Seconds(2);
  options.grace_period = absl::Seconds(30);  // no rank exits first: the timeout applies
  Outcome run = LaunchAndStop(options, SIGTERM);
  EXPECT_EQ(run.result.exit_code, 143);
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat("rank 1 (pid ", RecordedPids(1)[0],
                                              ") did not exit within 2s of SIGTERM; "
                                              "sending SIGKILL")));
  EXPECT_GE(run.seconds, 2.0);
  EXPECT_LT(run.seconds, 20);
  ExpectAllGone({0, 1});
}

// With no stop timeout, a rank still running --grace_period_s after another rank exited is
// stuck (its peers finished the step and the save), and is SIGKILLed then.
TEST_F(LauncherTest, WithoutAStopTimeoutTheGracePeriodStartsAtTheFirstExit) {
  const std::string script = absl::StrCat(
      "case $RANK in 0) exec '", WaitForever(), "' '", dir_, "' trap-term;; 1) exec '",
      WaitForever(), "' '", dir_, "' ignore-term;; esac");
  LaunchOptions options = Options(2, Sh(script));
  options.stop_timeout = absl::ZeroDuration();
  options.grace_period = absl::Seconds(1);
  Outcome run = LaunchAndStop(options, SIGTERM);
  EXPECT_EQ(run.result.exit_code, 143);
  EXPECT_TRUE(Exists(Path("term.0"))) << "rank 0 did not get SIGTERM";
  EXPECT_THAT(run.err, HasSubstr(absl::StrCat(
                           "rank 1 (pid ", RecordedPids(1)[0],
                           ") did not exit within 1s of another rank's exit after SIGTERM "
                           "(--grace_period_s); sending SIGKILL")));
  EXPECT_LT(run.seconds, 20);
  ExpectAllGone({0, 1});
}

// ---------------------------------------------------------------------------------------
// The //tools:launch binary.

struct Process {
  pid_t pid = -1;
  int out_fd = -1;
  int err_fd = -1;
  std::string out;
  std::string err;
};

Process Start(const std::vector<std::string>& args) {
  Process process;
  int out[2];
  int err[2];
  EXPECT_EQ(pipe2(out, O_CLOEXEC), 0);
  EXPECT_EQ(pipe2(err, O_CLOEXEC), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
  std::vector<std::string> storage = {Runfile("tools/launch")};
  storage.insert(storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : storage) argv.push_back(arg.data());
  argv.push_back(nullptr);
  EXPECT_EQ(posix_spawn(&process.pid, argv[0], &actions, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  close(err[1]);
  process.out_fd = out[0];
  process.err_fd = err[0];
  return process;
}

// Reads both pipes until `done` holds or both are at EOF; false if kDeadline passed first.
bool ReadUntil(Process& process, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + kDeadline;
  while (!done() && (process.out_fd >= 0 || process.err_fd >= 0)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    pollfd fds[2] = {{process.out_fd, POLLIN, 0}, {process.err_fd, POLLIN, 0}};
    if (poll(fds, 2, 1000) <= 0) continue;
    int* fd_of[2] = {&process.out_fd, &process.err_fd};
    std::string* text_of[2] = {&process.out, &process.err};
    for (int i = 0; i < 2; ++i) {
      if (*fd_of[i] < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = read(*fd_of[i], buffer, sizeof(buffer));
      if (n > 0) {
        text_of[i]->append(buffer, static_cast<size_t>(n));
      } else {
        close(*fd_of[i]);
        *fd_of[i] = -1;
      }
    }
  }
  return done() || (process.out_fd < 0 && process.err_fd < 0);
}

// Reads to EOF and reaps; the exit code, 128+signal, or -1 after kDeadline (then killed).
int Finish(Process& process) {
  if (!ReadUntil(process, [] { return false; })) {
    kill(process.pid, SIGKILL);
    waitpid(process.pid, nullptr, 0);
    return -1;
  }
  int status = 0;
  waitpid(process.pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int RunBinary(const std::vector<std::string>& args, std::string* out, std::string* err) {
  Process process = Start(args);
  const int code = Finish(process);
  *out = process.out;
  *err = process.err;
  return code;
}

TEST(LaunchBinaryTest, RunsRanksWithPrefixedOutput) {
  std::string out;
  std::string err;
  EXPECT_EQ(RunBinary({"--nproc-per-node=2", "--standalone", "/bin/sh", "-c",
                       "echo \"hi $RANK/$WORLD_SIZE port=$MASTER_PORT\"; echo oops >&2"},
                      &out, &err),
            0)
      << err;
  EXPECT_THAT(out, HasSubstr("[rank 0] hi 0/2 port="));
  EXPECT_THAT(out, HasSubstr("[rank 1] hi 1/2 port="));
  EXPECT_THAT(LinesOf(err, "[rank 1] "), ElementsAre("[rank 1] oops"));
}

TEST(LaunchBinaryTest, MasterPortZeroYieldsAUsablePort) {
  std::string out;
  std::string err;
  ASSERT_EQ(RunBinary({"--master_port=0", "/bin/sh", "-c", "echo $MASTER_PORT"}, &out, &err), 0)
      << err;
  int port = 0;
  ASSERT_TRUE(
      absl::SimpleAtoi(absl::StripPrefix(absl::StripAsciiWhitespace(out), "[rank 0] "), &port))
      << out;
  EXPECT_GT(port, 0);
  EXPECT_TRUE(CanListenOn(port)) << port;
}

TEST(LaunchBinaryTest, BadInputExitsWith2AndSaysWhy) {
  Listener listener;
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "missing PROGRAM"},
      {{"--nproc_per_node=2"}, "missing PROGRAM"},
      {{"--nproc_per_node=0", "/bin/true"}, "--nproc_per_node=0 is not a process count"},
      {{"--nproc-per-node=abc", "/bin/true"}, "--nproc_per_node=abc is not valid"},
      {{"--nnodes=2", "--node_rank=2", "--master_port=29400", "/bin/true"},
       "--node_rank=2 is outside [0, --nnodes=2)"},
      {{"--master_port=70000", "/bin/true"}, "--master_port=70000 is not a TCP port"},
      {{absl::StrCat("--master_port=", listener.port()), "/bin/true"},
       absl::StrCat("--master_port=", listener.port(), " is already in use on 127.0.0.1")},
      {{absl::StrCat("--master_port=", listener.port()), "/bin/true"}, "--master_port=0"},
      {{"--rdzv_backend=c10d", "/bin/true"}, "unknown flag --rdzv_backend=c10d"},
      {{"--master_port=0", "no-such-program-for-launcher-test"},
       "no-such-program-for-launcher-test was not found"},
  };
  for (const auto& [args, message] : cases) {
    std::string out;
    std::string err;
    EXPECT_EQ(RunBinary(args, &out, &err), 2) << absl::StrJoin(args, " ") << "\n" << err;
    EXPECT_THAT(err, HasSubstr(message)) << absl::StrJoin(args, " ");
  }
}

class LaunchBinarySignalTest : public ::testing::TestWithParam<int> {};

TEST_P(LaunchBinarySignalTest, ForwardsTheSignalAndExitsLikeAShell) {
  const int signal = GetParam();
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/binary_signal_", signal);
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  Process process =
      Start({"--nproc_per_node=2", "--master_port=0", "--grace_period_s=2", WaitForever(), dir});
  ASSERT_TRUE(ReadUntil(process, [&] {
    return absl::StrContains(process.out, "[rank 0] ready") &&
           absl::StrContains(process.out, "[rank 1] ready");
  })) << process.err;
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(process.pid, signal), 0);
  EXPECT_EQ(Finish(process), 128 + signal) << process.err;
  EXPECT_LT(SecondsSince(start), 30);
  EXPECT_THAT(process.err, HasSubstr(absl::StrCat("got SIG", sigabbrev_np(signal))));
  for (int rank = 0; rank < 2; ++rank) {
    for (const char* kind : {"pid.", "child."}) {
      const pid_t pid = ReadPid(absl::StrCat(dir, "/", kind, rank));
      EXPECT_FALSE(IsAlive(pid)) << kind << rank << " " << pid;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(IntTermHup, LaunchBinarySignalTest,
                         ::testing::Values(SIGINT, SIGTERM, SIGHUP));

TEST(LaunchBinaryTest, RankKilledBySignalGives137) {
  std::string out;
  std::string err;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RunBinary({"--nproc_per_node=2", "--master_port=0", "--grace_period_s=2", "/bin/sh",
                       "-c", "[ $RANK = 1 ] && kill -KILL $$; exec sleep 100000"},
                      &out, &err),
            137);
  EXPECT_LT(SecondsSince(start), 30);
  EXPECT_THAT(err, HasSubstr("rank 1 was killed by signal SIGKILL"));
}

}  // namespace
}  // namespace cpptrain
