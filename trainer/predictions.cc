#include "trainer/predictions.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/files.h"

namespace cpptrain {
namespace {

constexpr int64_t kPad = -100;

std::string IdList(const at::Tensor& row) {
  const at::Tensor ids = row.to(at::kLong).contiguous();
  return absl::StrCat(
      "[", absl::StrJoin(ids.data_ptr<int64_t>(), ids.data_ptr<int64_t>() + ids.numel(), ","), "]");
}

std::string FloatList(const at::Tensor& row) {
  const at::Tensor values = row.to(at::kDouble).contiguous();
  std::vector<std::string> items;
  for (int64_t i = 0; i < values.numel(); ++i) {
    items.push_back(absl::StrFormat("%.9g", values.data_ptr<double>()[i]));
  }
  return absl::StrCat("[", absl::StrJoin(items, ","), "]");
}

// [T][k] as nested lists.
std::string Nested(const at::Tensor& matrix, bool ids) {
  std::vector<std::string> rows;
  for (int64_t t = 0; t < matrix.size(0); ++t) {
    rows.push_back(ids ? IdList(matrix[t]) : FloatList(matrix[t]));
  }
  return absl::StrCat("[", absl::StrJoin(rows, ","), "]");
}

// The positions of sample `labels` up to the last one that is not padding.
int64_t Length(const at::Tensor& labels, const at::Tensor& logits) {
  const at::Tensor real = labels.ne(kPad).logical_or(logits.ne(kPad).any(-1));
  const at::Tensor where = real.nonzero();
  return where.numel() == 0 ? 0 : where.max().item<int64_t>() + 1;
}

}  // namespace

absl::Status WritePredictions(const PredictionOutput& output, int top_k, const std::string& path) {
  if (!output.predictions.defined() || output.predictions.dim() != 3) {
    return absl::InvalidArgumentError(
        "Predict returned no [N, T, vocab] logits to write: was prediction_loss_only set?");
  }
  std::string text;
  CT_RETURN_IF_ERROR(CatchTorch([&] {
    const at::Tensor logits = output.predictions.to(at::kFloat);
    const at::Tensor labels = output.label_ids;
    const int64_t k = std::min<int64_t>(top_k, logits.size(2));
    for (int64_t i = 0; i < logits.size(0); ++i) {
      const int64_t length = Length(labels[i], logits[i]);
      const at::Tensor sample = logits[i].slice(0, 0, length);
      absl::StrAppend(&text, "{\"index\":", i,
                      ",\"label_ids\":", IdList(labels[i].slice(0, 0, length)),
                      ",\"predicted_ids\":", IdList(sample.argmax(-1)));
      if (k > 0) {
        const auto [values, ids] = sample.topk(k, -1);
        absl::StrAppend(&text, ",\"top_k_ids\":", Nested(ids, true),
                        ",\"top_k_logits\":", Nested(values, false));
      }
      absl::StrAppend(&text, "}\n");
    }
  }));
  return WriteFileAtomically(path, text);
}

}  // namespace cpptrain
