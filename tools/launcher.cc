#include "tools/launcher.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "base/status.h"

extern char** environ;

namespace cpptrain {
namespace {

// How often rank exits are polled for while the launcher waits for output. Exits are found
// with waitpid(WNOHANG) rather than SIGCHLD so the library installs no signal handlers.
constexpr int kTickMs = 50;
// A line longer than this is written in pieces, so a rank that never writes a newline cannot
// grow the launcher's memory without bound.
constexpr size_t kMaxLine = 64 << 10;
// How long SIGKILLed process groups may take to disappear (killed members are gone once
// reaped: by the launcher when it is their subreaper, by init otherwise).
constexpr std::chrono::milliseconds kGroupExitLimit(5000);
// Stop requests closer than this to the first are the same signal delivered twice.
constexpr std::chrono::milliseconds kRepeatWindow(1000);

constexpr LauncherFlag kFlags[] = {
    {"nproc_per_node", true}, {"nnodes", true},      {"node_rank", true},
    {"master_addr", true},    {"master_port", true}, {"max_restarts", true},
    {"grace_period_s", true}, {"stop_timeout_s", true}, {"standalone", false},
    {"config_file", true},
};

const LauncherFlag* FindFlag(absl::string_view name) {
  for (const LauncherFlag& flag : kFlags) {
    if (name == flag.name) return &flag;
  }
  return nullptr;
}

std::string FlagList() {
  std::vector<std::string> names;
  for (const LauncherFlag& flag : kFlags) names.push_back(absl::StrCat("--", flag.name));
  return absl::StrJoin(names, ", ");
}

std::string SignalName(int signal) {
  const char* abbrev = sigabbrev_np(signal);
  return abbrev != nullptr ? absl::StrCat("SIG", abbrev) : absl::StrCat("signal ", signal);
}

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with exit code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    return absl::StrCat("was killed by signal ", SignalName(WTERMSIG(status)));
  }
  return absl::StrCat("ended with wait status ", status);
}

bool Succeeded(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

// What a shell would report for a child that ended with `status`.
int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Writes everything unless the reader is gone (EPIPE): the launcher never dies of its output.
void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    const ssize_t n = write(fd, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd writable = {fd, POLLOUT, 0};
      poll(&writable, 1, -1);
    } else {
      return;
    }
  }
}

struct BindResult {
  int port = -1;  // the bound port, -1 when no address could be bound
  int error = 0;  // errno of the last failed attempt
};

// Binds (and closes) a TCP socket on each address `addr` resolves to until one works.
absl::StatusOr<BindResult> TryBind(const std::string& addr, int port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* results = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(addr.c_str(), service.c_str(), &hints, &results);
  if (rc != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_addr=", addr, " does not resolve: ", gai_strerror(rc)));
  }
  BindResult result;
  for (addrinfo* ai = results; ai != nullptr && result.port < 0; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      result.error = errno;
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_storage bound = {};
    socklen_t length = sizeof(bound);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
        getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
      result.error = errno;
    } else if (bound.ss_family == AF_INET6) {
      result.port = ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
    } else {
      result.port = ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    }
    close(fd);
  }
  freeaddrinfo(results);
  return result;
}

// The executable PROGRAM names, searched on PATH like execvp when it has no slash.
absl::StatusOr<std::string> ResolveProgram(const std::string& program) {
  auto executable = [](const std::string& path) {
    struct stat info;
    return stat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
           access(path.c_str(), X_OK) == 0;
  };
  if (absl::StrContains(program, '/')) {
    if (executable(program)) return program;
    return absl::InvalidArgumentError(absl::StrCat(
        "PROGRAM ", program, " is not an executable file: check the path and its x bit"));
  }
  const char* path_env = getenv("PATH");
  const std::string path = path_env != nullptr ? path_env : "/usr/bin:/bin";
  for (absl::string_view dir : absl::StrSplit(path, ':')) {
    const std::string candidate = absl::StrCat(dir.empty() ? "." : dir, "/", program);
    if (executable(candidate)) return candidate;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("PROGRAM ", program, " was not found on PATH=", path, ": pass a path to it"));
}

std::string MakeRunId() {
  std::random_device random;
  const uint64_t id = (static_cast<uint64_t>(random()) << 32) | random();
  return absl::StrFormat("%016x", id);
}

