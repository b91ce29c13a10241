#include "trainer/data/in_memory_dataset.h"

#include <utility>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace cpptrain {
namespace {

absl::Status ValidateExample(const Example& e, size_t index) {
  if (!e.inputs.defined() || e.inputs.dim() != 1 || e.inputs.numel() == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "example ", index, " has ",
        e.inputs.defined()
            ? absl::StrCat(e.inputs.dim(), "-D inputs of ", e.inputs.numel(), " elements")
            : "undefined inputs",
        ": inputs must be a non-empty 1-D tensor (token ids or features)"));
  }
  const bool tokens = !at::isFloatingType(e.inputs.scalar_type());
  if (tokens && e.inputs.scalar_type() == at::kBool) {
    return absl::InvalidArgumentError(
        absl::StrCat("example ", index, " has bool inputs: use int64 token ids or float features"));
  }
  if (!e.labels.defined()) {
    if (tokens) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("feature example ", index, " has no label: give a 0-dim int64 class label"));
  }
  if (at::isFloatingType(e.labels.scalar_type()) || e.labels.scalar_type() == at::kBool) {
    return absl::InvalidArgumentError(absl::StrCat("example ", index, " has labels of type ",
                                                   c10::toString(e.labels.scalar_type()),
                                                   ": labels must be integer (int64)"));
  }
  if (tokens && (e.labels.dim() != 1 || e.labels.size(0) != e.inputs.size(0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "token example ", index, " has ", e.inputs.size(0), " inputs but labels of shape ",
        c10::str(e.labels.sizes()), ": labels must be 1-D with one label per input token"));
  }
  if (!tokens && e.labels.dim() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "feature example ", index, " has a label of shape ", c10::str(e.labels.sizes()),
        ": a feature example's label must be a 0-dim class index"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<InMemoryDataset>> InMemoryDataset::Create(
    std::vector<Example> examples) {
  for (size_t i = 0; i < examples.size(); ++i) {
    absl::Status status = ValidateExample(examples[i], i);
    if (!status.ok()) return status;
  }
  return std::shared_ptr<InMemoryDataset>(new InMemoryDataset(std::move(examples)));
}

absl::StatusOr<std::shared_ptr<InMemoryDataset>> InMemoryDataset::FromTokenSequences(
    const std::vector<std::vector<int64_t>>& sequences) {
  std::vector<Example> examples;
  examples.reserve(sequences.size());
  for (const std::vector<int64_t>& sequence : sequences) {
    Example e;
    e.inputs = at::tensor(at::ArrayRef<int64_t>(sequence), at::kLong);
    examples.push_back(std::move(e));
  }
  return Create(std::move(examples));
}

Example InMemoryDataset::Get(int64_t index) const {
  if (index < 0 || index >= size()) return Example();
  return examples_[static_cast<size_t>(index)];
}

}  // namespace cpptrain
