// A client for the store torchrun 2.x's agent hosts (TORCHELASTIC_USE_AGENT_STORE=True), just
// enough of it for the ranks to meet: set a key, wait for a key and read it. It speaks the
// wire protocol of PyTorch 2.x's c10d TCPStore server (classic and libuv backends alike): a
// connection opens with VALIDATE and a magic number, each request is a one-byte query type
// followed by length-prefixed strings, in the host's byte order. LibTorch 1.13's own TCPStore
// client cannot talk to that server (its query types are numbered without VALIDATE, so a 1.13
// SET reaches a 2.x server as VALIDATE and its GET as COMPARE_SET: the ranks then wait until
// ddp_timeout), so rendezvous.cc uses this client for one exchange only: rank 0 publishes the
// address of the job's own store, the other ranks read it.
//
//   CT_ASSIGN_OR_RETURN(std::unique_ptr<AgentStoreClient> agent,
//                       AgentStoreClient::Connect("node0", 29500, std::chrono::minutes(5)));
//   CT_RETURN_IF_ERROR(agent->Set("/worker/attempt_0/cpptrain/store", "10.0.0.1:41234"));
//   CT_ASSIGN_OR_RETURN(std::string value, agent->WaitAndGet("/worker/attempt_0/cpptrain/store"));
//
// Private to //sharding. Not thread-safe: one caller at a time.
#ifndef CPPTRAIN_SHARDING_INTERNAL_AGENT_STORE_CLIENT_H_
#define CPPTRAIN_SHARDING_INTERNAL_AGENT_STORE_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cpptrain {
namespace sharding_internal {

// The query types and the magic number of PyTorch 2.x's TCPStore protocol that this client
// sends (c10d/TCPStoreBackend.hpp numbers them from VALIDATE = 0).
enum class AgentQuery : uint8_t { kValidate = 0, kSet = 1, kGet = 3, kWait = 6 };
inline constexpr uint32_t kAgentStoreMagic = 0x3C85F7CE;
// The reply to a wait whose keys are all set.
inline constexpr uint8_t kAgentStopWaiting = 0;

class AgentStoreClient {
 public:
  // Connects to host:port (retrying refused connections until `timeout`) and validates the
  // connection. `timeout` also bounds every later wait for a reply. Errors name the address.
  static absl::StatusOr<std::unique_ptr<AgentStoreClient>> Connect(
      const std::string& host, int port, std::chrono::milliseconds timeout);
  ~AgentStoreClient();
  AgentStoreClient(const AgentStoreClient&) = delete;
  AgentStoreClient& operator=(const AgentStoreClient&) = delete;

  // Sets `key` to `value` (the server sends no reply).
  absl::Status Set(absl::string_view key, absl::string_view value);
  // Waits until `key` is set, at most the timeout, then reads it. DeadlineExceeded names the
  // key when nobody set it in time.
  absl::StatusOr<std::string> WaitAndGet(absl::string_view key);
  // The numeric address of this end of the connection: one the store's host reached this
  // process by, so the other ranks can too ("127.0.0.1" when the agent is on this host and
  // MASTER_ADDR is a loopback name).
  absl::StatusOr<std::string> LocalAddress() const;

 private:
  AgentStoreClient(int fd, std::string address, std::chrono::milliseconds timeout)
      : fd_(fd), address_(std::move(address)), timeout_(timeout) {}
  absl::Status Send(const std::string& bytes);
  absl::Status Receive(void* out, size_t size, absl::string_view what);

  int fd_;
  std::string address_;  // "host:port", for messages
  std::chrono::milliseconds timeout_;
};

// A request as bytes on the wire (exposed for tests): the query type, for kWait the number of
// keys as a uint64, then each string as a uint64 length and its bytes.
std::string EncodeAgentRequest(AgentQuery query, std::initializer_list<absl::string_view> strings);

}  // namespace sharding_internal
}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_INTERNAL_AGENT_STORE_CLIENT_H_
