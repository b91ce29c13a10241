#include "sharding/agreed_buffer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/accumulate.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "base/fault_injection.h"
#include "base/torch_status.h"
#include "sharding/all_ranks_ok.h"

namespace cpptrain {
namespace {

// This rank's allocation, or why it failed (ResourceExhausted when memory ran out).
absl::StatusOr<at::Tensor> Allocate(int rank, int64_t bytes, const c10::Device& device,
                                    const std::string& purpose) {
  const std::string what = absl::StrCat("cannot allocate ", bytes, " bytes on ", device.str(),
                                        " for ", purpose, ": ");
  if (FaultInjectedOnRank(kFailAllocOnRank, rank)) {
    return absl::ResourceExhaustedError(
        absl::StrCat(what, "out of memory (", kFailAllocOnRank, " injected it)"));
  }
  try {
    return at::empty({std::max<int64_t>(bytes, 1)}, at::TensorOptions(at::kByte).device(device));
  } catch (const c10::OutOfMemoryError& e) {
    return absl::ResourceExhaustedError(absl::StrCat(what, e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(what, TorchErrorMessage(e)));
  }
}

}  // namespace

absl::StatusOr<at::Tensor> AllocateOnEveryRank(HostGroup& ranks, int64_t bytes,
                                               const c10::Device& device,
                                               const std::string& purpose) {
  absl::StatusOr<at::Tensor> mine = Allocate(ranks.rank(), bytes, device, purpose);
  const absl::Status all = AllRanksOk(ranks, mine.status());
  if (!all.ok()) return all;
  return mine;
}

at::Tensor StagingView(const at::Tensor& staging, at::IntArrayRef shape, at::ScalarType dtype) {
  const int64_t bytes =
      c10::multiply_integers(shape) * static_cast<int64_t>(c10::elementSize(dtype));
  TORCH_CHECK(staging.scalar_type() == at::kByte && staging.dim() == 1 &&
                  staging.numel() >= bytes,
              "StagingView: ", bytes, " bytes asked of a staging buffer of ", staging.numel());
  return staging.narrow(0, 0, bytes).view(dtype).view(shape);
}

}  // namespace cpptrain
