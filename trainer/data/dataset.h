// A dataset is an indexable collection of examples. Token datasets give input ids (and
// optionally labels); feature datasets give float features and a class label.
//
//   std::shared_ptr<const Dataset> ds = ...;
//   for (int64_t i = 0; i < ds->size(); ++i) Example e = ds->Get(i);
#ifndef CPPTRAIN_TRAINER_DATA_DATASET_H_
#define CPPTRAIN_TRAINER_DATA_DATASET_H_

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace cpptrain {

struct Example {
  // 1-D int64 token ids, or 1-D float features.
  at::Tensor inputs;
  // Token labels (1-D int64, same length as inputs; undefined means "same as inputs"), or a
  // 0-dim int64 class label for feature examples.
  at::Tensor labels;
  // Token examples only: 1-D int64 position of each token, restarting at 0 where each example
  // of a packed row starts (Batch::position_ids); undefined means 0..n-1.
  at::Tensor position_ids;
};

// Implementations are immutable after construction, so Get may be called from loader worker
// threads concurrently.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // 0 <= index < size().
  virtual Example Get(int64_t index) const = 0;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_DATASET_H_
