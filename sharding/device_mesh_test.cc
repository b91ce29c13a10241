#include "sharding/device_mesh.h"

#include <chrono>
#include <set>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "absl/strings/str_cat.h"
#include "base/status.h"
#include "sharding/gloo_communicator.h"
#include "sharding/testing/multi_rank.h"

namespace cpptrain {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

CommunicatorFactory GlooFactory() {
  return [](StorePtr store, int rank, int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    CT_ASSIGN_OR_RETURN(auto comm,
                        GlooCommunicator::Create(store, rank, size, std::chrono::seconds(60)));
    return std::unique_ptr<Communicator>(std::move(comm));
  };
}

// A communicator that only knows its place; for mesh bookkeeping without a network.
class PlaceOnlyCommunicator : public Communicator {
 public:
  PlaceOnlyCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "none"; }
  absl::StatusOr<std::unique_ptr<Work>> AllReduce(at::Tensor&, ReduceOp) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> AllGather(const at::Tensor&, at::Tensor&) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatter(const at::Tensor&, at::Tensor&,
                                                      ReduceOp) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> Broadcast(at::Tensor&, int) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> Scatter(const at::Tensor&, at::Tensor&, int) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> AllReduceCoalesced(std::vector<at::Tensor>&,
                                                           ReduceOp) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> AllGatherCoalesced(const std::vector<at::Tensor>&,
                                                           std::vector<at::Tensor>&) override {
    return Unsupported();
  }
  absl::StatusOr<std::unique_ptr<Work>> ReduceScatterCoalesced(const std::vector<at::Tensor>&,
                                                               std::vector<at::Tensor>&,
                                                               ReduceOp) override {
    return Unsupported();
  }
  absl::Status Barrier() override { return absl::UnimplementedError("place only"); }

 private:
  static absl::Status Unsupported() { return absl::UnimplementedError("place only"); }
  int rank_;
  int size_;
};

// Records the group stores it was handed, to check their keys do not collide.
CommunicatorFactory PlaceOnlyFactory(std::vector<StorePtr>* stores = nullptr) {
  return [stores](StorePtr store, int rank,
                  int size) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    if (stores != nullptr) stores->push_back(store);
    return std::unique_ptr<Communicator>(new PlaceOnlyCommunicator(rank, size));
  };
}

absl::StatusOr<double> AllReduceSum(Communicator& comm, double value) {
  at::Tensor t = at::full({3}, value, at::kDouble);
  CT_ASSIGN_OR_RETURN(auto work, comm.AllReduce(t, ReduceOp::kSum));
  CT_RETURN_IF_ERROR(work->Wait());
  if (!at::equal(t, at::full({3}, t[0].item<double>(), at::kDouble))) {
    return absl::InternalError("elements differ after AllReduce");
  }
  return t[0].item<double>();
}

