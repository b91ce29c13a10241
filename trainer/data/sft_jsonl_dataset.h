// Instruction (SFT) data from a JSONL file, prepared as TRL's SFTTrainer prepares it: one
// pre-tokenized record a line, {"input_ids": [...], "completion_mask": [...]} or
// {"input_ids": [...], "assistant_masks": [...]} (TRL's column names; both masks may be
// present, and "seq_lengths" or other keys are ignored). Labels are the input ids, kIgnoreIndex
// where an applied mask is 0 (completion_only_loss: completion_mask; assistant_only_loss:
// assistant_masks). Text records ({"text"}, {"prompt", "completion"}, {"messages"}) are refused
// with the tools/sft_tokenize.py command line that tokenizes them: there is no C++ tokenizer.
//
// Without packing an example longer than max_length keeps its first max_length tokens, and an
// example whose labels are then all ignored is dropped (TRL's truncation). With packing the
// examples are packed best-fit decreasing (bfd_packing.h) into rows of at most max_length
// tokens whose position_ids restart at 0 for each example.
//
//   SftDataOptions options;
//   options.max_length = 512;
//   options.packing = true;
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<SftJsonlDataset> ds,
//                       SftJsonlDataset::Open("train.tok.jsonl", options));
//   Example row = ds->Get(0);  // inputs, labels and position_ids, int64 [<= 512]
#ifndef CPPTRAIN_TRAINER_DATA_SFT_JSONL_DATASET_H_
#define CPPTRAIN_TRAINER_DATA_SFT_JSONL_DATASET_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "trainer/data/dataset.h"

namespace cpptrain {

// Mirrors the JSONL fields of DataSpec (proto/job.proto), named as TRL's SFTConfig names them.
struct SftDataOptions {
  int64_t max_length = 1024;
  bool packing = false;
  // nullopt: on when the records carry completion_mask.
  std::optional<bool> completion_only_loss;
  bool assistant_only_loss = false;
  // The model directory, for the tools/sft_tokenize.py command a text record's error gives.
  std::string model_dir;
};

class SftJsonlDataset final : public Dataset {
 public:
  // Reads and prepares the whole file. Fails, naming the file, the line and the field, on a
  // line that is not a JSON object, a text record, input_ids missing, empty or not
  // non-negative integers, a mask of another length than input_ids or not 0/1, a mask an
  // option needs missing (completion_only_loss: true without completion_mask;
  // assistant_only_loss without assistant_masks), a record with assistant_only_loss and no
  // assistant token (as TRL), max_length < 1, or a file without records.
  static absl::StatusOr<std::shared_ptr<SftJsonlDataset>> Open(const std::string& path,
                                                               const SftDataOptions& options);

  int64_t size() const override { return static_cast<int64_t>(rows_.size()); }
  // inputs and labels int64; position_ids with packing (undefined without). An empty Example
  // when index is out of range.
  Example Get(int64_t index) const override;

  // An error naming the file, the record's line and the token when a token id is >= vocab_size.
  absl::Status CheckTokensBelow(int64_t vocab_size) const;

  const std::string& path() const { return path_; }
  // Records read (before truncation, dropping and packing).
  int64_t num_records() const { return num_records_; }
  // Tokens whose label is not ignored, over all rows.
  int64_t num_label_tokens() const;

 private:
  SftJsonlDataset() = default;
  struct Row {
    std::vector<int64_t> input_ids;
    std::vector<int64_t> labels;
    std::vector<int64_t> position_ids;  // empty without packing
    int64_t first_line = 0;             // of its first record, for errors
  };

  // Without packing: each example cut to max_length, those left without a label dropped.
  static std::vector<Row> Truncate(std::vector<Row> examples, int64_t max_length);
  // With packing: best-fit-decreasing rows with position_ids.
  static std::vector<Row> Pack(std::vector<Row> examples, int64_t max_length);

  std::string path_;
  int64_t num_records_ = 0;
  std::vector<Row> rows_;
};

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_SFT_JSONL_DATASET_H_
