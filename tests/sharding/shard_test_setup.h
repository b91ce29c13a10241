// What the FullyShard and FlatShard tests on the reference decoder set up alike: identical
// tiny decoders for every rank, a Gloo shard mesh per rank thread, and a Check that turns a
// failed condition into a rank's error.
//
//   auto models = shard_test::Replicas(3, /*layers=*/2);
//   multi_rank::RunRanksAsThreads(3, [&](int rank, auto store) -> absl::Status {
//     CT_ASSIGN_OR_RETURN(ShardMesh mesh, shard_test::Mesh(rank, 3, store));
//     CT_RETURN_IF_ERROR(shard_test::Check(ok, "what was expected"));
//     ...
//   });
#ifndef CPPTRAIN_TESTS_SHARDING_SHARD_TEST_SETUP_H_
#define CPPTRAIN_TESTS_SHARDING_SHARD_TEST_SETUP_H_

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "models/decoder.h"
#include "sharding/sharding_core.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace shard_test {

inline constexpr auto kTimeout = std::chrono::seconds(60);

// The "tiny" decoder with `layers` layers, initialized from the global generator.
std::shared_ptr<DecoderLM> Decoder(int layers);

// One model per rank, identical (seed 3), built before the rank threads start (the global
// generator is not for concurrent use).
std::vector<std::shared_ptr<DecoderLM>> Replicas(int world, int layers);

// A 1-D mesh over a Gloo communicator of `world` ranks on `store`.
absl::StatusOr<ShardMesh> Mesh(int rank, int world, c10::intrusive_ptr<c10d::Store> store);

using multi_rank::Check;

}  // namespace shard_test
}  // namespace cpptrain

#endif  // CPPTRAIN_TESTS_SHARDING_SHARD_TEST_SETUP_H_