std::vector<std::string> CurrentEnvironment() {
  std::vector<std::string> env;
  for (char** entry = environ; *entry != nullptr; ++entry) env.emplace_back(*entry);
  return env;
}

// Makes `fd` the descriptor `target` of a forked child, without the close-on-exec flag.
// Async-signal-safe.
void MoveTo(int fd, int target) {
  if (fd == target) {
    fcntl(fd, F_SETFD, 0);
  } else {
    dup2(fd, target);
  }
}

}  // namespace

absl::Span<const LauncherFlag> LauncherFlags() { return kFlags; }

absl::StatusOr<SplitArgs> SplitLauncherArgs(const std::vector<std::string>& args) {
  SplitArgs split;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM
    if (arg == "-h" || arg == "--help" || arg == "--helpfull" || arg == "-help") {
      split.help = true;
      continue;
    }
    absl::string_view body = arg;
    body.remove_prefix(absl::StartsWith(body, "--") ? 2 : 1);
    const size_t equals = body.find('=');
    const bool has_value = equals != absl::string_view::npos;
    std::string name = absl::StrReplaceAll(body.substr(0, equals), {{"-", "_"}});
    std::string value = has_value ? std::string(body.substr(equals + 1)) : "";
    const LauncherFlag* flag = FindFlag(name);
    if (flag == nullptr && !has_value && absl::StartsWith(name, "no")) {
      flag = FindFlag(absl::string_view(name).substr(2));
      if (flag != nullptr && !flag->takes_value) {
        split.flags.emplace_back(flag->name, "false");
        continue;
      }
      flag = nullptr;
    }
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag ", arg, " before PROGRAM: the launcher's flags are ",
                       FlagList(), "; flags meant for PROGRAM go after it"));
    }
    if (flag->takes_value && !has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag->name, " needs a value: --", flag->name, "=VALUE"));
      }
      value = args[++i];
    } else if (!flag->takes_value && !has_value) {
      value = "true";
    }
    split.flags.emplace_back(flag->name, std::move(value));
  }
  split.command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  return split;
}

absl::StatusOr<int> PickFreePort(const std::string& addr) {
  CT_ASSIGN_OR_RETURN(BindResult bound, TryBind(addr, 0));
  if (bound.port < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot bind a socket on --master_addr=", addr, " to pick a free port (",
        strerror(bound.error), "): a single-node run needs an address of this machine"));
  }
  return bound.port;
}

absl::Status CheckPortFree(const std::string& addr, int port) {
  CT_ASSIGN_OR_RETURN(BindResult bound, TryBind(addr, port));
  if (bound.port >= 0) return absl::OkStatus();
  if (bound.error == EADDRINUSE) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--master_port=", port, " is already in use on ", addr,
        ": stop whatever holds it, pick another port, or pass --master_port=0 to pick a free "
        "one"));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "cannot bind --master_addr=", addr, " --master_port=", port, " (", strerror(bound.error),
      "): a single-node run needs an address of this machine and a free port"));
}

