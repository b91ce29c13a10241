#include "sharding/testing/fake_agent_store.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sharding/internal/agent_store_client.h"

namespace cpptrain {
namespace testing_fakes {
namespace {

using sharding_internal::AgentQuery;
using sharding_internal::kAgentStopWaiting;
using sharding_internal::kAgentStoreMagic;

bool ReadAll(int fd, void* out, size_t size) {
  char* p = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t n = recv(fd, p, size, 0);
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

bool ReadString(int fd, std::string& out) {
  uint64_t size = 0;
  if (!ReadAll(fd, &size, sizeof(size))) return false;
  out.assign(size, '\0');
  return ReadAll(fd, out.data(), size);
}

}  // namespace

FakeAgentStore::FakeAgentStore() {
  listen_fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  listen(listen_fd_, 64);
  acceptor_ = std::thread([this] { Accept(); });
}

FakeAgentStore::~FakeAgentStore() {
  shutdown(listen_fd_, SHUT_RDWR);
  close(listen_fd_);
  acceptor_.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  for (std::thread& t : connections_) t.join();
  for (int fd : fds_) close(fd);
}

std::string FakeAgentStore::Value(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  return it == values_.end() ? "" : it->second;
}

void FakeAgentStore::Accept() {
  while (true) {
    const int fd = accept(listen_fd_, nullptr, nullptr);
    if (fd < 0) return;
    fds_.push_back(fd);
    connections_.emplace_back([this, fd] { Serve(fd); });
  }
}

void FakeAgentStore::Serve(int fd) {
  uint8_t query = 0;
  uint32_t magic = 0;
  if (!ReadAll(fd, &query, 1) || query != static_cast<uint8_t>(AgentQuery::kValidate) ||
      !ReadAll(fd, &magic, 4) || magic != kAgentStoreMagic) {
    return;  // PyTorch's server ignores an unvalidated client.
  }
  ++validated_;
  while (ReadAll(fd, &query, 1)) {
    std::string key;
    if (query == static_cast<uint8_t>(AgentQuery::kSet)) {
      std::string value;
      if (!ReadString(fd, key) || !ReadString(fd, value)) return;
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
      cv_.notify_all();
    } else if (query == static_cast<uint8_t>(AgentQuery::kWait)) {
      uint64_t count = 0;
      if (!ReadAll(fd, &count, 8) || count != 1 || !ReadString(fd, key)) return;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopped_ || values_.count(key) > 0; });
      if (stopped_) return;
      const uint8_t stop = kAgentStopWaiting;
      send(fd, &stop, 1, MSG_NOSIGNAL);
    } else if (query == static_cast<uint8_t>(AgentQuery::kGet)) {
      if (!ReadString(fd, key)) return;
      const std::string value = Value(key);
      const uint64_t size = value.size();
      send(fd, &size, 8, MSG_NOSIGNAL);
      send(fd, value.data(), value.size(), MSG_NOSIGNAL);
    } else {
      return;  // a query this stand-in does not serve
    }
  }
}

}  // namespace testing_fakes
}  // namespace cpptrain
