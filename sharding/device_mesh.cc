#include "sharding/device_mesh.h"

#include <utility>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"

namespace cpptrain {
namespace {

// Meshes are numbered per rank in creation order through the store itself, so every rank
// agrees on the number as long as all ranks create their meshes in the same order, whether
// ranks are processes or threads and however many store objects point at one server.
absl::StatusOr<int64_t> NextMeshId(c10d::Store& store, int rank) {
  return CatchTorch(
      [&] { return store.add(absl::StrCat("cpptrain/device_mesh/count/rank", rank), 1); });
}

}  // namespace

DeviceMesh::DeviceMesh(int rank, std::vector<int> shape)
    : rank_(rank), world_size_(1), shape_(std::move(shape)) {
  for (int n : shape_) world_size_ *= n;
}

absl::StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, std::vector<int> shape,
    const CommunicatorFactory& factory) {
  int64_t product = 1;
  for (int n : shape) product *= n;
  return Create(std::move(store), rank, static_cast<int>(product), std::move(shape), factory);
}

absl::StatusOr<std::unique_ptr<DeviceMesh>> DeviceMesh::Create(
    c10::intrusive_ptr<c10d::Store> store, int rank, int world_size, std::vector<int> shape,
    const CommunicatorFactory& factory) {
  const std::string shape_str = absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  if (!store) return absl::InvalidArgumentError("DeviceMesh::Create: store is null");
  if (!factory) return absl::InvalidArgumentError("DeviceMesh::Create: factory is empty");
  if (shape.empty()) {
    return absl::InvalidArgumentError("DeviceMesh::Create: shape is empty; give e.g. {world}");
  }
  int64_t product = 1;
  for (int n : shape) {
    if (n < 1) {
      return absl::InvalidArgumentError(absl::StrCat("DeviceMesh::Create: shape ", shape_str,
                                                     " has a dimension of size ", n,
                                                     "; every size must be at least 1"));
    }
    product *= n;
  }
  if (product != world_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "DeviceMesh::Create: shape ", shape_str, " holds ", product, " ranks but the world has ",
        world_size, "; the product of the shape must equal it"));
  }
  if (rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("DeviceMesh::Create: rank ", rank,
                                                   " is outside the mesh ", shape_str, " of ",
                                                   world_size, " ranks"));
  }
  std::unique_ptr<DeviceMesh> mesh(new DeviceMesh(rank, std::move(shape)));
  CT_ASSIGN_OR_RETURN(int64_t mesh_id, NextMeshId(*store, rank));
  const std::vector<int> coords = mesh->Coordinates(rank);
  for (int dim = 0; dim < mesh->ndim(); ++dim) {
    // The group is named by this rank's coordinates with the one along `dim` left out.
    std::vector<std::string> others;
    for (int d = 0; d < mesh->ndim(); ++d) {
      others.push_back(d == dim ? "*" : std::to_string(coords[d]));
    }
    const std::string prefix = absl::StrCat("cpptrain/device_mesh/", mesh_id, "/dim", dim,
                                            "/group_", absl::StrJoin(others, "_"));
    auto group_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store);
    absl::StatusOr<std::unique_ptr<Communicator>> comm =
        factory(group_store, coords[dim], mesh->size(dim));
    if (!comm.ok()) {
      return absl::Status(comm.status().code(),
                          absl::StrCat("DeviceMesh::Create: rank ", rank, " of mesh ", shape_str,
                                       " could not create the communicator of dim ", dim,
                                       " (ranks [", absl::StrJoin(mesh->GroupRanks(dim), ", "),
                                       "]): ", comm.status().message()));
    }
    if (*comm == nullptr || (*comm)->size() != mesh->size(dim) || (*comm)->rank() != coords[dim]) {
      return absl::InternalError(absl::StrCat(
          "DeviceMesh::Create: the factory returned a communicator that is null or has the "
          "wrong rank/size for dim ",
          dim, " (want rank ", coords[dim], " of ", mesh->size(dim), ")"));
    }
    mesh->comms_.push_back(*std::move(comm));
  }
  VLOG(1) << "DeviceMesh " << mesh_id << " " << shape_str << ": rank " << rank << " at ["
          << absl::StrJoin(coords, ", ") << "]";
  return mesh;
}

std::vector<int> DeviceMesh::Coordinates(int rank) const {
  CHECK(rank >= 0 && rank < world_size_)
      << "rank " << rank << " is outside the mesh of " << world_size_ << " ranks";
  std::vector<int> coords(shape_.size());
  for (int d = ndim() - 1; d >= 0; --d) {
    coords[d] = rank % shape_[d];
    rank /= shape_[d];
  }
  return coords;
}

int DeviceMesh::RankAt(const std::vector<int>& coordinates) const {
  CHECK_EQ(coordinates.size(), shape_.size()) << "coordinates need one entry per dimension";
  int rank = 0;
  for (int d = 0; d < ndim(); ++d) {
    CHECK(coordinates[d] >= 0 && coordinates[d] < shape_[d])
        << "coordinate " << coordinates[d] << " of dim " << d << " is outside [0, " << shape_[d]
        << ")";
    rank = rank * shape_[d] + coordinates[d];
  }
  return rank;
}

std::vector<int> DeviceMesh::GroupRanks(int dim) const {
  CHECK(dim >= 0 && dim < ndim()) << "dim " << dim << " is outside [0, " << ndim() << ")";
  std::vector<int> coords = Coordinates(rank_);
  std::vector<int> ranks;
  for (int i = 0; i < shape_[dim]; ++i) {
    coords[dim] = i;
    ranks.push_back(RankAt(coords));
  }
  return ranks;
}

}  // namespace cpptrain