absl::StatusOr<LaunchOptions> ResolveLaunchOptions(LaunchOptions options) {
  if (options.standalone) {
    options.nnodes = 1;
    options.node_rank = 0;
    options.master_addr = "127.0.0.1";
    options.master_port = 0;
  }
  if (options.command.empty()) {
    return absl::InvalidArgumentError(
        "missing PROGRAM: usage is launch [flags] PROGRAM [ARGS...], e.g. "
        "launch --nproc_per_node=2 ./train --config=job.textproto");
  }
  if (options.nproc_per_node < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--nproc_per_node=", options.nproc_per_node,
                                                   " is not a process count: pass 1 or more"));
  }
  if (options.nnodes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--nnodes=", options.nnodes, " is not a node count: pass 1 or more"));
  }
  if (options.node_rank < 0 || options.node_rank >= options.nnodes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--node_rank=", options.node_rank, " is outside [0, --nnodes=", options.nnodes,
                     "): pass a node rank from 0 to ", options.nnodes - 1));
  }
  if (options.master_port < 0 || options.master_port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--master_port=", options.master_port,
                     " is not a TCP port: pass 1..65535, or 0 to pick a free one"));
  }
  if (options.max_restarts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_restarts=", options.max_restarts, " is negative: pass 0 or more"));
  }
  if (options.grace_period < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--grace_period_s=", absl::ToDoubleSeconds(options.grace_period),
                     " is negative: pass the seconds between SIGTERM and SIGKILL, 0 or more"));
  }
  if (options.stop_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stop_timeout_s=", absl::ToDoubleSeconds(options.stop_timeout),
                     " is negative: pass the seconds ranks may take to save and exit after a "
                     "forwarded SIGTERM/SIGINT, or 0 for no limit"));
  }
  if (options.master_addr.empty()) {
    return absl::InvalidArgumentError("--master_addr is empty: pass a host name or address");
  }
  if (options.run_id.empty()) options.run_id = MakeRunId();
  if (options.nnodes > 1) {
    if (options.master_port == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--master_port=0 picks a port on this node only, so it needs --nnodes=1 (got ",
          options.nnodes, "): pass the port that every node uses"));
    }
    return options;
  }
  if (options.master_port == 0) {
    CT_ASSIGN_OR_RETURN(options.master_port, PickFreePort(options.master_addr));
  } else {
    CT_RETURN_IF_ERROR(CheckPortFree(options.master_addr, options.master_port));
  }
  return options;
}

std::vector<std::string> RankEnvironment(const LaunchOptions& options, int local_rank,
                                         int restart_count, const std::vector<std::string>& base) {
  const int rank = options.node_rank * options.nproc_per_node + local_rank;
  const int world_size = options.nnodes * options.nproc_per_node;
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(options.nnodes)},
      {"ROLE_NAME", "default"},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world_size)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(options.max_restarts)},
      {"TORCHELASTIC_RUN_ID", options.run_id},
      // The launcher prefixes every line with the rank; base/logging.cc then leaves it out.
      {"CPPTRAIN_OUTPUT_PREFIXED", "1"},
  };
  std::vector<std::string> env;
  bool has_omp = false;
  for (const std::string& entry : base) {
    const absl::string_view name = absl::string_view(entry).substr(0, entry.find('='));
    if (name == "OMP_NUM_THREADS") has_omp = true;
    const bool replaced =
        std::any_of(vars.begin(), vars.end(), [&](const auto& var) { return var.first == name; });
    if (!replaced) env.push_back(entry);
  }
  for (const auto& [name, value] : vars) env.push_back(absl::StrCat(name, "=", value));
  if (!has_omp) {
    env.push_back(
        absl::StrCat("OMP_NUM_THREADS=", ThreadsPerRank(UsableCpus(), options.nproc_per_node)));
  }
  return env;
}

int CpusOfQuota(absl::string_view quota, absl::string_view period) {
  int64_t q = 0, p = 0;
  if (!absl::SimpleAtoi(quota, &q) || !absl::SimpleAtoi(period, &p) || q <= 0 || p <= 0) {
    return 0;  // "max" (v2), -1 (v1), or not a number
  }
  return static_cast<int>(std::max<int64_t>(1, (q + p - 1) / p));
}

