#include "sharding/rendezvous.h"

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "sharding/internal/agent_store_client.h"
#include "sharding/peer_watchdog.h"
#include "sharding/store_communicator.h"
#ifdef CPPTRAIN_HAS_GLOO
#include "sharding/gloo_communicator.h"
#endif
#ifdef CPPTRAIN_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>

#include "sharding/local_device.h"
#include "sharding/staged_communicator.h"
#include "sharding/staging_cuda.h"
#endif
#ifdef CPPTRAIN_HAS_NCCL
#include "sharding/nccl_communicator.h"
#endif

namespace cpptrain {
namespace {

using GetEnv = std::function<const char*(const char*)>;

constexpr int kDefaultMasterPort = 29500;

// Abseil 20220623 has no StrContainsIgnoreCase.
bool ContainsIgnoreCase(absl::string_view text, absl::string_view needle) {
  return absl::StrContains(absl::AsciiStrToLower(text), absl::AsciiStrToLower(needle));
}

// The variables a launcher sets, for error messages.
struct VariableNames {
  const char* rank;
  const char* local_rank;
  const char* world_size;
  const char* local_world_size;
};

bool IsSet(const GetEnv& getenv, const char* name) { return getenv(name) != nullptr; }

absl::StatusOr<int> ParseInt(absl::string_view name, absl::string_view value) {
  int result = 0;
  if (!absl::SimpleAtoi(value, &result)) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, "=\"", value, "\" is not an integer; set it to a whole number"));
  }
  return result;
}

// The integer in variable `name`; `why_required` says who needs it when it is missing.
absl::StatusOr<int> RequiredInt(const GetEnv& getenv, const char* name,
                                absl::string_view why_required) {
  const char* value = getenv(name);
  if (value == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is not set; ", why_required));
  }
  return ParseInt(name, value);
}

absl::StatusOr<int> OptionalInt(const GetEnv& getenv, const char* name, int fallback) {
  const char* value = getenv(name);
  if (value == nullptr) return fallback;
  return ParseInt(name, value);
}

absl::Status CheckPort(int port, absl::string_view source) {
  if (port < 1 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("MASTER_PORT=", port, " (", source,
                                                   ") is outside 1..65535; pick a free TCP port"));
  }
  return absl::OkStatus();
}

// Checks the relations every launcher guarantees. `uniform_nodes`: every node runs
// local_world_size ranks, so the world is a multiple of it.
absl::Status CheckRanks(const DistributedEnv& env, const VariableNames& names, bool uniform_nodes) {
  if (env.world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.world_size, "=", env.world_size, " must be at least 1"));
  }
  if (env.local_world_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.local_world_size, "=", env.local_world_size, " must be at least 1"));
  }
  if (env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(names.rank, "=", env.rank, " is outside [0, ",
                                                   names.world_size, "=", env.world_size, ")"));
  }
  if (env.local_rank < 0 || env.local_rank >= env.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(names.local_rank, "=", env.local_rank,
                                                   " is outside [0, ", names.local_world_size, "=",
                                                   env.local_world_size, ")"));
  }
  if (env.local_world_size > env.world_size ||
      (uniform_nodes && env.world_size % env.local_world_size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        names.world_size, "=", env.world_size, " is not a multiple of ", names.local_world_size,
        "=", env.local_world_size, "; every node must run the same number of ranks"));
  }
  return CheckPort(env.master_port, env.source);
}

