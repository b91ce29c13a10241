// The client against sharding/testing/fake_agent_store.h, a small server written from the
// protocol's description. The real thing, torchrun 2.x's agent, is met in
// tests/distributed/torchrun_test.sh.
#include "sharding/internal/agent_store_client.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "sharding/testing/fake_agent_store.h"

namespace cpptrain {
namespace sharding_internal {
namespace {

using testing_fakes::FakeAgentStore;

TEST(AgentStoreClientTest, EncodesRequestsAsPyTorch2DoesOnTheWire) {
  const std::string set = EncodeAgentRequest(AgentQuery::kSet, {"ab", "xyz"});
  const std::string want_set("\x01\x02\0\0\0\0\0\0\0ab\x03\0\0\0\0\0\0\0xyz", 1 + 8 + 2 + 8 + 3);
  EXPECT_EQ(set, want_set);
  const std::string wait = EncodeAgentRequest(AgentQuery::kWait, {"k"});
  const std::string want_wait("\x06\x01\0\0\0\0\0\0\0\x01\0\0\0\0\0\0\0k", 1 + 8 + 8 + 1);
  EXPECT_EQ(wait, want_wait);
}

TEST(AgentStoreClientTest, OneRankSetsTheOtherWaitsAndReads) {
  FakeAgentStore server;
  auto reader = AgentStoreClient::Connect("127.0.0.1", server.port(), std::chrono::seconds(10));
  ASSERT_TRUE(reader.ok()) << reader.status();
  absl::StatusOr<std::string> got;
  // The reader may ask before or after the writer sets: either way the wait ends with the value.
  std::thread waiter([&] { got = (*reader)->WaitAndGet("/worker/attempt_0/cpptrain/r/store"); });
  auto writer = AgentStoreClient::Connect("localhost", server.port(), std::chrono::seconds(10));
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Set("/worker/attempt_0/cpptrain/r/store", "127.0.0.1:4567").ok());
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "127.0.0.1:4567");
  EXPECT_EQ(server.validated(), 2);
  absl::StatusOr<std::string> local = (*writer)->LocalAddress();
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(*local, "127.0.0.1");
}

TEST(AgentStoreClientTest, AKeyNobodySetsEndsAtTheTimeoutNamingIt) {
  FakeAgentStore server;
  auto client =
      AgentStoreClient::Connect("127.0.0.1", server.port(), std::chrono::milliseconds(300));
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<std::string> got = (*client)->WaitAndGet("never");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("key \"never\""), std::string::npos) << got.status();
  EXPECT_NE(got.status().message().find("300 ms"), std::string::npos) << got.status();
}

TEST(AgentStoreClientTest, NoStoreAtTheAddressSaysWhere) {
  int port = 0;
  {
    FakeAgentStore closed;  // a port that was free a moment ago and is closed now
    port = closed.port();
  }
  auto client = AgentStoreClient::Connect("127.0.0.1", port, std::chrono::milliseconds(300));
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("agent store at 127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << client.status();
  EXPECT_NE(client.status().message().find("TORCHELASTIC_USE_AGENT_STORE"), std::string::npos);
}

}  // namespace
}  // namespace sharding_internal
}  // namespace cpptrain
