// Turns a list of Examples into one Batch. Token examples are right-padded to the longest
// in the batch: inputs with pad_token_id, labels with kIgnoreIndex, attention_mask 1 for real
// tokens and 0 for padding. Only padding positions are ignored: a real token equal to
// pad_token_id keeps its label. Feature examples (floating 1-D inputs, 0-dim label) are
// stacked into [B, F] inputs and [B] int64 labels.
//
// Token examples with position_ids (packed rows) give Batch::position_ids, padded with 0;
// the label of every token at position 0 becomes kIgnoreIndex, so that no example's last token
// is trained to predict the next example's first (TRL's collator does the same).
// CollatePaddingFree concatenates the batch into one row [1, sum of lengths] with
// position_ids (TRL's padding_free), each example's positions from 0 (or its own).
//
//   Collator collator(/*pad_token_id=*/0);
//   CT_ASSIGN_OR_RETURN(Batch batch, collator.Collate({ds->Get(0), ds->Get(1)}));
#ifndef CPPTRAIN_TRAINER_DATA_COLLATOR_H_
#define CPPTRAIN_TRAINER_DATA_COLLATOR_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "module/batch.h"
#include "trainer/data/dataset.h"

namespace cpptrain {

// A user's collator (Hugging Face's data_collator): one Batch from a batch's examples, CPU
// tensors as Collator gives them. Called from loader worker threads: it must be thread-safe.
using DataCollatorFn = std::function<absl::StatusOr<Batch>(const std::vector<Example>&)>;

class Collator {
 public:
  explicit Collator(int64_t pad_token_id = 0) : pad_token_id_(pad_token_id) {}

  // CPU tensors, inputs and labels int64 for tokens. Fails on an empty list, examples of
  // mixed kinds, inputs that are not 1-D and non-empty, token labels whose length differs
  // from the inputs', feature examples of different sizes or dtypes, or feature labels
  // that are not 0-dim integers.
  absl::StatusOr<Batch> Collate(const std::vector<Example>& examples) const;
  // Token examples only; the same checks.
  absl::StatusOr<Batch> CollatePaddingFree(const std::vector<Example>& examples) const;

  int64_t pad_token_id() const { return pad_token_id_; }

 private:
  absl::Status CheckExamples(const std::vector<Example>& examples) const;
  absl::StatusOr<Batch> CollateTokens(const std::vector<Example>& examples) const;
  absl::StatusOr<Batch> CollateFeatures(const std::vector<Example>& examples) const;

  int64_t pad_token_id_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_COLLATOR_H_