absl::StatusOr<DistributedEnv> FromTorchrun(const GetEnv& getenv) {
  constexpr absl::string_view kWhy =
      "torchrun sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and "
      "MASTER_PORT together; launch with torchrun or set all six";
  DistributedEnv env;
  env.source = "torchrun";
  CT_ASSIGN_OR_RETURN(env.rank, RequiredInt(getenv, "RANK", kWhy));
  CT_ASSIGN_OR_RETURN(env.local_rank, RequiredInt(getenv, "LOCAL_RANK", kWhy));
  CT_ASSIGN_OR_RETURN(env.world_size, RequiredInt(getenv, "WORLD_SIZE", kWhy));
  CT_ASSIGN_OR_RETURN(env.local_world_size, RequiredInt(getenv, "LOCAL_WORLD_SIZE", kWhy));
  const char* addr = getenv("MASTER_ADDR");
  if (addr == nullptr || *addr == '\0') {
    return absl::InvalidArgumentError(
        absl::StrCat("MASTER_ADDR is ", addr == nullptr ? "not set" : "empty", "; ", kWhy));
  }
  env.master_addr = addr;
  CT_ASSIGN_OR_RETURN(env.master_port, RequiredInt(getenv, "MASTER_PORT", kWhy));
  const char* agent = getenv("TORCHELASTIC_USE_AGENT_STORE");
  env.use_agent_store = agent != nullptr && absl::string_view(agent) == "True";
  CT_ASSIGN_OR_RETURN(env.restart_count, OptionalInt(getenv, "TORCHELASTIC_RESTART_COUNT", 0));
  const char* run_id = getenv("TORCHELASTIC_RUN_ID");
  if (run_id != nullptr) env.run_id = run_id;
  CT_RETURN_IF_ERROR(
      CheckRanks(env, {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"}, true));
  return env;
}

// Open MPI's mpirun. It names no host for rank 0: MASTER_ADDR is required unless every rank
// runs on this host.
absl::StatusOr<DistributedEnv> FromOpenMpi(const GetEnv& getenv) {
  constexpr absl::string_view kWhy =
      "Open MPI's mpirun sets OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK, "
      "OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_SIZE for every rank; launch the ranks "
      "with mpirun";
  DistributedEnv env;
  env.source = "mpirun";
  CT_ASSIGN_OR_RETURN(env.rank, RequiredInt(getenv, "OMPI_COMM_WORLD_RANK", kWhy));
  CT_ASSIGN_OR_RETURN(env.local_rank, RequiredInt(getenv, "OMPI_COMM_WORLD_LOCAL_RANK", kWhy));
  CT_ASSIGN_OR_RETURN(env.world_size, RequiredInt(getenv, "OMPI_COMM_WORLD_SIZE", kWhy));
  CT_ASSIGN_OR_RETURN(env.local_world_size,
                      RequiredInt(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE", kWhy));
  const char* addr = getenv("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') {
    env.master_addr = addr;
  } else if (env.local_world_size != env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MASTER_ADDR is ", addr == nullptr ? "not set" : "empty",
        " and the ranks span several hosts (OMPI_COMM_WORLD_SIZE=", env.world_size,
        ", OMPI_COMM_WORLD_LOCAL_SIZE=", env.local_world_size,
        "); mpirun does not say which host runs rank 0: pass it with mpirun -x "
        "MASTER_ADDR=<host>"));
  }
  CT_ASSIGN_OR_RETURN(env.master_port, OptionalInt(getenv, "MASTER_PORT", kDefaultMasterPort));
  // mpirun may place different numbers of ranks on each host.
  CT_RETURN_IF_ERROR(CheckRanks(env,
                                {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                 "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"},
                                false));
  return env;
}

// Ranks per node from SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE; `uniform` says whether
// every node runs as many.
absl::Status SlurmLocalWorld(const GetEnv& getenv, DistributedEnv& env, bool& uniform) {
  uniform = true;
  if (IsSet(getenv, "SLURM_NTASKS_PER_NODE")) {
    CT_ASSIGN_OR_RETURN(env.local_world_size,
                        ParseInt("SLURM_NTASKS_PER_NODE", getenv("SLURM_NTASKS_PER_NODE")));
    return absl::OkStatus();
  }
  const char* tasks = getenv("SLURM_TASKS_PER_NODE");
  if (tasks == nullptr) {
    return absl::InvalidArgumentError(
        "SLURM_PROCID is set but neither SLURM_NTASKS_PER_NODE nor SLURM_TASKS_PER_NODE is; "
        "launch the ranks with srun");
  }
  CT_ASSIGN_OR_RETURN(std::vector<int> per_node, ParseSlurmTasksPerNode(tasks));
  const int total = std::accumulate(per_node.begin(), per_node.end(), 0);
  if (total != env.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_TASKS_PER_NODE=\"", tasks,
                                                   "\" adds up to ", total,
                                                   " tasks but SLURM_NTASKS=", env.world_size));
  }
  uniform = std::all_of(per_node.begin(), per_node.end(), [&](int n) { return n == per_node[0]; });
  if (uniform) {
    env.local_world_size = per_node[0];
    return absl::OkStatus();
  }
  CT_ASSIGN_OR_RETURN(int node,
                      RequiredInt(getenv, "SLURM_NODEID",
                                  absl::StrCat("nodes run different task counts (SLURM_TASKS_"
                                               "PER_NODE=\"",
                                               tasks,
                                               "\") and SLURM_NODEID "
                                               "says which node this is")));
  if (node < 0 || node >= static_cast<int>(per_node.size())) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_NODEID=", node, " is outside [0, ",
                                                   per_node.size(), ") (SLURM_TASKS_PER_NODE=\"",
                                                   tasks, "\")"));
  }
  env.local_world_size = per_node[node];
  return absl::OkStatus();
}

