#include "module/deferred.h"

namespace cpptrain {

void DeferParameters(torch::nn::Module& module) {
  for (const at::Tensor& param : module.parameters(/*recurse=*/true)) {
    c10::StorageImpl* storage = param.storage().unsafeGetStorageImpl();
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, param.device()));
    storage->set_nbytes(0);
  }
}

bool IsDeferred(const at::Tensor& param) {
  return param.defined() && param.numel() > 0 && param.storage().nbytes() == 0;
}

std::string FirstDeferredParameter(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (IsDeferred(item.value())) return item.key();
  }
  return "";
}

}  // namespace cpptrain
