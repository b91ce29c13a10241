// The transformers.TrainingArguments names that are not fields of proto::TrainingArguments:
// each is mapped onto our fields, accepted with no effect, or refused with the reason and the
// equivalent here. Hugging Face's default value of any of them is accepted and changes nothing,
// so a config dumped from transformers loads. Config files and --set go through this table
// (LoadTrainingArguments, LoadTrainJob); unknown-field messages use it to say where a Hugging
// Face setting lives. docs/TRAINING_ARGUMENTS.md is its table over every field of the
// transformers version in config/testdata/hf_training_arguments_fields.txt.
//
//   // {"fused_kernels=true"}
//   CT_ASSIGN_OR_RETURN(std::vector<std::string> ours,
//                       TranslateHfArgument("use_liger_kernel", "true"));
#ifndef CPPTRAIN_CONFIG_HF_TRAINING_ARGS_H_
#define CPPTRAIN_CONFIG_HF_TRAINING_ARGS_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace cpptrain {

// Whether `name` is a Hugging Face TrainingArguments name in the table (not one of our fields).
bool IsHfOnlyArgument(absl::string_view name);

// The table's names, in transformers' order.
const std::vector<std::string>& HfOnlyArgumentNames();

// The assignments (paths from TrainingArguments, "fused_kernels=true") that Hugging Face's
// `name`=`value` stands for: none when it changes nothing here (Hugging Face's default, or a
// setting without effect), else an InvalidArgument error naming the field, the value, why and
// the equivalent. NotFound for a name that is not in the table.
absl::StatusOr<std::vector<std::string>> TranslateHfArgument(absl::string_view name,
                                                             absl::string_view value);

// "Hugging Face's TrainingArguments.<name>: <what it is here>", or "" for a name not in the
// table; for unknown-field messages.
std::string HfArgumentNote(absl::string_view name);

// The overrides with every "[prefix]hf_name=value" replaced by what it stands for ("prefix" is
// "" for TrainingArguments, "args." for a TrainJob). Errors start with "--set=<assignment>: ".
absl::StatusOr<std::vector<std::string>> TranslateHfOverrides(
    const std::vector<std::string>& overrides, absl::string_view prefix);

// A text-format config with every "hf_name: value" (or "hf_name { ... }") blanked out, keeping
// lines and columns; what they stand for is appended to `assignments` with `prefix`, and, when
// `origins` is given, the Hugging Face name each assignment came from to `origins` (one entry
// per assignment). Errors name "path:line: ".
absl::StatusOr<std::string> ExtractHfArguments(const std::string& text, const std::string& path,
                                               absl::string_view prefix,
                                               std::vector<std::string>* assignments,
                                               std::vector<std::string>* origins = nullptr);

// docs/TRAINING_ARGUMENTS.md's table: one row per name of `hf_fields` (transformers' order),
// "accepted" where `is_our_field` says the name is a field of ours, else the table's status.
// A name in neither is a row saying so ("missing").
std::string HfTrainingArgumentsTableMarkdown(
    const std::vector<std::string>& hf_fields,
    const std::function<bool(const std::string&)>& is_our_field);

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_HF_TRAINING_ARGS_H_