absl::StatusOr<DistributedEnv> FromSlurm(const GetEnv& getenv) {
  constexpr absl::string_view kWhy = "srun sets it for every task; launch the ranks with srun";
  DistributedEnv env;
  env.source = "slurm";
  CT_ASSIGN_OR_RETURN(env.rank, RequiredInt(getenv, "SLURM_PROCID", kWhy));
  CT_ASSIGN_OR_RETURN(env.local_rank, RequiredInt(getenv, "SLURM_LOCALID", kWhy));
  CT_ASSIGN_OR_RETURN(env.world_size, RequiredInt(getenv, "SLURM_NTASKS", kWhy));
  bool uniform = true;
  CT_RETURN_IF_ERROR(SlurmLocalWorld(getenv, env, uniform));
  const char* addr = getenv("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') {
    env.master_addr = addr;
  } else {
    const char* nodelist = getenv("SLURM_JOB_NODELIST");
    if (nodelist == nullptr) {
      return absl::InvalidArgumentError(
          "SLURM_JOB_NODELIST is not set (it names the host of rank 0); run inside a SLURM "
          "allocation or set MASTER_ADDR");
    }
    absl::StatusOr<std::string> host = FirstSlurmHost(nodelist);
    if (!host.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("SLURM_JOB_NODELIST: ", host.status().message()));
    }
    env.master_addr = *std::move(host);
  }
  CT_ASSIGN_OR_RETURN(env.master_port, OptionalInt(getenv, "MASTER_PORT", kDefaultMasterPort));
  CT_RETURN_IF_ERROR(CheckRanks(
      env, {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "the local task count"}, uniform));
  return env;
}

absl::StatusOr<DistributedEnv> FromSingleProcess(const GetEnv& getenv) {
  DistributedEnv env;
  env.source = "single";
  const char* addr = getenv("MASTER_ADDR");
  if (addr != nullptr && *addr != '\0') env.master_addr = addr;
  CT_ASSIGN_OR_RETURN(env.master_port, OptionalInt(getenv, "MASTER_PORT", kDefaultMasterPort));
  CT_RETURN_IF_ERROR(CheckPort(env.master_port, env.source));
  return env;
}

// Parses the digits of one bracket range start: "01-04" -> "01", "7" -> "7".
absl::StatusOr<std::string> FirstOfRange(absl::string_view nodelist, absl::string_view range) {
  std::vector<absl::string_view> ends = absl::StrSplit(range, '-');
  const auto all_digits = [](absl::string_view s) {
    return !s.empty() && std::all_of(s.begin(), s.end(), absl::ascii_isdigit);
  };
  if (ends.size() > 2 || !std::all_of(ends.begin(), ends.end(), all_digits)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", nodelist, "\": \"[", range,
                                                   "...]\" is not a range of numbers like "
                                                   "[01-04,07]"));
  }
  return std::string(ends[0]);
}

}  // namespace

absl::StatusOr<std::string> FirstSlurmHost(absl::string_view nodelist) {
  const absl::string_view list = absl::StripAsciiWhitespace(nodelist);
  std::string host;
  size_t i = 0;
  while (i < list.size() && list[i] != ',') {
    if (list[i] == ']') {
      return absl::InvalidArgumentError(absl::StrCat("\"", nodelist, "\" has a ']' without a '['"));
    }
    if (list[i] != '[') {
      host.push_back(list[i++]);
      continue;
    }
    const size_t close = list.find(']', i);
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("\"", nodelist, "\" has an unclosed '['"));
    }
    const absl::string_view inside = list.substr(i + 1, close - i - 1);
    CT_ASSIGN_OR_RETURN(std::string first,
                        FirstOfRange(nodelist, inside.substr(0, inside.find(','))));
    host += first;
    i = close + 1;
  }
  if (host.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", nodelist, "\" does not start with a host name"));
  }
  return host;
}

