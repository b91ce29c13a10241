#include "tools/kernel_profile.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/types.h>

namespace cpptrain {
namespace {

TEST(KernelProfileTest, FamiliesByKernelName) {
  EXPECT_EQ(KernelProfile::Family("nvjet_tst_192x192_64x4_1x2_h_bz_coopA_TNN"), "matmul");
  EXPECT_EQ(KernelProfile::Family("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64"),
            "matmul");
  EXPECT_EQ(KernelProfile::Family("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits"),
            "attention");
  EXPECT_EQ(KernelProfile::Family("void at::native::(anonymous namespace)::cunn_SoftMaxForward"),
            "cross-entropy/softmax");
  EXPECT_EQ(KernelProfile::Family("void at::native::elementwise_kernel<128, 2, "
                                  "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"),
            "cast/copy");
  EXPECT_EQ(KernelProfile::Family("void at::native::reduce_kernel<512, 1, at::native::ReduceOp"),
            "norm/reduction");
  EXPECT_EQ(KernelProfile::Family("void at::native::vectorized_elementwise_kernel<4, "
                                  "at::native::silu_kernel"),
            "elementwise");
  EXPECT_EQ(KernelProfile::Family("void at::native::(anonymous namespace)::multi_tensor_apply_"
                                  "kernel<FusedAdamMathFunctor>"),
            "optimizer");
  EXPECT_EQ(KernelProfile::Family("void cpptrain::kernels::(anonymous namespace)::"
                                  "RmsNormForwardKernel<float, float, __nv_bfloat16>"),
            "fused (kernels/)");
  EXPECT_EQ(KernelProfile::Family("Memcpy HtoD (Pinned -> Device)"), "memcpy/memset");
  EXPECT_EQ(KernelProfile::Family("void at::native::elementwise_kernel<128, 2, "
                                  "at::native::gpu_kernel_impl_nocast<at::native::CUDAFunctor_add"
                                  "<float> >"),
            "add");
  EXPECT_EQ(KernelProfile::Family("something_else"), "other");
}

// Kernels are credited to the op they link to, labelled with the backward node whose
// evaluation encloses that op on the same thread; families come largest first.
TEST(KernelProfileTest, LaunchReportNamesTheOpAndTheBackwardNode) {
  using Op = KernelProfile::HostOp;
  using Kernel = KernelProfile::DeviceKernel;
  const std::string node = "autograd::engine::evaluate_function: ";
  const std::vector<Op> ops = {
      {1, 7, 100, 200, "aten::add"},                                   // forward
      {2, 7, 1000, 2000, node + "MulBackward0"},                       // a node...
      {3, 7, 1100, 1200, "aten::mul"},                                 // ...and its op
      {4, 8, 1100, 1200, "aten::add_"},                                // another thread
      {5, 7, 3000, 4000, node + "torch::autograd::CppNode<a::(anonymous namespace)::Loss>"},
      // The node's own record inside its evaluation, as the engine writes it.
      {6, 7, 3010, 3990, "torch::autograd::CppNode<a::(anonymous namespace)::Loss>"},
      // A reentrant backward (checkpointing) nests a node inside another's evaluation.
      {7, 7, 3100, 3500, node + "AddBackward0"},
      {8, 7, 3200, 3300, "aten::add"},
  };
  const std::string add = "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add";
  const std::string mul = "void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>";
  const std::string loss = "void cpptrain::kernels::LossKernel";
  const std::vector<Kernel> kernels = {
      {1, 2e6, add},   {1, 2e6, add},  {3, 1e6, mul},   {4, 1e6, add},
      {5, 4e6, loss},  {6, 4e6, loss},  {0, 1e6, mul}, {99, 1e6, mul}, {8, 2e6, add},
  };
  const std::string report = KernelProfile::LaunchReport(kernels, ops, /*steps=*/2);
  EXPECT_NE(report.find("by op | add | aten::add | 2.00 | 1.0 |"), std::string::npos) << report;
  EXPECT_NE(report.find("by op | add | aten::add_ | 0.50 | 0.5 |"), std::string::npos) << report;
  EXPECT_NE(report.find("by op | elementwise | aten::mul in MulBackward0 | 0.50 |"),
            std::string::npos)
      << report;
  // Launched from the node's evaluation or from its own record: both are "in Loss".
  EXPECT_NE(report.find("by op | fused (kernels/) | in Loss | 4.00 | 1.0 |"), std::string::npos)
      << report;
  // The innermost node encloses an op of a reentrant backward.
  EXPECT_NE(report.find("by op | add | aten::add in AddBackward0 | 1.00 | 0.5 |"),
            std::string::npos)
      << report;
  // Unlinked kernels and links to no recorded op are counted together, not dropped.
  EXPECT_NE(report.find("by op | elementwise | (no launching op: a kernels/ launch outside any "
                        "op, or a replayed CUDA graph) | 1.00 | 1.0 |"),
            std::string::npos)
      << report;
  EXPECT_LT(report.find("by op | fused (kernels/) |"), report.find("by op | add |")) << report;
  EXPECT_LT(report.find("by op | add |"), report.find("by op | elementwise |")) << report;
}

// Without CUDA there are no kernels: the profiler still starts and stops, and says so.
TEST(KernelProfileTest, AWindowWithoutCudaKernelsSaysSo) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "this machine has a GPU: kernels are recorded";
  KernelProfile profile;
  profile.Start();
  (torch::randn({64, 64}).matmul(torch::randn({64, 64}))).sum().item<float>();
  EXPECT_NE(profile.StopAndFormat(1).find("SKIPPED: no CUDA kernels"), std::string::npos);
}

TEST(KernelProfileTest, RecordsCudaKernelsByFamily) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no GPU here: kernels need CUDA";
  const at::Tensor a = torch::randn({512, 512}, torch::kCUDA);
  KernelProfile profile;
  torch::cuda::synchronize();
  profile.Start();
  (a.matmul(a) + 1).sum().item<float>();
  torch::cuda::synchronize();
  const std::string table = profile.StopAndFormat(1);
  EXPECT_NE(table.find("| matmul |"), std::string::npos) << table;
  EXPECT_NE(table.find("device busy"), std::string::npos) << table;
  EXPECT_NE(table.find("longest idle gaps"), std::string::npos) << table;
  // The matmul kernel is credited to the op that launched it.
  EXPECT_NE(table.find("by op | matmul | aten::mm |"), std::string::npos) << table;
}

}  // namespace
}  // namespace cpptrain
