// A logical grid of ranks with one communicator per dimension, e.g. 2-D [replicate, shard]
// for HSDP: rank = r * shard + s (row-major). Along each dimension, this rank's group is the
// ranks that differ from it only in that coordinate.
//
//   CommunicatorFactory gloo = [](auto store, int rank, int size)
//       -> absl::StatusOr<std::unique_ptr<Communicator>> {
//     return GlooCommunicator::Create(store, rank, size, std::chrono::seconds(60));
//   };
//   CT_ASSIGN_OR_RETURN(auto mesh, DeviceMesh::Create(store, rank, world, {2, 4}, gloo));
//   mesh->comm(1).ReduceScatter(...);   // within this replica's 4 shards
//   mesh->comm(0).AllReduce(...);       // across the 2 replicas of this shard
#ifndef CPPTRAIN_SHARDING_DEVICE_MESH_H_
#define CPPTRAIN_SHARDING_DEVICE_MESH_H_

#include <functional>
#include <memory>
#include <vector>

#include <c10/util/intrusive_ptr.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "absl/status/statusor.h"
#include "sharding/communicator.h"

namespace cpptrain {

// Creates the communicator of one group; `group_store` holds that group's keys only.
using CommunicatorFactory = std::function<absl::StatusOr<std::unique_ptr<Communicator>>(
    c10::intrusive_ptr<c10d::Store> group_store, int group_rank, int group_size)>;

class DeviceMesh {
 public:
  // Builds this rank's communicator for every dimension, in dimension order (every rank must
  // call Create with the same shape; blocks until each group has joined). Each group gets a
  // PrefixStore unique to the mesh, the dimension and the group; meshes created one after
  // another on the same store each get their own keys. Errors: an empty shape, a size < 1,
  // rank outside [0, product of shape), product of shape != world_size.
  static absl::StatusOr<std::unique_ptr<DeviceMesh>> Create(c10::intrusive_ptr<c10d::Store> store,
                                                            int rank, int world_size,
                                                            std::vector<int> shape,
                                                            const CommunicatorFactory& factory);
  // The world is the product of `shape` (only rank outside it is detected here; prefer the
  // overload above, which also catches a shape that does not cover the launched world).
  static absl::StatusOr<std::unique_ptr<DeviceMesh>> Create(c10::intrusive_ptr<c10d::Store> store,
                                                            int rank, std::vector<int> shape,
                                                            const CommunicatorFactory& factory);

  int ndim() const { return static_cast<int>(shape_.size()); }
  int size(int dim) const { return shape_.at(dim); }
  const std::vector<int>& shape() const { return shape_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

  // Row-major: the last dimension varies fastest. CHECK-fails outside the mesh.
  std::vector<int> Coordinates(int rank) const;
  int RankAt(const std::vector<int>& coordinates) const;

  // This rank's group along `dim`: its communicator, and the group's global ranks in group
  // rank order (group rank = this rank's coordinate along `dim`).
  Communicator& comm(int dim) const { return *comms_.at(dim); }
  std::vector<int> GroupRanks(int dim) const;

 private:
  DeviceMesh(int rank, std::vector<int> shape);

  int rank_;
  int world_size_;
  std::vector<int> shape_;
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_DEVICE_MESH_H_