absl::StatusOr<std::vector<int>> ParseSlurmTasksPerNode(absl::string_view value) {
  std::vector<int> per_node;
  const auto malformed = [&](absl::string_view item) {
    return absl::InvalidArgumentError(absl::StrCat("SLURM_TASKS_PER_NODE=\"", value, "\": \"", item,
                                                   "\" is not N or N(xM) with N, M >= 1"));
  };
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    item = absl::StripAsciiWhitespace(item);
    int tasks = 0;
    int repeat = 1;
    const size_t paren = item.find('(');
    if (paren == absl::string_view::npos) {
      if (!absl::SimpleAtoi(item, &tasks)) return malformed(item);
    } else {
      const absl::string_view count = item.substr(paren);
      if (count.size() < 4 || count.substr(0, 2) != "(x" || count.back() != ')' ||
          !absl::SimpleAtoi(item.substr(0, paren), &tasks) ||
          !absl::SimpleAtoi(count.substr(2, count.size() - 3), &repeat)) {
        return malformed(item);
      }
    }
    if (tasks < 1 || repeat < 1) return malformed(item);
    per_node.insert(per_node.end(), repeat, tasks);
  }
  return per_node;
}

absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment(const GetEnv& getenv) {
  if (IsSet(getenv, "RANK") || IsSet(getenv, "WORLD_SIZE")) return FromTorchrun(getenv);
  // Before SLURM: mpirun inside an allocation starts its daemons with srun, so its ranks also
  // carry the daemons' SLURM_PROCID and SLURM_LOCALID.
  if (IsSet(getenv, "OMPI_COMM_WORLD_RANK") || IsSet(getenv, "OMPI_COMM_WORLD_SIZE")) {
    return FromOpenMpi(getenv);
  }
  if (IsSet(getenv, "SLURM_PROCID")) return FromSlurm(getenv);
  return FromSingleProcess(getenv);
}

absl::StatusOr<DistributedEnv> DistributedEnvFromEnvironment() {
  return DistributedEnvFromEnvironment(&std::getenv);
}

namespace {

std::string Address(const DistributedEnv& env) {
  return absl::StrCat(env.master_addr, ":", env.master_port);
}

absl::Status ConnectError(const DistributedEnv& env, std::chrono::milliseconds timeout,
                          const std::string& message) {
  const bool hosting = env.rank == 0;
  // LibTorch 1.13 says "Address already in use ... errno: 98"; 2.x "EADDRINUSE, message:
  // address already in use".
  if (hosting && (ContainsIgnoreCase(message, "address already in use") ||
                  absl::StrContains(message, "errno: 98") ||
                  absl::StrContains(message, "EADDRINUSE"))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ConnectStore: rank 0 cannot host the TCPStore on port ", env.master_port,
        ": the port is already in use (another job or an earlier run holds it); pick another "
        "MASTER_PORT, or launch with torchrun --master_port=0 to get a free one [c10d: ",
        message, "]"));
  }
  if (ContainsIgnoreCase(message, "timed out") || ContainsIgnoreCase(message, "timeout")) {
    return absl::DeadlineExceededError(
        absl::StrCat("ConnectStore: rank ", env.rank, " could not reach the TCPStore at ",
                     Address(env), " within ", timeout.count(), " ms; expected ", env.world_size,
                     " ranks, the store hosted by rank 0. Check that it started and that "
                     "MASTER_ADDR and MASTER_PORT are the same on every rank [c10d: ",
                     message, "]"));
  }
  return absl::UnavailableError(absl::StrCat("ConnectStore: rank ", env.rank, " of ",
                                             env.world_size, " cannot use the TCPStore at ",
                                             Address(env), ": ", message));
}

