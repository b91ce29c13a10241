// AdamW with Hugging Face's two parameter groups: weight decay for matrices, none for biases
// and normalization weights (matched by name, like get_decay_parameter_names).
//
//   OptimizerFactory factory = MakeAdamWFactory(args);
//   CT_RETURN_IF_ERROR(engine->PrepareForTraining(model, factory));
//   SetLearningRate(*engine->optimizer(), 1e-4);
#ifndef CPPTRAIN_TRAINER_OPTIMIZER_H_
#define CPPTRAIN_TRAINER_OPTIMIZER_H_

#include <string>

#include "engines/engine.h"
#include "proto/training_args.pb.h"

namespace cpptrain {

// True for names containing "bias", "layernorm" or "rmsnorm", a path component "norm", or a
// component ending in "_norm" (model.norm.weight, self_attn.q_norm.weight, ...).
bool ExcludedFromWeightDecay(const std::string& parameter_name);

// AdamW (learning_rate, adam_beta1/2, adam_epsilon, weight_decay) over the parameters it is
// given; group 0 decays, group 1 does not. Empty groups are left out.
OptimizerFactory MakeAdamWFactory(const proto::TrainingArguments& args);

// Sets the learning rate of every parameter group of an Adam, AdamW or SGD optimizer.
void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_OPTIMIZER_H_
