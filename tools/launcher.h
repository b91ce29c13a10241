// The process launcher behind //tools:launch (torchrun's flags and environment, no Python):
// starts PROGRAM once per local rank in its own process group, prefixes every line the ranks
// write with "[rank N] ", and when one rank fails (or the launcher is asked to stop) sends
// SIGTERM to every rank, waits a grace period, then SIGKILLs what is left. With max_restarts
// the whole group is started again after a failure.
//
//   CT_ASSIGN_OR_RETURN(LaunchOptions options, ResolveLaunchOptions(std::move(requested)));
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<Launcher> launcher, Launcher::Create(options));
//   CT_ASSIGN_OR_RETURN(LaunchResult result, launcher->Run());   // blocks until done
//   return result.exit_code;   // 0, the failed rank's exit code, 128+signal
#ifndef CPPTRAIN_TOOLS_LAUNCHER_H_
#define CPPTRAIN_TOOLS_LAUNCHER_H_

#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace cpptrain {

// The flags of //tools:launch (same names and defaults as torchrun's), plus where output goes.
struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  // 0 picks a free port (single-node runs only).
  int master_port = 29500;
  // Restarts of the whole group after a failure.
  int max_restarts = 0;
  // From SIGTERM to SIGKILL when the other ranks are stopped after one failed.
  absl::Duration grace_period = absl::Seconds(10);
  // How long ranks may take to exit after a SIGTERM/SIGINT the launcher got and forwarded
  // (they finish a step and save a checkpoint, and end themselves after their own
  // CPPTRAIN_STOP_GRACE_S, 60 s by default); SIGKILL after it. Zero: no limit. Either way a
  // second signal sends SIGKILL at once, and once one rank has exited the others get at most
  // grace_period more.
  absl::Duration stop_timeout = absl::Seconds(90);
  // Single node on 127.0.0.1 with a free port.
  bool standalone = false;
  // TORCHELASTIC_RUN_ID; empty: ResolveLaunchOptions makes one.
  std::string run_id;
  // PROGRAM and its arguments; PROGRAM is searched on PATH when it has no slash.
  std::vector<std::string> command;
  // Where the prefixed lines of the ranks and the launcher's own messages go. The launcher
  // writes to them and never closes them.
  int stdout_fd = STDOUT_FILENO;
  int stderr_fd = STDERR_FILENO;
};

// One of the launcher's own flags, by its canonical (underscore) name.
struct LauncherFlag {
  const char* name;
  bool takes_value;  // false: a boolean flag (--standalone, --standalone=false, --nostandalone)
};
absl::Span<const LauncherFlag> LauncherFlags();

// A command line split into the launcher's flags and the program's command.
struct SplitArgs {
  // Canonical flag name (torchrun's dashes turned into underscores) and its value text.
  std::vector<std::pair<std::string, std::string>> flags;
  std::vector<std::string> command;  // everything from PROGRAM on, untouched
  bool help = false;                 // -h, --help or --helpfull came before PROGRAM
};

// Splits argv (without argv[0]) at PROGRAM: the first argument that is not a launcher flag
// or its value, or whatever follows "--". Accepts --name=value, --name value, and both
// --nproc_per_node and --nproc-per-node. An unknown flag before PROGRAM is an error.
absl::StatusOr<SplitArgs> SplitLauncherArgs(const std::vector<std::string>& args);

// Applies --standalone, validates every option (InvalidArgument naming the flag, the value
// and what to do instead), makes a run id, and settles the master port of a single-node run:
// picks a free one for 0, or checks that the given one can be bound on master_addr.
absl::StatusOr<LaunchOptions> ResolveLaunchOptions(LaunchOptions options);

// A port that was free on `addr` a moment ago (bind to port 0, read it, close).
absl::StatusOr<int> PickFreePort(const std::string& addr);

// OK when a listening socket could bind `addr`:`port` now (with SO_REUSEADDR, like c10d's
// TCPStore); InvalidArgument naming the port and suggesting --master_port=0 otherwise.
absl::Status CheckPortFree(const std::string& addr, int port);

// The environment of local rank `local_rank`: `base` ("NAME=value" entries) with torchrun's
// variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, TORCHELASTIC_*, ...) replaced, and
// OMP_NUM_THREADS=ThreadsPerRank(UsableCpus(), nproc_per_node) unless `base` sets it.
std::vector<std::string> RankEnvironment(const LaunchOptions& options, int local_rank,
                                         int restart_count, const std::vector<std::string>& base);

// The CPUs this process may run on: its affinity mask, capped by a container's CPU quota (the
// cgroup's cpu.max, or v1's cfs quota), at least 1.
int UsableCpus();

// The CPUs a cgroup CPU quota of `quota` microseconds per `period` allows, rounded up; 0 for no
// quota ("max" in cgroup v2, -1 in v1) or text that is not a number.
int CpusOfQuota(absl::string_view quota, absl::string_view period);

