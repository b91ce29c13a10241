#include "sharding/testing/multi_rank.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace multi_rank {
namespace {

// Runs `body`, turning an escaping exception into a status.
absl::Status RunBody(const RankBody& body, int rank, c10::intrusive_ptr<c10d::Store> store) {
  absl::Status status;
  absl::Status thrown = CatchTorch([&] { status = body(rank, std::move(store)); });
  return thrown.ok() ? status : thrown;
}

absl::Status Combine(const std::vector<std::string>& failures) {
  if (failures.empty()) return absl::OkStatus();
  return absl::InternalError(absl::StrJoin(failures, "\n"));
}

std::string FreshStorePath() {
  static std::atomic<int> counter{0};
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/multi_rank_filestore_", getpid(), "_",
                      counter++);
}

// Reads everything the child wrote into `fd` (a failure message), then closes it.
std::string ReadAll(int fd) {
  std::string out;
  char buffer[4096];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) out.append(buffer, n);
  close(fd);
  return out;
}

[[noreturn]] void RunChild(const RankBody& body, int rank, int world_size, const std::string& path,
                           int message_fd) {
  absl::Status status = CatchTorch([&] {
    auto store = c10::make_intrusive<c10d::FileStore>(path, world_size);
    absl::Status s = RunBody(body, rank, store);
    if (!s.ok()) throw std::runtime_error(std::string(s.message()));
  });
  if (!status.ok()) {
    const std::string message(status.message().substr(0, 16384));
    (void)!write(message_fd, message.data(), message.size());
  }
  close(message_fd);
  _exit(status.ok() ? 0 : 1);
}

}  // namespace

absl::Status RunRanksAsThreads(int world_size, const RankBody& body) {
  c10::intrusive_ptr<c10d::Store> store = c10::make_intrusive<c10d::HashStore>();
  std::vector<absl::Status> results(world_size);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] { results[rank] = RunBody(body, rank, store); });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::string> failures;
  for (int rank = 0; rank < world_size; ++rank) {
    if (!results[rank].ok())
      failures.push_back(absl::StrCat("rank ", rank, ": ", results[rank].ToString()));
  }
  return Combine(failures);
}

absl::Status RunRanksAsProcesses(int world_size, const RankBody& body,
                                 std::chrono::seconds deadline) {
  const std::string path = FreshStorePath();
  std::vector<pid_t> pids(world_size, -1);
  std::vector<int> message_fds(world_size, -1);
  for (int rank = 0; rank < world_size; ++rank) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe2 failed");
    const pid_t pid = fork();
    if (pid < 0) return absl::InternalError(absl::StrCat("fork failed for rank ", rank));
    if (pid == 0) {
      close(fds[0]);
      RunChild(body, rank, world_size, path, fds[1]);
    }
    close(fds[1]);
    pids[rank] = pid;
    message_fds[rank] = fds[0];
  }

  std::vector<int> wait_status(world_size, 0);
  std::vector<bool> done(world_size, false);
  std::vector<bool> killed(world_size, false);
  const auto end = std::chrono::steady_clock::now() + deadline;
  int remaining = world_size;
  while (remaining > 0) {
    for (int rank = 0; rank < world_size; ++rank) {
      if (!done[rank] && waitpid(pids[rank], &wait_status[rank], WNOHANG) == pids[rank]) {
        done[rank] = true;
        --remaining;
      }
    }
    if (remaining == 0) break;
    if (std::chrono::steady_clock::now() > end) {
      for (int rank = 0; rank < world_size; ++rank) {
        if (done[rank]) continue;
        kill(pids[rank], SIGKILL);
        killed[rank] = true;
        waitpid(pids[rank], &wait_status[rank], 0);
        done[rank] = true;
      }
      break;
    }
    // Polls the children's exit; results are read only after they ended.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  std::vector<std::string> failures;
  for (int rank = 0; rank < world_size; ++rank) {
    const std::string message = ReadAll(message_fds[rank]);
    const int s = wait_status[rank];
    if (killed[rank]) {
      failures.push_back(
          absl::StrCat("rank ", rank, ": still running after ", deadline.count(), " s; killed"));
    } else if (WIFSIGNALED(s)) {
      failures.push_back(
          absl::StrCat("rank ", rank, ": killed by signal ", WTERMSIG(s), " ", message));
    } else if (WEXITSTATUS(s) != 0) {
      failures.push_back(
          absl::StrCat("rank ", rank, ": exit code ", WEXITSTATUS(s), ": ", message));
    }
  }
  return Combine(failures);
}

}  // namespace multi_rank
}  // namespace cpptrain
