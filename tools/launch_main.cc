// //tools:launch: starts PROGRAM once per local rank with torchrun's flags and environment
// (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*), prefixes the
// ranks' output with "[rank N] ", and stops every rank when one fails. Exit code: 0, the
// failed rank's exit code (128+signal for a signal), 128+signal when the launcher itself was
// interrupted, 2 for bad flags.
//
//   bazel-bin/tools/launch --nproc-per-node=2 --standalone bazel-bin/tools/train --config=...
#include <signal.h>
#include <sys/prctl.h>

#include <stdlib.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <set>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "base/working_directory.h"
#include "config/accelerate_config.h"
#include "config/accelerate_yaml.h"
#include "tools/launcher.h"

ABSL_FLAG(int32_t, nproc_per_node, 1, "Processes (ranks) to start on this node.");
ABSL_FLAG(int32_t, nnodes, 1, "Nodes in the job; every node runs its own launcher.");
ABSL_FLAG(int32_t, node_rank, 0, "This node's rank in [0, nnodes).");
ABSL_FLAG(std::string, master_addr, "127.0.0.1", "Address of the node that hosts rank 0.");
ABSL_FLAG(int32_t, master_port, 29500,
          "Port on master_addr for the rendezvous store; 0 picks a free one (single node).");
ABSL_FLAG(int32_t, max_restarts, 0, "Times the whole group is restarted after a failure.");
ABSL_FLAG(double, grace_period_s, 10,
          "Seconds between SIGTERM and SIGKILL when stopping the ranks after one failed.");
ABSL_FLAG(double, stop_timeout_s, 90,
          "Seconds the ranks may take to save and exit after a forwarded SIGTERM/SIGINT before "
          "SIGKILL (they end themselves after CPPTRAIN_STOP_GRACE_S, 60 by default); 0: no "
          "limit. A second signal sends SIGKILL at once.");
ABSL_FLAG(bool, standalone, false, "Single node on 127.0.0.1 with a free port.");
ABSL_FLAG(std::string, config_file, "",
          "An `accelerate config` YAML (as accelerate launch --config_file): num_processes, "
          "num_machines, machine_rank, main_process_ip and main_process_port fill the flags not "
          "given, and the ranks get CPPTRAIN_ACCELERATE_CONFIG=<its absolute path>, which "
          "tools/train reads as --accelerate_config (docs/ACCELERATE.md).");

namespace {

constexpr char kUsage[] =
    "launch [--nproc_per_node=N] [--nnodes=1] [--node_rank=0] [--master_addr=127.0.0.1] "
    "[--master_port=29500] [--max_restarts=0] [--grace_period_s=10] [--stop_timeout_s=90] "
    "[--standalone] [--config_file=accelerate.yaml] "
    "PROGRAM [ARGS...]";

std::atomic<cpptrain::Launcher*> g_launcher{nullptr};

void ForwardSignal(int signal) {
  cpptrain::Launcher* launcher = g_launcher.load();
  if (launcher != nullptr) launcher->RequestStop(signal);
}

void PrintHelp() {
  std::cout << "Usage: " << kUsage << "\n\nFlags (dashes or underscores, like torchrun):\n";
  for (const cpptrain::LauncherFlag& spec : cpptrain::LauncherFlags()) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(spec.name);
    std::cout << "  --" << spec.name << " (default " << flag->DefaultValue() << ")\n      "
              << flag->Help() << "\n";
  }
}

int Fail(const std::string& message, int code) {
  std::cerr << "launch: " << message << "\n";
  return code;
}

