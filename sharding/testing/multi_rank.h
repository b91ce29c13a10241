// Test helpers that run one body per rank: as threads of this process sharing a HashStore
// (the default for multi-rank tests), or as forked processes sharing a FileStore under
// TEST_TMPDIR (to prove something works across address spaces, or to kill a rank).
//
//   absl::Status s = multi_rank::RunRanksAsThreads(3, [](int rank, auto store) -> absl::Status {
//     CT_ASSIGN_OR_RETURN(auto comm, GlooCommunicator::Create(store, rank, 3, kTimeout));
//     ...
//     return absl::OkStatus();
//   });
//   EXPECT_TRUE(s.ok()) << s;
#ifndef CPPTRAIN_SHARDING_TESTING_MULTI_RANK_H_
#define CPPTRAIN_SHARDING_TESTING_MULTI_RANK_H_

#include <chrono>
#include <functional>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/status.h"

namespace cpptrain {
namespace multi_rank {

using RankBody = std::function<absl::Status(int rank, c10::intrusive_ptr<c10d::Store> store)>;

// OK, or an InternalError saying `what`: a rank body's check of a condition.
inline absl::Status Check(bool condition, const std::string& what) {
  return condition ? absl::OkStatus() : absl::InternalError(what);
}

// Runs `body` for ranks 0..world_size-1 on one thread each, all given the same fresh
// HashStore; joins them all. Returns OK or the errors of the failed ranks, each prefixed by
// its rank. gtest assertions inside `body` work (EXPECT_*; ASSERT_* only leaves that rank).
absl::Status RunRanksAsThreads(int world_size, const RankBody& body);

// Forks world_size processes; each builds a FileStore on one fresh file under TEST_TMPDIR
// (else /tmp), runs `body`, and _exits with 0 when it returned OK. In the child, report
// failures through the returned status, not gtest (its results stay in the child). Fork before
// this process starts threads (call it before any other LibTorch work in the test binary).
// Waits for every child at most `deadline`, then SIGKILLs the rest. Returns OK when all
// exited 0, else one line per failed rank (its exit code or signal, and its status message).
absl::Status RunRanksAsProcesses(int world_size, const RankBody& body,
                                 std::chrono::seconds deadline);

}  // namespace multi_rank
}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_TESTING_MULTI_RANK_H_