TEST(DeviceMeshTest, OneDimensionalOverFourRanks) {
  absl::Status s = multi_rank::RunRanksAsThreads(4, [](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto mesh, DeviceMesh::Create(store, rank, 4, {4}, GlooFactory()));
    EXPECT_EQ(mesh->ndim(), 1);
    EXPECT_EQ(mesh->size(0), 4);
    EXPECT_EQ(mesh->rank(), rank);
    EXPECT_EQ(mesh->world_size(), 4);
    EXPECT_THAT(mesh->Coordinates(rank), ElementsAre(rank));
    EXPECT_THAT(mesh->GroupRanks(0), ElementsAre(0, 1, 2, 3));
    EXPECT_EQ(mesh->comm(0).rank(), rank);
    EXPECT_EQ(mesh->comm(0).size(), 4);
    CT_ASSIGN_OR_RETURN(double sum, AllReduceSum(mesh->comm(0), rank + 1));
    EXPECT_EQ(sum, 10);  // 4 * 5 / 2
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

// Each rank contributes rank + 1 = r * S + s + 1. Along dim 0 (the S-th column, r varies) the
// sum is S * R (R - 1) / 2 + R (s + 1); along dim 1 (row r, s varies) it is
// S (r S + 1) + S (S - 1) / 2.
void CheckTwoDimensional(int replicas, int shards) {
  const int world = replicas * shards;
  absl::Status s =
      multi_rank::RunRanksAsThreads(world, [&](int rank, StorePtr store) -> absl::Status {
        CT_ASSIGN_OR_RETURN(
            auto mesh, DeviceMesh::Create(store, rank, world, {replicas, shards}, GlooFactory()));
        const int r = rank / shards;
        const int sh = rank % shards;
        EXPECT_THAT(mesh->Coordinates(rank), ElementsAre(r, sh));
        EXPECT_EQ(mesh->RankAt({r, sh}), rank);
        std::vector<int> column, row;
        for (int i = 0; i < replicas; ++i) column.push_back(i * shards + sh);
        for (int j = 0; j < shards; ++j) row.push_back(r * shards + j);
        EXPECT_EQ(mesh->GroupRanks(0), column);
        EXPECT_EQ(mesh->GroupRanks(1), row);
        EXPECT_EQ(mesh->comm(0).rank(), r);
        EXPECT_EQ(mesh->comm(0).size(), replicas);
        EXPECT_EQ(mesh->comm(1).rank(), sh);
        EXPECT_EQ(mesh->comm(1).size(), shards);

        CT_ASSIGN_OR_RETURN(double along0, AllReduceSum(mesh->comm(0), rank + 1));
        EXPECT_EQ(along0, shards * replicas * (replicas - 1) / 2.0 + replicas * (sh + 1.0))
            << "rank " << rank;
        CT_ASSIGN_OR_RETURN(double along1, AllReduceSum(mesh->comm(1), rank + 1));
        EXPECT_EQ(along1, shards * (r * shards + 1.0) + shards * (shards - 1) / 2.0)
            << "rank " << rank;
        return absl::OkStatus();
      });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(DeviceMeshTest, TwoByTwo) { CheckTwoDimensional(2, 2); }

TEST(DeviceMeshTest, ThreeReplicasOfTwoShards) { CheckTwoDimensional(3, 2); }

TEST(DeviceMeshTest, SecondMeshOnTheSameStoreGetsItsOwnKeys) {
  absl::Status s = multi_rank::RunRanksAsThreads(2, [](int rank, StorePtr store) -> absl::Status {
    CT_ASSIGN_OR_RETURN(auto first, DeviceMesh::Create(store, rank, 2, {2}, GlooFactory()));
    CT_ASSIGN_OR_RETURN(auto second, DeviceMesh::Create(store, rank, 2, {2}, GlooFactory()));
    CT_ASSIGN_OR_RETURN(double a, AllReduceSum(second->comm(0), rank + 1));
    CT_ASSIGN_OR_RETURN(double b, AllReduceSum(first->comm(0), 10 * (rank + 1)));
    EXPECT_EQ(a, 3);
    EXPECT_EQ(b, 30);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
}

TEST(DeviceMeshTest, CoordinatesRoundTrip) {
  for (const std::vector<int>& shape :
       {std::vector<int>{5}, std::vector<int>{3, 4}, std::vector<int>{4, 1}}) {
    int world = 1;
    for (int n : shape) world *= n;
    StorePtr store = c10::make_intrusive<c10d::HashStore>();
    absl::StatusOr<std::unique_ptr<DeviceMesh>> mesh =
        DeviceMesh::Create(store, world - 1, world, shape, PlaceOnlyFactory());
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    std::set<std::vector<int>> seen;
    for (int rank = 0; rank < world; ++rank) {
      const std::vector<int> coords = (*mesh)->Coordinates(rank);
      EXPECT_EQ((*mesh)->RankAt(coords), rank);
      seen.insert(coords);
      // Row-major: the last coordinate varies fastest.
      EXPECT_EQ(coords.back(), rank % shape.back());
    }
    EXPECT_EQ(static_cast<int>(seen.size()), world);
  }
}

TEST(DeviceMeshTest, GroupStoresAreDistinctPerDimensionGroupAndMesh) {
  std::vector<StorePtr> stores;
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  for (int rank : {0, 3}) {
    for (int repeat = 0; repeat < 2; ++repeat) {
      ASSERT_TRUE(DeviceMesh::Create(store, rank, 4, {2, 2}, PlaceOnlyFactory(&stores)).ok());
    }
  }
  // Ranks 0 and 3 share no group; each mesh has 2 groups per rank: 8 stores. A key written
  // through each must land under a distinct name.
  ASSERT_EQ(stores.size(), 8u);
  for (size_t i = 0; i < stores.size(); ++i) stores[i]->add("k", 1);
  for (size_t i = 0; i < stores.size(); ++i) EXPECT_EQ(stores[i]->add("k", 0), 1) << i;
}

TEST(DeviceMeshTest, ShapeErrors) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  const auto error = [&](int rank, int world, std::vector<int> shape) {
    return std::string(
        DeviceMesh::Create(store, rank, world, shape, PlaceOnlyFactory()).status().message());
  };
  EXPECT_THAT(error(0, 4, {2, 3}), HasSubstr("shape [2, 3] holds 6 ranks but the world has 4"));
  EXPECT_THAT(error(0, 4, {}), HasSubstr("shape is empty"));
  EXPECT_THAT(error(0, 4, {4, 0}), HasSubstr("size 0"));
  EXPECT_THAT(error(4, 4, {2, 2}), HasSubstr("rank 4 is outside the mesh [2, 2] of 4 ranks"));
  EXPECT_THAT(
      std::string(DeviceMesh::Create(store, 4, {2, 2}, PlaceOnlyFactory()).status().message()),
      HasSubstr("rank 4 is outside"));
}

TEST(DeviceMeshTest, FactoryErrorNamesTheGroup) {
  StorePtr store = c10::make_intrusive<c10d::HashStore>();
  CommunicatorFactory failing = [](StorePtr, int,
                                   int) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    return absl::UnavailableError("no network");
  };
  absl::StatusOr<std::unique_ptr<DeviceMesh>> mesh =
      DeviceMesh::Create(store, 3, 4, {2, 2}, failing);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(mesh.status().message()),
              HasSubstr("communicator of dim 0 (ranks [1, 3]): no network"));
}

}  // namespace
}  // namespace cpptrain