namespace {

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// This process's cgroup CPU quota in CPUs (0: none found): cgroup v2's cpu.max in the process's
// own cgroup (a container sees its own as /), else v1's cfs_quota_us / cfs_period_us.
int CgroupCpuQuota() {
  std::string group = "/";
  std::ifstream cgroups("/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);) {
    if (absl::StartsWith(line, "0::")) group = line.substr(3);
  }
  for (const std::string& dir :
       {absl::StrCat("/sys/fs/cgroup", group), std::string("/sys/fs/cgroup")}) {
    const std::vector<std::string> fields =
        absl::StrSplit(FirstLine(absl::StrCat(dir, "/cpu.max")), ' ', absl::SkipEmpty());
    if (fields.size() == 2) return CpusOfQuota(fields[0], fields[1]);
  }
  return CpusOfQuota(FirstLine("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
                     FirstLine("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
}

}  // namespace

int UsableCpus() {
  // Sized for the machine (a fixed cpu_set_t stops at 1024 CPUs).
  const long configured = std::max(1L, sysconf(_SC_NPROCESSORS_CONF));
  cpu_set_t* set = CPU_ALLOC(configured);
  const size_t bytes = CPU_ALLOC_SIZE(configured);
  CPU_ZERO_S(bytes, set);
  const int usable = sched_getaffinity(0, bytes, set) == 0 ? CPU_COUNT_S(bytes, set) : 1;
  CPU_FREE(set);
  const int quota = CgroupCpuQuota();
  return std::max(1, quota > 0 ? std::min(usable, quota) : usable);
}

int ThreadsPerRank(int usable_cpus, int nproc_per_node) {
  return std::max(1, usable_cpus / std::max(1, nproc_per_node));
}

absl::StatusOr<std::unique_ptr<Launcher>> Launcher::Create(LaunchOptions options) {
  if (options.command.empty()) {
    return absl::InvalidArgumentError("missing PROGRAM: pass the command to launch");
  }
  CT_ASSIGN_OR_RETURN(std::string program_path, ResolveProgram(options.command[0]));
  int stop_pipe[2];
  // Non-blocking on both ends: a signal handler must never block on a full pipe.
  if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    return absl::ErrnoToStatus(errno, "launcher: pipe2 for stop requests");
  }
  return std::unique_ptr<Launcher>(
      new Launcher(std::move(options), std::move(program_path), stop_pipe[0], stop_pipe[1]));
}

Launcher::Launcher(LaunchOptions options, std::string program_path, int stop_read_fd,
                   int stop_write_fd)
    : options_(std::move(options)),
      program_path_(std::move(program_path)),
      stop_read_fd_(stop_read_fd),
      stop_write_fd_(stop_write_fd) {}

Launcher::~Launcher() {
  close(stop_read_fd_);
  close(stop_write_fd_);
}

void Launcher::RequestStop(int signal) {
  const int saved_errno = errno;
  const unsigned char byte = static_cast<unsigned char>(signal);
  if (write(stop_write_fd_, &byte, 1) < 0) {
    // Full pipe: earlier requests are still unread, and they stop the ranks as well.
  }
  errno = saved_errno;
}

absl::StatusOr<LaunchResult> Launcher::Run() {
  LaunchResult result;
  for (int restart = 0;; ++restart) {
    result.attempts = restart + 1;
    CT_ASSIGN_OR_RETURN(Attempt attempt, RunAttempt(restart));
    if (stop_signal_ != 0) {
      result.exit_code = 128 + stop_signal_;
      result.failure = absl::StrCat("stopped by ", SignalName(stop_signal_));
      Message(absl::StrCat("exiting with code ", result.exit_code, ": ", result.failure));
      return result;
    }
    if (attempt.ending == Ending::kSuccess) {
      result.exit_code = 0;
      result.failure.clear();
      return result;
    }
    result.exit_code = attempt.exit_code;
    result.failure = attempt.failure;
    if (restart >= options_.max_restarts) {
      Message(absl::StrCat(
          "exiting with code ", result.exit_code, ": ", result.failure,
          options_.max_restarts > 0 ? absl::StrCat(" (after ", restart, " restarts)") : ""));
      return result;
    }
    Message(absl::StrCat("restarting all ", options_.nproc_per_node, " ranks (restart ",
                         restart + 1, " of ", options_.max_restarts, ")"));
  }
}

absl::StatusOr<Launcher::Attempt> Launcher::RunAttempt(int restart_count) {
  const absl::Status started = StartRanks(restart_count);
  if (!started.ok()) {
    StopRanks(SIGKILL, absl::ZeroDuration());
    return started;
  }
  while (true) {
    Pump(kTickMs);
    if (stop_signal_ != 0) {
      const absl::Duration timeout = options_.stop_timeout > absl::ZeroDuration()
                                         ? options_.stop_timeout
                                         : absl::InfiniteDuration();
      Message(absl::StrCat("got ", SignalName(stop_signal_),
                           "; forwarding it to all ranks, which save and exit; SIGKILL ",
                           timeout == absl::InfiniteDuration()
                               ? std::string("on a second signal")
                               : absl::StrCat("after ", absl::FormatDuration(timeout))));
      StopRanks(stop_signal_, timeout);
      return Attempt{Ending::kStopped, "", 0};
    }
    for (int index : CollectExits()) {
      Rank& rank = ranks_[index];
      if (Succeeded(rank.wait_status)) continue;
      Drain(rank);  // its last words come before the launcher's message
      Attempt attempt{Ending::kFailure,
                      absl::StrCat("rank ", rank.rank, " ", DescribeWaitStatus(rank.wait_status)),
                      ExitCodeOf(rank.wait_status)};
      Message(absl::StrCat(attempt.failure, " (local rank ", rank.local_rank, ", pid ", rank.pid,
                           "); stopping the other ranks: SIGTERM, then SIGKILL after ",
                           absl::FormatDuration(options_.grace_period)));
      StopRanks(SIGTERM, options_.grace_period);
      return attempt;
    }
    if (AllExited()) {
      ReapAll();  // descendants of ranks that succeeded are left alone
      for (Rank& rank : ranks_) Drain(rank);
      CloseStreams();
      return Attempt{};
    }
  }
}

absl::Status Launcher::StartRanks(int restart_count) {
  ranks_.clear();
  ranks_.resize(static_cast<size_t>(options_.nproc_per_node));
  const std::vector<std::string> base_env = CurrentEnvironment();
  for (int i = 0; i < options_.nproc_per_node; ++i) {
    Rank& rank = ranks_[static_cast<size_t>(i)];
    rank.local_rank = i;
    rank.rank = options_.node_rank * options_.nproc_per_node + i;
    rank.out.sink_fd = options_.stdout_fd;
    rank.err.sink_fd = options_.stderr_fd;
    CT_RETURN_IF_ERROR(SpawnRank(rank, RankEnvironment(options_, i, restart_count, base_env)));
  }
  return absl::OkStatus();
}

absl::Status Launcher::SpawnRank(Rank& rank, const std::vector<std::string>& env) {
  int out[2];
  int err[2];
  if (pipe2(out, O_CLOEXEC) != 0) return absl::ErrnoToStatus(errno, "launcher: pipe2");
  if (pipe2(err, O_CLOEXEC) != 0) {
    const int error = errno;
    close(out[0]);
    close(out[1]);
    return absl::ErrnoToStatus(error, "launcher: pipe2");
  }
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (the test binary has threads).
  std::vector<char*> argv;
  for (const std::string& arg : options_.command) argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : env) envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  const std::string exec_failed =
      absl::StrCat("launch: cannot execute ", program_path_, ": errno ");
  const pid_t parent = getpid();

  // Blocked across fork so no handler of the launcher runs in the child before exec.
  sigset_t all;
  sigset_t previous;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &previous);
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // no orphans if the launcher is SIGKILLed
    if (getppid() != parent) _exit(1);
    MoveTo(out[1], STDOUT_FILENO);
    MoveTo(err[1], STDERR_FILENO);
    struct sigaction action = {};
    for (int signal = 1; signal < NSIG; ++signal) {
      struct sigaction current;
      if (sigaction(signal, nullptr, &current) != 0) continue;
      if (current.sa_handler != SIG_IGN || signal == SIGPIPE) {
        action.sa_handler = SIG_DFL;
        sigaction(signal, &action, nullptr);
      }
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(program_path_.c_str(), argv.data(), envp.data());
    const int error = errno;
    if (write(STDERR_FILENO, exec_failed.data(), exec_failed.size()) > 0) {
      const char* name = strerrorname_np(error);
      if (name != nullptr && write(STDERR_FILENO, name, strlen(name)) > 0) {
      }
      if (write(STDERR_FILENO, "\n", 1) > 0) {
      }
    }
    _exit(127);
  }
  const int fork_error = errno;
  if (pid > 0) setpgid(pid, pid);  // also here, so kill(-pid) works as soon as fork returns
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  close(out[1]);
  close(err[1]);
  if (pid < 0) {
    close(out[0]);
    close(err[0]);
    return absl::ErrnoToStatus(fork_error, absl::StrCat("launcher: fork for rank ", rank.rank));
  }
  fcntl(out[0], F_SETFL, O_NONBLOCK);
  fcntl(err[0], F_SETFL, O_NONBLOCK);
  rank.pid = pid;
  rank.out.fd = out[0];
  rank.err.fd = err[0];
  return absl::OkStatus();
}