// --config_file: the YAML's launch keys fill the options whose flags were not given (flags win,
// as in accelerate launch), and the ranks learn the file's path.
absl::Status ApplyAccelerateConfig(const std::string& path, const std::set<std::string>& given,
                                   cpptrain::LaunchOptions& options) {
  absl::StatusOr<std::vector<cpptrain::AccelerateSetting>> settings =
      cpptrain::ReadAccelerateYamlFile(path);
  if (!settings.ok()) return settings.status();
  absl::StatusOr<cpptrain::AccelerateMapping> mapping = cpptrain::MapAccelerateSettings(*settings);
  if (!mapping.ok()) return mapping.status();
  const cpptrain::AccelerateLaunch& launch = mapping->launch;
  const int machines = launch.num_machines > 0 ? launch.num_machines : 1;
  if (launch.num_processes > 0 && given.count("nproc_per_node") == 0) {
    if (launch.num_processes % machines != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": num_processes ", launch.num_processes, " is not a multiple of num_machines ",
          machines, "; every machine runs the same number of processes"));
    }
    options.nproc_per_node = launch.num_processes / machines;
  }
  if (launch.num_machines > 0 && given.count("nnodes") == 0) options.nnodes = machines;
  if (launch.machine_rank >= 0 && given.count("node_rank") == 0) {
    options.node_rank = launch.machine_rank;
  }
  if (!launch.main_process_ip.empty() && given.count("master_addr") == 0) {
    options.master_addr = launch.main_process_ip;
  }
  if (launch.main_process_port >= 0 && given.count("master_port") == 0) {
    options.master_port = launch.main_process_port;
  }
  setenv("CPPTRAIN_ACCELERATE_CONFIG", std::filesystem::absolute(path).c_str(), 1);
  return absl::OkStatus();
}

}  // namespace

int main(int argc, char** argv) {
  cpptrain::EnterBuildWorkingDirectory();
  absl::SetProgramUsageMessage(kUsage);
  absl::StatusOr<cpptrain::SplitArgs> split =
      cpptrain::SplitLauncherArgs(std::vector<std::string>(argv + 1, argv + argc));
  if (!split.ok()) return Fail(std::string(split.status().message()), 2);
  if (split->help) {
    PrintHelp();
    return 0;
  }
  // Parsed flag by flag, rather than by absl::ParseCommandLine, which exits 1 on a bad value.
  for (const auto& [name, value] : split->flags) {
    std::string error;
    if (!absl::FindCommandLineFlag(name)->ParseFrom(value, &error)) {
      return Fail(absl::StrCat("--", name, "=", value, " is not valid: ", error), 2);
    }
  }
  cpptrain::LaunchOptions options;
  options.nproc_per_node = absl::GetFlag(FLAGS_nproc_per_node);
  options.nnodes = absl::GetFlag(FLAGS_nnodes);
  options.node_rank = absl::GetFlag(FLAGS_node_rank);
  options.master_addr = absl::GetFlag(FLAGS_master_addr);
  options.master_port = absl::GetFlag(FLAGS_master_port);
  options.max_restarts = absl::GetFlag(FLAGS_max_restarts);
  options.grace_period = absl::Seconds(absl::GetFlag(FLAGS_grace_period_s));
  options.stop_timeout = absl::Seconds(absl::GetFlag(FLAGS_stop_timeout_s));
  options.standalone = absl::GetFlag(FLAGS_standalone);
  options.command = split->command;
  if (const std::string yaml = absl::GetFlag(FLAGS_config_file); !yaml.empty()) {
    std::set<std::string> given;
    for (const auto& flag : split->flags) given.insert(flag.first);
    if (absl::Status s = ApplyAccelerateConfig(yaml, given, options); !s.ok()) {
      return Fail(std::string(s.message()), 2);
    }
  }

  absl::StatusOr<cpptrain::LaunchOptions> resolved =
      cpptrain::ResolveLaunchOptions(std::move(options));
  if (!resolved.ok()) return Fail(std::string(resolved.status().message()), 2);
  absl::StatusOr<std::unique_ptr<cpptrain::Launcher>> launcher =
      cpptrain::Launcher::Create(*std::move(resolved));
  if (!launcher.ok()) {
    return Fail(std::string(launcher.status().message()),
                absl::IsInvalidArgument(launcher.status()) ? 2 : 1);
  }

  // A closed stdout must not kill the launcher (and orphan the ranks); an inherited
  // SIGCHLD=SIG_IGN would make the kernel reap the ranks and lose their exit codes; as a
  // subreaper the launcher adopts the ranks' orphaned descendants and sees them gone.
  signal(SIGPIPE, SIG_IGN);
  signal(SIGCHLD, SIG_DFL);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  g_launcher.store(launcher->get());
  struct sigaction action = {};
  action.sa_handler = ForwardSignal;
  sigemptyset(&action.sa_mask);
  for (int forwarded : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(forwarded, &action, nullptr);

  absl::StatusOr<cpptrain::LaunchResult> result = (*launcher)->Run();
  g_launcher.store(nullptr);
  if (!result.ok()) return Fail(result.status().ToString(), 1);
  return result->exit_code;
}
