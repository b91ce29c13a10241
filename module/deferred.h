// Deferred parameters keep their shape and dtype but hold no memory (their storage is empty):
// a model built that way costs nothing until a sharding engine gives each rank its chunks, or a
// loader allocates each tensor as it reads it. Anything else must refuse such a model
// (FirstDeferredParameter): reading a deferred tensor reads no memory.
//
//   DeferParameters(*module);                        // after building it
//   if (IsDeferred(param)) ...                       // FullyShard allocates and fills its rows
//   std::string name = FirstDeferredParameter(*model);   // "" when none
#ifndef CPPTRAIN_MODULE_DEFERRED_H_
#define CPPTRAIN_MODULE_DEFERRED_H_

#include <string>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

namespace cpptrain {

// Releases the memory of every parameter of `module` (recursively), keeping the tensors.
void DeferParameters(torch::nn::Module& module);

// A parameter with elements and no memory behind them.
bool IsDeferred(const at::Tensor& param);

// The name of `module`'s first deferred parameter, or "" when there is none.
std::string FirstDeferredParameter(const torch::nn::Module& module);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODULE_DEFERRED_H_
