#include "tests/sharding/shard_test_setup.h"

#include <torch/utils.h>

#include <utility>

#include "base/status.h"
#include "models/configs.h"
#include "sharding/gloo_communicator.h"

namespace cpptrain {
namespace shard_test {

std::shared_ptr<DecoderLM> Decoder(int layers) {
  proto::DecoderConfig config = *NamedDecoderConfig("tiny");
  config.set_num_hidden_layers(layers);
  return *BuildDecoder(config);
}

std::vector<std::shared_ptr<DecoderLM>> Replicas(int world, int layers) {
  std::vector<std::shared_ptr<DecoderLM>> out;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(3);
    out.push_back(Decoder(layers));
  }
  return out;
}

absl::StatusOr<ShardMesh> Mesh(int rank, int world, c10::intrusive_ptr<c10d::Store> store) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm,
                      GlooCommunicator::Create(store, rank, world, kTimeout));
  return ShardMesh{std::shared_ptr<Communicator>(std::move(comm)), nullptr};
}

}  // namespace shard_test
}  // namespace cpptrain