// One signal often arrives twice: a scheduler signals every process of the job, or
// `kill -TERM -PGID` the whole group, and the launcher forwards it too. Only a request at least
// kRepeatWindow after the first counts as the second one that sends SIGKILL.
void Launcher::CountStopRequest(int signal) {
  const auto now = std::chrono::steady_clock::now();
  if (stop_signal_ == 0) {
    stop_signal_ = signal;
    first_stop_ = now;
    ++stop_requests_;
  } else if (now - first_stop_ >= kRepeatWindow) {
    ++stop_requests_;
  }
}

void Launcher::Pump(int timeout_ms) {
  std::vector<pollfd> fds = {{stop_read_fd_, POLLIN, 0}};
  std::vector<std::pair<Rank*, Stream*>> owners = {{nullptr, nullptr}};
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (stream->fd < 0) continue;
      fds.push_back({stream->fd, POLLIN, 0});
      owners.emplace_back(&rank, stream);
    }
  }
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  if (fds[0].revents & POLLIN) {
    unsigned char signals[64];
    ssize_t n;
    while ((n = read(stop_read_fd_, signals, sizeof(signals))) > 0) {
      for (ssize_t i = 0; i < n; ++i) CountStopRequest(signals[i]);
    }
  }
  for (size_t i = 1; i < fds.size(); ++i) {
    if (fds[i].revents & (POLLIN | POLLHUP | POLLERR))
      ReadOnce(*owners[i].first, *owners[i].second);
  }
}

