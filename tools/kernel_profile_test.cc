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
}

}  // namespace
}  // namespace cpptrain
