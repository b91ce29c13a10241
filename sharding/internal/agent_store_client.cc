#include "sharding/internal/agent_store_client.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"

namespace cpptrain {
namespace sharding_internal {
namespace {

using Clock = std::chrono::steady_clock;

void AppendU64(std::string& out, uint64_t value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// One connected socket to host:port, or the last error seen trying the addresses.
absl::StatusOr<int> ConnectOnce(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve MASTER_ADDR \"", host,
                                                   "\": ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      freeaddrinfo(found);
      return fd;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return absl::UnavailableError(last_error);
}

}  // namespace

std::string EncodeAgentRequest(AgentQuery query, std::initializer_list<absl::string_view> strings) {
  std::string out(1, static_cast<char>(query));
  if (query == AgentQuery::kWait) AppendU64(out, strings.size());
  for (absl::string_view s : strings) {
    AppendU64(out, s.size());
    out.append(s.data(), s.size());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<AgentStoreClient>> AgentStoreClient::Connect(
    const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string address = absl::StrCat(host, ":", port);
  const Clock::time_point deadline = Clock::now() + timeout;
  absl::StatusOr<int> fd = ConnectOnce(host, port);
  // The agent starts its store before the workers, but a refused connection may be a store
  // still binding: try again until the deadline.
  while (!fd.ok() && absl::IsUnavailable(fd.status()) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fd = ConnectOnce(host, port);
  }
  if (!fd.ok()) {
    return absl::Status(fd.status().code(),
                        absl::StrCat("cannot connect to torchrun's agent store at ", address,
                                     " (TORCHELASTIC_USE_AGENT_STORE=True) within ",
                                     timeout.count(), " ms: ", fd.status().message()));
  }
  std::unique_ptr<AgentStoreClient> client(new AgentStoreClient(*fd, address, timeout));
  std::string hello(1, static_cast<char>(AgentQuery::kValidate));
  const uint32_t magic = kAgentStoreMagic;
  hello.append(reinterpret_cast<const char*>(&magic), sizeof(magic));
  if (absl::Status s = client->Send(hello); !s.ok()) return s;
  return client;
}

AgentStoreClient::~AgentStoreClient() { close(fd_); }

absl::Status AgentStoreClient::Send(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat("torchrun's agent store at ", address_,
                                                 " closed the connection: ",
                                                 std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AgentStoreClient::Receive(void* out, size_t size, absl::string_view what) {
  const Clock::time_point deadline = Clock::now() + timeout_;
  char* dst = static_cast<char*>(out);
  size_t got = 0;
  while (got < size) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    const int ready = left > 0 ? poll(&p, 1, static_cast<int>(left)) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      return absl::DeadlineExceededError(absl::StrCat("no reply from torchrun's agent store at ",
                                                      address_, " within ", timeout_.count(),
                                                      " ms while waiting for ", what));
    }
    const ssize_t n = recv(fd_, dst + got, size - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(
          absl::StrCat("torchrun's agent store at ", address_, " closed the connection while ",
                       "this rank waited for ", what, " (the agent ended or refused the request)"));
    }
    got += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status AgentStoreClient::Set(absl::string_view key, absl::string_view value) {
  return Send(EncodeAgentRequest(AgentQuery::kSet, {key, value}));
}

absl::StatusOr<std::string> AgentStoreClient::WaitAndGet(absl::string_view key) {
  const std::string what = absl::StrCat("key \"", key, "\"");
  if (absl::Status s = Send(EncodeAgentRequest(AgentQuery::kWait, {key})); !s.ok()) return s;
  uint8_t reply = 0xff;
  if (absl::Status s = Receive(&reply, 1, what); !s.ok()) return s;
  if (reply != kAgentStopWaiting) {
    return absl::InternalError(absl::StrCat("torchrun's agent store at ", address_,
                                            " answered a wait for ", what, " with ",
                                            static_cast<int>(reply), " instead of ",
                                            static_cast<int>(kAgentStopWaiting)));
  }
  if (absl::Status s = Send(EncodeAgentRequest(AgentQuery::kGet, {key})); !s.ok()) return s;
  uint64_t size = 0;
  if (absl::Status s = Receive(&size, sizeof(size), what); !s.ok()) return s;
  constexpr uint64_t kMaxValue = 1 << 20;
  if (size > kMaxValue) {
    return absl::InternalError(absl::StrCat("torchrun's agent store at ", address_, " sent ",
                                            size, " bytes for ", what, "; expected an address"));
  }
  std::string value(size, '\0');
  if (absl::Status s = Receive(value.data(), size, what); !s.ok()) return s;
  return value;
}

absl::StatusOr<std::string> AgentStoreClient::LocalAddress() const {
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&local), &length) != 0) {
    return absl::InternalError(absl::StrCat("getsockname on the connection to ", address_, ": ",
                                            std::strerror(errno)));
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (local.ss_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&local)->sin_addr, text, sizeof(text));
    return std::string(text);
  }
  const in6_addr& v6 = reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr;
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    inet_ntop(AF_INET, &v6.s6_addr[12], text, sizeof(text));
    return std::string(text);
  }
  inet_ntop(AF_INET6, &v6, text, sizeof(text));
  return std::string(text);
}

}  // namespace sharding_internal
}  // namespace cpptrain
