// NcclCommunicator on one GPU at world size 1: all-gather, broadcast and scatter move the dtypes
// NCCL has no type for (bool, int16, float8, complex) as bytes, as the Gloo communicator moves
// every dtype, and reductions refuse them naming the dtype. One rank shows what NCCL is called
// with, not traffic between GPUs: the multi-GPU suite covers that where two GPUs are lent.
// Where it cannot run, it says so as a SKIPPED case: in builds without NCCL (Bazel's CPU build;
// CMake builds it where it finds NCCL), and on a machine without a GPU.
#include <gtest/gtest.h>

#ifdef CPPTRAIN_HAS_NCCL
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/cuda.h>
#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "sharding/nccl_communicator.h"
#endif

namespace cpptrain {
namespace {

#ifndef CPPTRAIN_HAS_NCCL
TEST(NcclCommunicatorTest, NeedsABuildWithNccl) {
  GTEST_SKIP() << "this build has no NCCL (CPPTRAIN_HAS_NCCL unset): the NCCL communicator's "
               << "cases run where CMake finds NCCL, e.g. on a GPU host through "
               << "tools/gpu_baseline_check.sh TESTS=sharding_nccl_communicator_test";
}
#else

#define REQUIRE_GPU()                                                            \
  if (!torch::cuda::is_available()) {                                            \
    GTEST_SKIP() << "NcclCommunicator needs a GPU; this machine has none";       \
  }

std::unique_ptr<NcclCommunicator> OneRank() {
  auto comm = NcclCommunicator::Create(c10::make_intrusive<c10d::HashStore>(), /*rank=*/0,
                                       /*size=*/1, /*device=*/0, std::chrono::seconds(60));
  EXPECT_TRUE(comm.ok()) << comm.status();
  return comm.ok() ? *std::move(comm) : nullptr;
}

// `n` values of `dtype` on cuda:0 from random bytes (bool: 0 or 1).
at::Tensor Values(at::ScalarType dtype, int64_t n) {
  const int64_t bytes = n * static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor raw = torch::randint(0, dtype == at::kBool ? 2 : 256, {bytes},
                                  torch::TensorOptions().dtype(at::kByte).device(at::kCUDA, 0));
  return raw.view(dtype);
}

bool SameBytes(const at::Tensor& a, const at::Tensor& b) {
  return a.view(at::kByte).cpu().equal(b.view(at::kByte).cpu());
}

const std::vector<at::ScalarType> kDtypes = {at::kBool, at::kShort, at::kFloat8_e4m3fn,
                                             at::kComplexFloat, at::kFloat, at::kBFloat16};

TEST(NcclCommunicatorTest, AllGatherBroadcastAndScatterMoveEveryDtype) {
  REQUIRE_GPU();
  std::unique_ptr<NcclCommunicator> comm = OneRank();
  ASSERT_NE(comm, nullptr);
  for (at::ScalarType dtype : kDtypes) {
    SCOPED_TRACE(c10::toString(dtype));
    const at::Tensor input = Values(dtype, 37);
    at::Tensor gathered = at::empty_like(input);
    auto work = comm->AllGather(input, gathered);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE((*work)->Synchronize().ok());
    EXPECT_TRUE(SameBytes(gathered, input)) << "all-gather";

    at::Tensor broadcast = input.clone();
    work = comm->Broadcast(broadcast, /*root=*/0);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE((*work)->Synchronize().ok());
    EXPECT_TRUE(SameBytes(broadcast, input)) << "broadcast";

    at::Tensor scattered = at::empty_like(input);
    work = comm->Scatter(input, scattered, /*root=*/0);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE((*work)->Synchronize().ok());
    EXPECT_TRUE(SameBytes(scattered, input)) << "scatter";
  }
}

TEST(NcclCommunicatorTest, ReductionsRefuseDtypesNcclCannotAddNamingThem) {
  REQUIRE_GPU();
  std::unique_ptr<NcclCommunicator> comm = OneRank();
  ASSERT_NE(comm, nullptr);
  at::Tensor values = Values(at::kShort, 8);
  auto work = comm->AllReduce(values, ReduceOp::kSum);
  ASSERT_FALSE(work.ok());
  EXPECT_EQ(work.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(work.status().message()).find("Short"), std::string::npos)
      << work.status();
  at::Tensor out = at::empty({8}, values.options());
  work = comm->ReduceScatter(values, out, ReduceOp::kSum);
  ASSERT_FALSE(work.ok());
  EXPECT_NE(std::string(work.status().message()).find("convert it before reducing"),
            std::string::npos)
      << work.status();
}

#endif  // CPPTRAIN_HAS_NCCL

}  // namespace
}  // namespace cpptrain
