// A dataset held in memory as a vector of Examples: token sequences (of any lengths) or
// feature vectors with class labels. Used by tests and by builtin corpora.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<InMemoryDataset> ds,
//                       InMemoryDataset::FromTokenSequences({{1, 2, 3}, {4, 5}}));
//   Example e = ds->Get(1);  // inputs = int64 {4, 5}
#ifndef CPPTRAIN_TRAINER_DATA_IN_MEMORY_DATASET_H_
#define CPPTRAIN_TRAINER_DATA_IN_MEMORY_DATASET_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/data/dataset.h"

namespace cpptrain {

class InMemoryDataset final : public Dataset {
 public:
  // Validates each example: inputs defined and 1-D; token inputs (integer) with labels, if
  // any, 1-D of the same length; feature inputs (floating point) with a 0-dim integer label.
  // The tensors are kept as given (not copied); the caller must not modify them afterwards.
  static absl::StatusOr<std::shared_ptr<InMemoryDataset>> Create(std::vector<Example> examples);

  // One token example per sequence, inputs int64 and labels undefined. Sequences must be
  // non-empty.
  static absl::StatusOr<std::shared_ptr<InMemoryDataset>> FromTokenSequences(
      const std::vector<std::vector<int64_t>>& sequences);

  int64_t size() const override { return static_cast<int64_t>(examples_.size()); }
  // The stored example (tensors shared, do not modify in place); an empty Example when index
  // is out of range.
  Example Get(int64_t index) const override;

 private:
  explicit InMemoryDataset(std::vector<Example> examples) : examples_(std::move(examples)) {}

  std::vector<Example> examples_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_IN_MEMORY_DATASET_H_