// Each local rank's intra-op threads: the usable CPUs shared out over the local ranks, at
// least 1. torchrun sets 1 for several ranks; the host-side work here (ZeRO-Offload's CPU
// AdamW, the norm of host gradients) needs a rank's share of the cores, and one rank gets
// them all.
int ThreadsPerRank(int usable_cpus, int nproc_per_node);

struct LaunchResult {
  int exit_code = 0;    // for the launcher process: 0, the rank's code, or 128+signal
  int attempts = 0;     // 1 + restarts used
  std::string failure;  // e.g. "rank 1 exited with exit code 3"; empty when all exited 0
};

class Launcher {
 public:
  // `options` should come from ResolveLaunchOptions. Fails when PROGRAM cannot be found.
  static absl::StatusOr<std::unique_ptr<Launcher>> Create(LaunchOptions options);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Runs the ranks to the end (restarting up to max_restarts times after a failure). Returns
  // once every rank's process has been reaped and, after a failure or a stop, the ranks'
  // process groups are empty (waited for a bounded time after SIGKILL). Errors are the
  // launcher's own (fork, pipe); a failing rank is a LaunchResult with a non-zero exit_code.
  // The ranks get SIGKILL if the thread calling Run dies (PR_SET_PDEATHSIG). A launcher that
  // is a child subreaper (launch_main.cc makes itself one) reaps the ranks' orphaned
  // descendants too.
  absl::StatusOr<LaunchResult> Run();

  // Forwards `signal` to every rank, then stops them as after a failure, without restarts;
  // Run then returns exit code 128+signal. A second request SIGKILLs at once. Async-signal-
  // safe: callable from a signal handler or another thread, before or during Run.
  void RequestStop(int signal);

 private:
  struct Stream {
    int fd = -1;  // non-blocking read end of the rank's pipe; -1 once closed
    int sink_fd = -1;
    std::string pending;  // bytes after the last newline
  };
  struct Rank {
    int local_rank = 0;
    int rank = 0;
    pid_t pid = -1;       // also the process group id
    bool exited = false;  // seen exited; stays a zombie until reaped
    bool reaped = false;
    int wait_status = 0;
    Stream out;
    Stream err;
  };
  enum class Ending { kSuccess, kFailure, kStopped };
  struct Attempt {
    Ending ending = Ending::kSuccess;
    std::string failure;  // "rank 1 exited with exit code 3" for kFailure
    int exit_code = 0;
  };

  Launcher(LaunchOptions options, std::string program_path, int stop_read_fd, int stop_write_fd);

  absl::StatusOr<Attempt> RunAttempt(int restart_count);
  absl::Status StartRanks(int restart_count);
  absl::Status SpawnRank(Rank& rank, const std::vector<std::string>& env);
  // Waits up to `timeout_ms` for output or a stop request and handles what arrived.
  void Pump(int timeout_ms);
  // Notes the ranks that exited since the last call (without reaping them); returns their
  // indices.
  std::vector<int> CollectExits();
  // Reaps every rank's process, waiting for those still running.
  void ReapAll();
  bool AllExited() const;
  // Records a stop signal read from the handler's pipe (duplicates within 1 s are one).
  void CountStopRequest(int signal);
  // Sends `signal` to every rank's process group and waits until every rank's process exited,
  // `timeout` passed (infinite: no limit), grace_period passed since the first rank exited (a
  // rank that outlives its peers by that much is stuck), or a second stop request came; then
  // SIGKILLs the groups and reaps every rank.
  void StopRanks(int signal, absl::Duration timeout);
  // Waits (a bounded time) until every rank's process group is empty, reaping the members a
  // subreaper launcher adopted.
  void WaitForEmptyGroups();
  // Reads what one read() gives: >0 bytes read, 0 when the stream is now closed, -1 when
  // nothing was there.
  ssize_t ReadOnce(Rank& rank, Stream& stream);
  // Reads what the rank already wrote (without waiting for more).
  void Drain(Rank& rank);
  // Flushes the partial last lines and closes the read ends.
  void CloseStreams();
  // Writes the complete lines in `stream.pending` (and the partial last one too with
  // `flush_partial`) to the stream's sink, each prefixed with "[rank N] ".
  void Emit(Rank& rank, Stream& stream, bool flush_partial);
  void Message(const std::string& text);

  const LaunchOptions options_;
  const std::string program_path_;
  const int stop_read_fd_;
  const int stop_write_fd_;
  std::vector<Rank> ranks_;
  int stop_signal_ = 0;    // the first stop request's signal; 0 before one arrived
  int stop_requests_ = 0;  // requests read from the stop pipe so far, duplicates not counted
  std::chrono::steady_clock::time_point first_stop_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_LAUNCHER_H_