// Every rank announces itself and waits for the others, so a missing rank shows up here, by
// number, rather than later as a collective timeout.
absl::Status WaitForAllRanks(c10d::Store& store, const DistributedEnv& env,
                             std::chrono::milliseconds timeout) {
  const auto key = [](int rank) { return absl::StrCat("cpptrain/connect/rank", rank); };
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(key(r));
  absl::Status status = CatchTorch([&] {
    store.set(key(env.rank), std::vector<uint8_t>{1});
    store.wait(keys, timeout);
  });
  if (status.ok()) return status;
  std::vector<int> missing;
  (void)CatchTorch([&] {
    for (int r = 0; r < env.world_size && missing.size() < 16; ++r) {
      if (!store.check({key(r)})) missing.push_back(r);
    }
  });
  return absl::DeadlineExceededError(absl::StrCat(
      "ConnectStore: rank ", env.rank, " waited ", timeout.count(), " ms at ", Address(env),
      " for ", env.world_size, " ranks; missing ranks (first 16): [", absl::StrJoin(missing, ", "),
      "]. Check that every rank was launched with the same "
      "world size and MASTER_ADDR/MASTER_PORT [",
      status.message(), "]"));
}

// The store ConnectStore returns when the peer watchdog runs. The watchdog lives as long as
// the store: a rank that let go of it has ended its part of the job, so its watchdog marks it
// finished rather than leaving it to look silent. The ranks' keys go under "cpptrain", apart
// from the watchdog's.
class WatchedStore : public c10d::PrefixStore {
 public:
  WatchedStore(c10::intrusive_ptr<c10d::Store> store, std::unique_ptr<PeerWatchdog> watchdog,
               bool hosts)
      : c10d::PrefixStore("cpptrain", std::move(store)),
        watchdog_(std::move(watchdog)),
        hosts_(hosts) {}
  // A rank that only connects closes its connection before its watchdog marks it finished;
  // the host (rank 0) stops its watchdog, which may wait for those marks, before the server
  // goes with this store, and its finished mark is written to it.
  ~WatchedStore() override {
    if (!hosts_) {
      store_.reset();
      VLOG(1) << "ConnectStore: closed this rank's store connection";
    }
    watchdog_->Stop();
  }

 private:
  std::unique_ptr<PeerWatchdog> watchdog_;
  const bool hosts_;
};

// LibTorch 1.x's TCPStore client keeps a thread that ends its process when the server closes
// under it (an uncaught "Connection reset by peer"), so rank 0 hosts the store until the other
// ranks have closed theirs (PeerWatchdogOptions::drain_peers_at_stop). 2.x has no such thread.
constexpr bool kStoreClientsDieWithTheirServer = TORCH_VERSION_MAJOR < 2;

absl::StatusOr<std::unique_ptr<PeerWatchdog>> StartPeerWatchdog(
    const DistributedEnv& env, std::chrono::milliseconds peer_timeout) {
  PeerWatchdogOptions options;
  options.rank = env.rank;
  options.world_size = env.world_size;
  options.host = env.master_addr;
  options.port = env.master_port;
  options.store_host = "rank 0";
  options.timeout = peer_timeout;
  options.drain_peers_at_stop = env.rank == 0 && kStoreClientsDieWithTheirServer;
  return PeerWatchdog::Start(std::move(options));
}

// The key rank 0 publishes its store's address under in torchrun's agent store.
std::string AgentStoreKey(const DistributedEnv& env) {
  return absl::StrCat("/worker/attempt_", env.restart_count, "/cpptrain/", env.run_id, "/store");
}

// A TCPStore at `host`:`port` (port 0 with `server`: a free one), or the error that says why
// not.
absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> OpenTcpStore(const DistributedEnv& env,
                                                                const std::string& host, int port,
                                                                bool server,
                                                                std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = server;
  options.numWorkers = env.world_size;
  options.waitWorkers = false;  // WaitForAllRanks names the missing ranks.
  options.timeout = timeout;
  options.multiTenant = true;
  try {
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    DistributedEnv where = env;
    where.master_addr = host;
    where.master_port = port;
    return ConnectError(where, timeout, TorchErrorMessage(e));
  }
}