std::vector<int> Launcher::CollectExits() {
  std::vector<int> exited;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Rank& rank = ranks_[i];
    if (rank.pid <= 0 || rank.exited) continue;
    siginfo_t info = {};
    // WNOWAIT leaves the rank a zombie, so its pid (the group id) cannot be reused by an
    // unrelated process group before this attempt is over and the launcher stops signalling.
    const int rc = waitid(P_PID, static_cast<id_t>(rank.pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (rc == 0 && info.si_pid == rank.pid) {
      rank.exited = true;
      rank.wait_status = info.si_code == CLD_EXITED ? W_EXITCODE(info.si_status, 0)
                                                    : W_EXITCODE(0, info.si_status);
      exited.push_back(static_cast<int>(i));
    } else if (rc < 0 && errno == ECHILD) {
      // Reaped behind the launcher's back (SIGCHLD ignored by the embedding program): the
      // exit code is lost, so count it as a failure.
      rank.exited = true;
      rank.reaped = true;
      rank.wait_status = W_EXITCODE(1, 0);
      exited.push_back(static_cast<int>(i));
    }
  }
  return exited;
}

void Launcher::ReapAll() {
  for (Rank& rank : ranks_) {
    if (rank.pid <= 0 || rank.reaped) continue;
    int status = 0;
    pid_t pid;
    do {
      pid = waitpid(rank.pid, &status, 0);
    } while (pid < 0 && errno == EINTR);
    if (!rank.exited) rank.wait_status = pid == rank.pid ? status : W_EXITCODE(1, 0);
    rank.exited = true;
    rank.reaped = true;
  }
}

bool Launcher::AllExited() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const Rank& rank) { return rank.pid <= 0 || rank.exited; });
}

void Launcher::StopRanks(int signal, absl::Duration timeout) {
  for (const Rank& rank : ranks_) {
    if (rank.pid > 0) kill(-rank.pid, signal);  // exited ranks too: their descendants
  }
  const int requests_before = stop_requests_;
  absl::Time deadline = absl::Now() + timeout;  // the infinite future for an infinite timeout
  // What the ranks still running at the end did not exit within.
  std::string limit = absl::StrCat(absl::FormatDuration(timeout), " of ", SignalName(signal));
  bool one_exited = false;
  CollectExits();
  while (!AllExited() && signal != SIGKILL) {
    if (!one_exited && std::any_of(ranks_.begin(), ranks_.end(),
                                   [](const Rank& rank) { return rank.exited; })) {
      one_exited = true;
      const absl::Time after_exit = absl::Now() + options_.grace_period;
      if (timeout > options_.grace_period && after_exit < deadline) {
        deadline = after_exit;
        limit = absl::StrCat(absl::FormatDuration(options_.grace_period),
                             " of another rank's exit after ", SignalName(signal),
                             " (--grace_period_s)");
      }
    }
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left <= 0) break;
    if (stop_requests_ > requests_before) {
      Message("stop requested again; sending SIGKILL now");
      limit = "the second stop request";
      break;
    }
    Pump(static_cast<int>(std::min<int64_t>(kTickMs, left)));
    CollectExits();
  }
  for (const Rank& rank : ranks_) {
    if (rank.pid > 0 && !rank.exited && signal != SIGKILL) {
      Message(absl::StrCat("rank ", rank.rank, " (pid ", rank.pid, ") did not exit within ",
                           limit, "; sending SIGKILL"));
    }
  }
  // The whole groups, so descendants that outlive their rank's process go too.
  for (const Rank& rank : ranks_) {
    if (rank.pid > 0) kill(-rank.pid, SIGKILL);
  }
  ReapAll();
  WaitForEmptyGroups();
  for (Rank& rank : ranks_) Drain(rank);
  CloseStreams();
}

