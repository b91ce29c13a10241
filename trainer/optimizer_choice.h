// TrainingArguments.optim, Hugging Face's optimizer names, mapped to an OptimizerFactory.
// Every choice builds Hugging Face's two parameter groups (weight_decay for matrices, none
// for biases and norms: ExcludedFromWeightDecay in trainer/optimizer.h).
//
//   CT_ASSIGN_OR_RETURN(OptimizerFactory factory, MakeOptimizerFactory(args));
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
#ifndef CPPTRAIN_TRAINER_OPTIMIZER_CHOICE_H_
#define CPPTRAIN_TRAINER_OPTIMIZER_CHOICE_H_

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "proto/training_args.pb.h"

namespace cpptrain {

// The optim values (config/training_args.h's SupportedOptimizers lists them, the default
// first):
//   adamw_torch_fused  FusedAdamW: one fused kernel per group on CUDA (LibTorch 2.x), else
//                      LibTorch's AdamW (the default, as in Hugging Face 5)
//   adamw_torch        LibTorch's per-parameter torch::optim::AdamW
//   sgd                torch::optim::SGD (learning_rate, weight_decay; no momentum, as in
//                      Hugging Face without optim_args)
// The factory for args.optim; InvalidArgument naming the value and the supported ones
// otherwise.
absl::StatusOr<OptimizerFactory> MakeOptimizerFactory(const proto::TrainingArguments& args);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_OPTIMIZER_CHOICE_H_