// "address:port" as rank 0 published it (an IPv6 address has colons of its own).
absl::Status ParseStoreAddress(const std::string& value, DistributedEnv& env) {
  const size_t colon = value.rfind(':');
  int port = 0;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 1 || port > 65535) {
    return absl::InternalError(absl::StrCat("rank 0 published \"", value, "\" under \"",
                                            AgentStoreKey(env),
                                            "\" in torchrun's agent store; expected address:port"));
  }
  env.master_addr = value.substr(0, colon);
  env.master_port = port;
  return absl::OkStatus();
}

bool IsLoopback(absl::string_view address) {
  return absl::StartsWith(address, "127.") || address == "::1";
}

// Under torchrun's agent store: rank 0 hosts the job's store on a free port and publishes its
// address through the agent's store (the address rank 0 reached the agent from, or MASTER_ADDR
// when that was loopback); every other rank reads it and connects. Returns this rank's
// connection; `own` becomes the environment of the job's store (its address and port).
absl::StatusOr<c10::intrusive_ptr<c10d::TCPStore>> MeetThroughAgentStore(
    DistributedEnv& own, std::chrono::milliseconds timeout) {
  CT_ASSIGN_OR_RETURN(
      std::unique_ptr<sharding_internal::AgentStoreClient> agent,
      sharding_internal::AgentStoreClient::Connect(own.master_addr, own.master_port, timeout));
  const std::string key = AgentStoreKey(own);
  if (own.rank != 0) {
    absl::StatusOr<std::string> value = agent->WaitAndGet(key);
    if (!value.ok()) {
      return absl::Status(value.status().code(),
                          absl::StrCat("ConnectStore: rank ", own.rank,
                                       " did not learn where rank 0 hosts the job's store: ",
                                       value.status().message()));
    }
    CT_RETURN_IF_ERROR(ParseStoreAddress(*value, own));
    return OpenTcpStore(own, own.master_addr, own.master_port, /*server=*/false, timeout);
  }
  CT_ASSIGN_OR_RETURN(const std::string local, agent->LocalAddress());
  // A loopback connection means the agent runs on this host, so MASTER_ADDR (as the other
  // hosts resolve it) names this host too, where a loopback address (Debian maps the host name
  // to 127.0.1.1) would not.
  if (!IsLoopback(local)) own.master_addr = local;
  CT_ASSIGN_OR_RETURN(c10::intrusive_ptr<c10d::TCPStore> store,
                      OpenTcpStore(own, own.master_addr, 0, /*server=*/true, timeout));
  own.master_port = store->getPort();
  CT_RETURN_IF_ERROR(agent->Set(key, absl::StrCat(own.master_addr, ":", own.master_port)));
  return store;
}

}  // namespace

absl::StatusOr<c10::intrusive_ptr<c10d::Store>> ConnectStore(const DistributedEnv& env,
                                                             std::chrono::milliseconds timeout) {
  if (env.world_size < 1 || env.rank < 0 || env.rank >= env.world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConnectStore: need 0 <= rank < world_size, "
                     "got rank ",
                     env.rank, ", world_size ", env.world_size));
  }
  CT_RETURN_IF_ERROR(CheckPort(env.master_port, env.source));
  if (timeout.count() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ConnectStore: timeout must be positive, "
                     "got ",
                     timeout.count(), " ms"));
  }
  if (env.world_size == 1) {
    // Nobody to meet: no port to collide with another job's.
    return c10::intrusive_ptr<c10d::Store>(c10::make_intrusive<c10d::HashStore>());
  }
  CT_ASSIGN_OR_RETURN(std::chrono::milliseconds peer_timeout, PeerTimeoutFromEnvironment());
  DistributedEnv own = env;
  c10::intrusive_ptr<c10d::TCPStore> tcp;
  if (env.use_agent_store) {
    CT_ASSIGN_OR_RETURN(tcp, MeetThroughAgentStore(own, timeout));
    own.use_agent_store = false;
  } else {
    CT_ASSIGN_OR_RETURN(tcp, OpenTcpStore(own, own.master_addr, own.master_port,
                                          /*server=*/own.rank == 0, timeout));
  }
  CT_RETURN_IF_ERROR(WaitForAllRanks(*tcp, own, timeout));
  VLOG(1) << "ConnectStore: rank " << own.rank << " of " << own.world_size << " at "
          << Address(own) << (env.use_agent_store ? " (found through torchrun's agent store)" : "");
  if (peer_timeout.count() == 0) return c10::intrusive_ptr<c10d::Store>(tcp);
  CT_ASSIGN_OR_RETURN(std::unique_ptr<PeerWatchdog> watchdog, StartPeerWatchdog(own, peer_timeout));
  return c10::intrusive_ptr<c10d::Store>(
      c10::make_intrusive<WatchedStore>(std::move(tcp), std::move(watchdog), own.rank == 0));
}

