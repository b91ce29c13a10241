// What the FullyShard and FlatShard tests on the reference decoder set up alike: identical
// tiny decoders for every rank, a Gloo shard mesh per rank thread, a Check that turns a
// failed condition into a rank's error, passes of forward and backward, and the one-rank bf16
// gradient checks both layouts pass.
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
#include <functional>
#include <memory>
#include <string>
#include <utility>
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

// Passes of one backward each (the batch and parameters unchanged, so every pass's gradient
// is the same g) on one rank, the gradients zeroed first; true: synchronized.
absl::Status RunPasses(DecoderLM& model, ShardingCore& sharded, const Batch& batch,
                       const std::vector<bool>& syncs);

// Shards `model` over `mesh` (one rank) with bf16 compute and fp32 reduction, in the layout
// under test.
using ShardBf16 = std::function<absl::StatusOr<ShardingCore*>(DecoderLM& model, ShardMesh mesh)>;

// One rank, synchronized, nothing accumulated: each bf16 full gradient reaches its fp32 local
// part as autograd made it with HoldBf16Gradients (2 bytes a parameter held), else widened
// (the same values). Sums come out fp32 and exact (k g) on every path: two synchronized passes,
// an unsynchronized one then a synchronized one (the packed path), and synchronized,
// unsynchronized, synchronized (the packed sum added to a held bf16 gradient).
absl::Status ExpectOneRankHandsBf16Gradients(const ShardBf16& shard, const Batch& batch);

// A ShardBf16 from a layout's `shard(model, mesh, options)`, Options' param_dtype bf16 and its
// reduce_dtype fp32.
template <typename Options, typename Shard>
ShardBf16 WithBf16Compute(Shard shard) {
  return [shard](DecoderLM& model, ShardMesh mesh) -> absl::StatusOr<ShardingCore*> {
    Options options;
    options.param_dtype = at::kBFloat16;
    options.reduce_dtype = at::kFloat;
    auto sharded = shard(model, std::move(mesh), options);
    if (!sharded.ok()) return sharded.status();
    return *sharded;
  };
}

}  // namespace shard_test
}  // namespace cpptrain

#endif  // CPPTRAIN_TESTS_SHARDING_SHARD_TEST_SETUP_H_
