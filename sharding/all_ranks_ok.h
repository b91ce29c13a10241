// Agreeing on the outcome of work each rank does on its own (writing its checkpoint files,
// reading its rows), so that one rank's failure ends every rank with an error that names it,
// instead of leaving the others in their next collective until ddp_timeout. A rank that fails
// keeps calling the collectives the others call, then all meet here.
//
//   absl::Status mine = WriteMyShard();             // this rank's own I/O, no collectives
//   CT_RETURN_IF_ERROR(AllRanksOk(ranks, mine));    // every rank: an error when any failed
//   // on rank 1, whose disk is full: its own error; on the others:
//   //   "rank 1 failed: cannot write '/out/shard-00001-of-00002.safetensors': the disk is full"
//
// Both functions are collective: every rank calls them, with whatever status it has.
#ifndef CPPTRAIN_SHARDING_ALL_RANKS_OK_H_
#define CPPTRAIN_SHARDING_ALL_RANKS_OK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "sharding/host_group.h"

namespace cpptrain {

// The longest message a rank passes on (longer ones are cut, marked " [...]").
inline constexpr int64_t kMaxRankFailureBytes = 2048;

struct RankFailure {
  int rank = 0;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  std::string message;
};

// Every rank's failure, in rank order and the same on every rank; empty when every `local` was
// OK. One AllGather of two numbers a rank, and a second one of the messages only when some rank
// failed. An error only when a collective fails.
absl::StatusOr<std::vector<RankFailure>> GatherFailures(HostGroup& ranks,
                                                        const absl::Status& local);

// "rank 1 failed: <its message>", or "ranks 0, 2 failed: rank 0: <message>; rank 2: <message>".
std::string DescribeFailures(const std::vector<RankFailure>& failures);

// `local` on a rank where it failed. On the others: OK when every rank succeeded, otherwise an
// error with the first failing rank's code (a full disk stays ResourceExhausted) and
// DescribeFailures as its message.
absl::Status AllRanksOk(HostGroup& ranks, const absl::Status& local);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_ALL_RANKS_OK_H_
