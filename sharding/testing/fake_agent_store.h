// A stand-in for the TCPStore torchrun 2.x's agent hosts, for tests: it serves the part of
// PyTorch 2.x's protocol sharding/internal/agent_store_client.h speaks (VALIDATE first, as the
// real server requires, then SET, WAIT and GET), one thread per connection. The real agent is
// met in tests/distributed/torchrun_test.sh.
//
//   testing_fakes::FakeAgentStore agent;              // listens on a free loopback port
//   env.master_port = agent.port();
//   env.use_agent_store = true;
//   ... ConnectStore(env, timeout) ...
//   EXPECT_EQ(agent.Value("/worker/attempt_0/cpptrain/run/store"), "127.0.0.1:41234");
#ifndef CPPTRAIN_SHARDING_TESTING_FAKE_AGENT_STORE_H_
#define CPPTRAIN_SHARDING_TESTING_FAKE_AGENT_STORE_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace cpptrain {
namespace testing_fakes {

class FakeAgentStore {
 public:
  FakeAgentStore();
  ~FakeAgentStore();
  int port() const { return port_; }
  // How many connections opened with VALIDATE and the right magic number.
  int validated() const { return validated_; }
  // The value of `key`, "" when unset.
  std::string Value(const std::string& key);

 private:
  void Accept();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> validated_{0};
  std::thread acceptor_;
  std::vector<int> fds_;
  std::vector<std::thread> connections_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
  bool stopped_ = false;
};

}  // namespace testing_fakes
}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_TESTING_FAKE_AGENT_STORE_H_