namespace {

// CPPTRAIN_CPU_COMM: "store" picks the store communicator, "gloo" insists on Gloo; unset or
// empty picks Gloo where this build has it, else the store.
absl::StatusOr<std::unique_ptr<Communicator>> CreateCpuCommunicator(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout) {
  const char* env = std::getenv("CPPTRAIN_CPU_COMM");
  const absl::string_view choice = env == nullptr ? "" : env;
  if (!choice.empty() && choice != "store" && choice != "gloo") {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPPTRAIN_CPU_COMM=\"", choice,
        "\" names no CPU communicator; set it to store or gloo, or unset it (Gloo where the build "
        "has it, else the store)"));
  }
#ifdef CPPTRAIN_HAS_GLOO
  if (choice != "store") {
    CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> gloo,
                        GlooCommunicator::Create(std::move(store), rank, size, timeout));
    return std::unique_ptr<Communicator>(std::move(gloo));
  }
  const char* why = "CPPTRAIN_CPU_COMM=store";
#else
  if (choice == "gloo") {
    return absl::UnimplementedError(
        "CPPTRAIN_CPU_COMM=gloo, but this build has no Gloo communicator (its LibTorch ships no "
        "c10d Gloo headers): unset CPPTRAIN_CPU_COMM to move CPU tensors through the store");
  }
  const char* why = "this build has no Gloo";
#endif
  LOG_FIRST_N(INFO, 1) << "CPU collectives go through the c10d store (" << why
                       << "): slow, meant for tests and small tensors";
  CT_ASSIGN_OR_RETURN(std::unique_ptr<StoreCommunicator> comm,
                      StoreCommunicator::Create(std::move(store), rank, size, timeout));
  return std::unique_ptr<Communicator>(std::move(comm));
}

#ifdef CPPTRAIN_HAS_CUDA
// Processes sharing a GPU (CPPTRAIN_SHARED_GPU=1): CUDA tensors staged through the CPU
// communicator; CPPTRAIN_STAGED_DELAY_US (default 0) delays each copy back, to widen races.
absl::StatusOr<std::unique_ptr<Communicator>> CreateStagedCudaCommunicator(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, int cuda_index,
    std::chrono::milliseconds timeout) {
  int64_t delay_us = 0;
  const char* delay = std::getenv("CPPTRAIN_STAGED_DELAY_US");
  if (delay != nullptr && (!absl::SimpleAtoi(delay, &delay_us) || delay_us < 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CPPTRAIN_STAGED_DELAY_US=\"", delay,
        "\" is not a whole number of microseconds >= 0: fix it or unset it (no delay)"));
  }
  CT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> host,
                      CreateCpuCommunicator(std::move(store), rank, size, timeout));
  LOG_FIRST_N(INFO, 1) << "CPPTRAIN_SHARED_GPU=1: CUDA collectives on cuda:" << cuda_index
                       << " are staged through the CPU communicator (" << host->backend()
                       << "), not NCCL; delay " << delay_us << " us";
  CT_ASSIGN_OR_RETURN(std::unique_ptr<StagedCommunicator> staged,
                      StagedCommunicator::Create(
                          std::move(host),
                          CudaStaging(cuda_index, std::chrono::microseconds(delay_us))));
  return std::unique_ptr<Communicator>(std::move(staged));
}
#endif

// What CreateCpuCommunicator will pick, as AgreeOnCommunicatorKind compares it.
std::string CpuCommunicatorKind() {
  const char* choice = std::getenv("CPPTRAIN_CPU_COMM");
  return absl::StrCat("cpu, CPPTRAIN_CPU_COMM=", choice == nullptr ? "(unset)" : choice);
}

}  // namespace