void Launcher::WaitForEmptyGroups() {
  const auto deadline = std::chrono::steady_clock::now() + kGroupExitLimit;
  for (const Rank& rank : ranks_) {
    if (rank.pid <= 0) continue;
    while (kill(-rank.pid, 0) == 0) {
      siginfo_t info = {};
      if (waitid(P_PGID, static_cast<id_t>(rank.pid), &info, WEXITED | WNOHANG) == 0 &&
          info.si_pid != 0) {
        continue;  // reaped an adopted member
      }
      if (std::chrono::steady_clock::now() > deadline) {
        Message(absl::StrCat("processes of rank ", rank.rank, "'s process group ", rank.pid,
                             " are still there ", kGroupExitLimit.count(),
                             "ms after SIGKILL; giving up on them"));
        return;
      }
      poll(nullptr, 0, 5);
    }
  }
}

ssize_t Launcher::ReadOnce(Rank& rank, Stream& stream) {
  char buffer[64 << 10];
  const ssize_t n = read(stream.fd, buffer, sizeof(buffer));
  if (n > 0) {
    stream.pending.append(buffer, static_cast<size_t>(n));
    Emit(rank, stream, /*flush_partial=*/false);
    return n;
  }
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return -1;
  Emit(rank, stream, /*flush_partial=*/true);
  close(stream.fd);
  stream.fd = -1;
  return 0;
}

void Launcher::Drain(Rank& rank) {
  // What an exited rank wrote fits in its pipe (1 MiB at most on Linux); the bound keeps a
  // descendant that still writes from holding the launcher here.
  constexpr int kMaxReads = 16;
  for (Stream* stream : {&rank.out, &rank.err}) {
    for (int i = 0; i < kMaxReads && stream->fd >= 0 && ReadOnce(rank, *stream) > 0; ++i) {
    }
  }
}

void Launcher::CloseStreams() {
  for (Rank& rank : ranks_) {
    for (Stream* stream : {&rank.out, &rank.err}) {
      if (stream->fd < 0) continue;
      Emit(rank, *stream, /*flush_partial=*/true);
      close(stream->fd);
      stream->fd = -1;
    }
  }
}

void Launcher::Emit(Rank& rank, Stream& stream, bool flush_partial) {
  const std::string prefix = absl::StrCat("[rank ", rank.rank, "] ");
  absl::string_view rest = stream.pending;
  std::string lines;
  while (!rest.empty()) {
    size_t end = rest.find('\n');
    if (end == absl::string_view::npos) {
      if (rest.size() < kMaxLine && !flush_partial) break;
      end = std::min(rest.size(), kMaxLine);
      absl::StrAppend(&lines, prefix, rest.substr(0, end), "\n");
      rest.remove_prefix(end);
      continue;
    }
    absl::StrAppend(&lines, prefix, rest.substr(0, end + 1));
    rest.remove_prefix(end + 1);
  }
  stream.pending = std::string(rest);
  WriteAll(stream.sink_fd, lines);  // whole lines in one write: ranks never mix mid-line
}

void Launcher::Message(const std::string& text) {
  WriteAll(options_.stderr_fd, absl::StrCat("launch: ", text, "\n"));
}

}  // namespace cpptrain
