#include "sharding/wrap_classes.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace cpptrain {
namespace {

// Unit classes below `module`, each once, in pre-order.
void CollectUnitClasses(const torch::nn::Module& module, std::vector<std::string>* out) {
  for (const auto& child : module.children()) {
    if (const auto* unit = dynamic_cast<const Unit*>(child.get()); unit != nullptr) {
      if (std::find(out->begin(), out->end(), unit->unit_class()) == out->end()) {
        out->push_back(unit->unit_class());
      }
    }
    CollectUnitClasses(*child, out);
  }
}

std::string Describe(const TrainableModel& model, const std::vector<std::string>& classes) {
  std::vector<std::string> parts = {
      absl::StrCat(model.unit_class(), " (the model itself, always a group of its own)")};
  for (const std::string& c : classes) {
    const std::vector<std::string> aliases = model.UnitClassAliases(c);
    parts.push_back(aliases.empty() ? c
                                    : absl::StrCat(c, " (also ", absl::StrJoin(aliases, ", "),
                                                   ")"));
  }
  return absl::StrJoin(parts, "; ");
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ResolveWrapClasses(
    const TrainableModel& model, const std::vector<std::string>& names) {
  if (names.empty()) return model.LayerUnitClasses();
  std::vector<std::string> classes;
  CollectUnitClasses(model, &classes);
  std::vector<std::string> out;
  for (const std::string& name : names) {
    if (name == model.unit_class()) continue;
    auto selects = [&](const std::string& c) {
      const std::vector<std::string> aliases = model.UnitClassAliases(c);
      return name == c || std::find(aliases.begin(), aliases.end(), name) != aliases.end();
    };
    auto it = std::find_if(classes.begin(), classes.end(), selects);
    if (it == classes.end()) {
      const std::vector<std::string> layers = model.LayerUnitClasses();
      return absl::InvalidArgumentError(absl::StrCat(
          "fsdp.transformer_layer_cls_to_wrap names \"", name,
          "\", which is no module class of this model, so nothing would be wrapped under it; "
          "the classes that exist are: ",
          Describe(model, classes), ". Name one of those, or leave "
          "transformer_layer_cls_to_wrap empty to wrap the model's layers",
          layers.empty() ? "" : absl::StrCat(" (", absl::StrJoin(layers, ", "), ")")));
    }
    if (std::find(out.begin(), out.end(), *it) == out.end()) out.push_back(*it);
  }
  return out;
}

}  // namespace cpptrain