absl::Status AgreeOnCommunicatorKind(c10d::Store& store, int rank, int size,
                                     const std::string& kind, std::chrono::milliseconds timeout) {
  if (size <= 1) return absl::OkStatus();
  const auto key = [](int r) { return absl::StrCat("communicator_kind/", r); };
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key(r));
  std::vector<std::string> kinds;
  try {
    store.set(key(rank), std::vector<uint8_t>(kind.begin(), kind.end()));
    store.wait(keys, timeout);
    for (int r = 0; r < size; ++r) {
      const std::vector<uint8_t> value = store.get(key(r));
      kinds.emplace_back(value.begin(), value.end());
    }
  } catch (const c10::Error& e) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", rank, " of ", size, " (", kind, "): not every rank said which communicator it "
        "creates within ", timeout.count(), " ms: ", e.what_without_backtrace()));
  }
  if (std::all_of(kinds.begin(), kinds.end(), [&](const std::string& k) { return k == kind; })) {
    return absl::OkStatus();
  }
  std::string each;
  for (int r = 0; r < size; ++r) {
    absl::StrAppend(&each, r == 0 ? "" : "; ", "rank ", r, ": ", kinds[r]);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the ranks would create different communicators (", each, "), which never meet: every "
      "rank must see its GPU (torch::cuda::is_available(), CUDA_VISIBLE_DEVICES) or every rank "
      "must train on the CPU (use_cpu), and CPPTRAIN_SHARED_GPU and CPPTRAIN_CPU_COMM must be "
      "the same on every rank"));
}

absl::StatusOr<std::unique_ptr<Communicator>> CreateCommunicatorForDevice(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, c10::DeviceType device_type,
    std::chrono::milliseconds timeout) {
  switch (device_type) {
    case c10::DeviceType::CPU:
      CT_RETURN_IF_ERROR(AgreeOnCommunicatorKind(*store, rank, size, CpuCommunicatorKind(),
                                                 timeout));
      return CreateCpuCommunicator(std::move(store), rank, size, timeout);
    case c10::DeviceType::CUDA:
      // ---- CUDA builds only (CPPTRAIN_HAS_CUDA; NCCL where CPPTRAIN_HAS_NCCL) -------------
#ifdef CPPTRAIN_HAS_CUDA
    {
      // This process's GPU (sharding/local_device.h, as the engines pick it) becomes the
      // current device.
      CT_ASSIGN_OR_RETURN(const LocalDevice local,
                          LocalDeviceFromEnvironment(static_cast<int>(c10::cuda::device_count())));
      c10::cuda::set_device(static_cast<c10::DeviceIndex>(local.cuda_index));
      // Staged collectives run on the CPU communicator, so its kind is part of theirs.
      CT_RETURN_IF_ERROR(AgreeOnCommunicatorKind(
          *store, rank, size,
          local.shared_gpu ? absl::StrCat("cuda staged (CPPTRAIN_SHARED_GPU=1) through ",
                                          CpuCommunicatorKind())
                           : std::string("cuda, NCCL"),
          timeout));
      if (local.shared_gpu) {
        return CreateStagedCudaCommunicator(std::move(store), rank, size, local.cuda_index,
                                            timeout);
      }
#ifdef CPPTRAIN_HAS_NCCL
      CT_ASSIGN_OR_RETURN(std::unique_ptr<NcclCommunicator> nccl,
                          NcclCommunicator::Create(store, rank, size, local.cuda_index, timeout));
      return std::unique_ptr<Communicator>(std::move(nccl));
#endif
    }
#endif
      // ---- end CUDA ----------------------------------------------------------------------
      return absl::UnimplementedError(
          "CreateCommunicatorForDevice: CUDA tensors need the NCCL communicator, which is "
          "compiled only in CUDA builds with NCCL (CPPTRAIN_HAS_NCCL; without NCCL, "
          "CPPTRAIN_SHARED_GPU=1 stages them through the CPU); this build has no NCCL, so train "
          "on device cpu or use a CUDA build with NCCL");
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "CreateCommunicatorForDevice: no communicator for device type ",
          c10::DeviceTypeName(device_type), "; use cpu (Gloo or the store) or cuda (NCCL)"));
  }
}

}  // namespace cpptrain
