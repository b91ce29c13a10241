// Which unit classes a transformer-based wrap policy wraps, from the names a user wrote in
// fsdp.transformer_layer_cls_to_wrap: the project's own class names ("DecoderLayer") or
// Hugging Face's for the loaded model's architecture ("LlamaDecoderLayer", "Qwen3DecoderLayer"),
// so a config written for transformers wraps the same layers. A name that matches nothing is
// an error rather than a model silently left in one group.
//
//   CT_ASSIGN_OR_RETURN(std::vector<std::string> classes,
//                       ResolveWrapClasses(model, {"LlamaDecoderLayer"}));   // {"DecoderLayer"}
#ifndef CPPTRAIN_SHARDING_WRAP_CLASSES_H_
#define CPPTRAIN_SHARDING_WRAP_CLASSES_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "module/trainable_model.h"

namespace cpptrain {

// The unit classes of `model` that `names` select, each once, in the order the names give
// them. A name selects a unit class when it is that class or one of the model's
// UnitClassAliases for it. The model's own (root) class is accepted and selects nothing: the
// root is always a group of its own. Empty `names`: the model's LayerUnitClasses().
// Errors: a name that is no class or alias of any unit in the model; the message lists the
// names that exist.
absl::StatusOr<std::vector<std::string>> ResolveWrapClasses(const TrainableModel& model,
                                                            const std::vector<std::string>& names);

}  // namespace cpptrain

#endif  // CPPTRAIN_SHARDING_WRAP_CLASSES_H_
