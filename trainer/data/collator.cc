#include "trainer/data/collator.h"

#include <algorithm>

#include <ATen/ATen.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/status.h"

namespace cpptrain {
namespace {

bool IsFeature(const Example& e) { return at::isFloatingType(e.inputs.scalar_type()); }

bool IsIntegerLabel(const at::Tensor& t) {
  return !at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type()) &&
         t.scalar_type() != at::kBool;
}

}  // namespace

absl::StatusOr<Batch> Collator::Collate(const std::vector<Example>& examples) const {
  CT_RETURN_IF_ERROR(CheckExamples(examples));
  return IsFeature(examples[0]) ? CollateFeatures(examples) : CollateTokens(examples);
}

absl::StatusOr<Batch> Collator::CollatePaddingFree(const std::vector<Example>& examples) const {
  CT_RETURN_IF_ERROR(CheckExamples(examples));
  if (IsFeature(examples[0])) {
    return absl::InvalidArgumentError(
        "padding-free collation concatenates token examples, but the batch holds feature "
        "examples: turn padding_free off");
  }
  std::vector<Example> single(1);
  std::vector<at::Tensor> inputs, labels, positions;
  for (const Example& e : examples) {
    inputs.push_back(e.inputs.to(at::kCPU, at::kLong));
    labels.push_back(e.labels.defined() ? e.labels.to(at::kCPU, at::kLong) : inputs.back());
    positions.push_back(e.position_ids.defined() ? e.position_ids.to(at::kCPU, at::kLong)
                                                 : at::arange(e.inputs.size(0), at::kLong));
  }
  single[0].inputs = at::cat(inputs);
  single[0].labels = at::cat(labels);
  single[0].position_ids = at::cat(positions);
  return CollateTokens(single);
}

absl::Status Collator::CheckExamples(const std::vector<Example>& examples) const {
  if (examples.empty()) {
    return absl::InvalidArgumentError("cannot collate an empty list of examples");
  }
  for (size_t i = 0; i < examples.size(); ++i) {
    const at::Tensor& inputs = examples[i].inputs;
    if (!inputs.defined() || inputs.dim() != 1 || inputs.numel() == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("example ", i, " of the batch has ",
                       inputs.defined() ? absl::StrCat("inputs of shape ", c10::str(inputs.sizes()))
                                        : "undefined inputs (index out of range?)",
                       ": the collator needs non-empty 1-D token ids or features"));
    }
    if (IsFeature(examples[i]) != IsFeature(examples[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "example ", i, " of the batch has ", c10::toString(inputs.scalar_type()),
          " inputs but example 0 has ", c10::toString(examples[0].inputs.scalar_type()),
          ": a batch is all token examples or all feature examples"));
    }
    const at::Tensor& positions = examples[i].position_ids;
    if (positions.defined() && (positions.dim() != 1 || positions.size(0) != inputs.size(0))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "example ", i, " of the batch has ", inputs.size(0), " inputs but position_ids of shape ",
          c10::str(positions.sizes()), ": give one position per token (or none)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Batch> Collator::CollateTokens(const std::vector<Example>& examples) const {
  const int64_t batch_size = static_cast<int64_t>(examples.size());
  int64_t max_len = 0;
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    max_len = std::max(max_len, e.inputs.size(0));
    if (!e.labels.defined()) continue;
    if (e.labels.dim() != 1 || e.labels.size(0) != e.inputs.size(0) || !IsIntegerLabel(e.labels)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token example ", i, " of the batch has ", e.inputs.size(0), " inputs but ",
          c10::toString(e.labels.scalar_type()), " labels of shape ", c10::str(e.labels.sizes()),
          ": token labels must be 1-D integers, one per input token (or undefined)"));
    }
  }
  const at::TensorOptions long_options = at::TensorOptions().dtype(at::kLong);
  Batch batch;
  batch.inputs = at::full({batch_size, max_len}, pad_token_id_, long_options);
  batch.labels = at::full({batch_size, max_len}, kIgnoreIndex, long_options);
  batch.attention_mask = at::zeros({batch_size, max_len}, long_options);
  for (int64_t i = 0; i < batch_size; ++i) {
    const Example& e = examples[static_cast<size_t>(i)];
    const int64_t len = e.inputs.size(0);
    const at::Tensor inputs = e.inputs.to(at::kCPU, at::kLong);
    batch.inputs[i].narrow(0, 0, len).copy_(inputs);
    batch.labels[i].narrow(0, 0, len).copy_(e.labels.defined() ? e.labels.to(at::kCPU, at::kLong)
                                                               : inputs);
    batch.attention_mask[i].narrow(0, 0, len).fill_(1);
  }
  const bool positions = std::any_of(examples.begin(), examples.end(),
                                     [](const Example& e) { return e.position_ids.defined(); });
  if (!positions) return batch;
  batch.position_ids = at::zeros({batch_size, max_len}, long_options);
  for (int64_t i = 0; i < batch_size; ++i) {
    const Example& e = examples[static_cast<size_t>(i)];
    const int64_t len = e.inputs.size(0);
    batch.position_ids[i].narrow(0, 0, len).copy_(
        e.position_ids.defined() ? e.position_ids.to(at::kCPU, at::kLong)
                                 : at::arange(len, long_options));
  }
  batch.labels.masked_fill_(batch.position_ids.eq(0), kIgnoreIndex);
  return batch;
}

absl::StatusOr<Batch> Collator::CollateFeatures(const std::vector<Example>& examples) const {
  const at::Tensor& first = examples[0].inputs;
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> labels;
  inputs.reserve(examples.size());
  labels.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const Example& e = examples[i];
    if (e.inputs.size(0) != first.size(0) || e.inputs.scalar_type() != first.scalar_type()) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature example ", i, " of the batch has ", e.inputs.size(0), " ",
                       c10::toString(e.inputs.scalar_type()), " features but example 0 has ",
                       first.size(0), " ", c10::toString(first.scalar_type()),
                       ": feature examples must all have the same size and dtype"));
    }
    if (!e.labels.defined() || e.labels.dim() != 0 || !IsIntegerLabel(e.labels)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature example ", i, " of the batch has ",
          e.labels.defined() ? absl::StrCat(c10::toString(e.labels.scalar_type()),
                                            " label of shape ", c10::str(e.labels.sizes()))
                             : "no label",
          ": a feature example needs a 0-dim integer class label"));
    }
    inputs.push_back(e.inputs.to(at::kCPU));
    labels.push_back(e.labels.to(at::kCPU, at::kLong));
  }
  Batch batch;
  batch.inputs = at::stack(inputs);
  batch.labels = at::stack(labels);
  return batch;
}

}  // namespace cpptrain
