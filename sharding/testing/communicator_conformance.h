// The contract every CPU communicator keeps, as one value-parameterized gtest suite: each
// collective checked against a formula on 1 to 4 ranks (threads sharing a HashStore) in every
// reducible dtype, with sizes no world size divides, in place, strided and coalesced; argument
// errors returned before any communication; Create's checks; timeouts that name the rank.
// A backend's test instantiates it once with a factory and what the backend's errors say:
//
//   using ::cpptrain::conformance::CommunicatorConformanceTest;
//
//   conformance::CommunicatorUnderTest Store() {
//     conformance::CommunicatorUnderTest store("Store", "store", "StoreCommunicator",
//                                              conformance::FactoryOf<StoreCommunicator>());
//     store.takes_non_contiguous = true;
//     ...
//     return store;
//   }
//   INSTANTIATE_TEST_SUITE_P(Store, CommunicatorConformanceTest, ::testing::Values(Store()),
//                            conformance::TestName);
//
// The tests are defined in communicator_conformance.cc; naming the instantiation's cases with
// TestName (as above) also makes the linker keep them. What one backend alone promises (the
// store's key cleanup, Gloo's connection handling) stays in that backend's test.
#ifndef CPPTRAIN_SHARDING_TESTING_COMMUNICATOR_CONFORMANCE_H_
#define CPPTRAIN_SHARDING_TESTING_COMMUNICATOR_CONFORMANCE_H_

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>

#include <c10/util/intrusive_ptr.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "sharding/communicator.h"
#include "sharding/testing/expectations.h"

namespace cpptrain {
namespace conformance {

using CommunicatorFactory = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::chrono::milliseconds timeout)>;

// The factory of a communicator class `C` with the usual static C::Create(store, rank, size,
// timeout).
template <typename C>
CommunicatorFactory FactoryOf() {
  return [](c10::intrusive_ptr<c10d::Store> store, int rank, int size,
            std::chrono::milliseconds timeout) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    return C::Create(std::move(store), rank, size, timeout);
  };
}

// A backend under test, and the few things that differ between backends by design.
struct CommunicatorUnderTest {
  CommunicatorUnderTest(std::string name, std::string backend, std::string class_name,
                        CommunicatorFactory create)
      : name(std::move(name)),
        backend(std::move(backend)),
        class_name(std::move(class_name)),
        create(std::move(create)) {}

  std::string name;        // Names the test cases: "Gloo".
  std::string backend;     // What backend() returns: "gloo".
  std::string class_name;  // What Create's and the argument errors name: "GlooCommunicator".
  CommunicatorFactory create;
  // Takes non-contiguous tensors (it copies them); else refuses them as "not contiguous".
  bool takes_non_contiguous = false;
  // How the errors name a collective, given the method ("AllGather" -> "all-gather"); unset:
  // by the method's name.
  std::function<std::string(absl::string_view method)> op_name;
  // In rank 0's error when rank 1 of 2 never issues an all-reduce (timeout 1.5 s).
  std::string collective_timeout_error;
  // In Create's error when rank 1 of 3 waits alone (timeout 0.5 s), and its code where the
  // backend promises one.
  std::string join_timeout_error;
  std::optional<absl::StatusCode> join_timeout_code;
};

// "AllGather" -> "all-gather": an op_name for backends that name collectives so.
std::string KebabCase(absl::string_view method);

// gtest prints parameters that fail; the name is enough.
void PrintTo(const CommunicatorUnderTest& backend, std::ostream* out);

// The name of a case: the backend's name.
std::string TestName(const ::testing::TestParamInfo<CommunicatorUnderTest>& info);

class CommunicatorConformanceTest : public ::testing::TestWithParam<CommunicatorUnderTest> {
 protected:
  using Body = std::function<void(int rank, int world, Communicator& comm, Expectations& expect)>;

  // Runs `body` on `world` ranks as threads, each with its own communicator, and expects all
  // of them to succeed and meet their expectations.
  void RunRanks(int world, const Body& body, std::chrono::milliseconds timeout);
  void RunRanks(int world, const Body& body);

  // RunRanks for every world size from 1 to 4.
  void ForEachWorld(const Body& body);
};

}  // namespace conformance
}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_TESTING_COMMUNICATOR_CONFORMANCE_H_
