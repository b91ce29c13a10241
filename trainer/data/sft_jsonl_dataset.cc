#include "trainer/data/sft_jsonl_dataset.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <utility>

#include <ATen/ATen.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "base/status.h"
#include "module/batch.h"
#include "trainer/data/bfd_packing.h"

namespace cpptrain {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// One record as read: the ids and the masks it carries (empty when absent).
struct Record {
  int64_t line = 0;
  std::vector<int64_t> input_ids;
  std::vector<int64_t> completion_mask;
  std::vector<int64_t> assistant_masks;
  bool has_completion_mask = false;
  bool has_assistant_masks = false;
};

std::string Where(const std::string& path, int64_t line) {
  return absl::StrCat(path, ":", line);
}

// The command that turns text records into what this reader reads.
std::string TokenizeCommand(const std::string& path, const std::string& model_dir,
                            bool messages) {
  std::string output(absl::StripSuffix(path, ".jsonl"));
  return absl::StrCat("python3 tools/sft_tokenize.py --model ",
                      model_dir.empty() ? "MODEL_DIR" : model_dir, " --input ", path,
                      " --output ", output, ".tok.jsonl",
                      messages ? " --assistant_only_loss" : "",
                      " (then set data.train_file to ", output, ".tok.jsonl)");
}

absl::StatusOr<std::vector<int64_t>> IntegerList(const Struct& record, const std::string& key,
                                                 const std::string& where, bool mask) {
  const Value& value = record.fields().at(key);
  if (value.kind_case() != Value::kListValue) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"", key, "\" is not a list; it must be a list of ",
                     mask ? "0/1 flags, one per input id" : "token ids (non-negative integers)"));
  }
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(value.list_value().values_size()));
  for (int i = 0; i < value.list_value().values_size(); ++i) {
    const Value& item = value.list_value().values(i);
    const double x = item.kind_case() == Value::kNumberValue ? item.number_value() : -1.0;
    const bool ok = item.kind_case() == Value::kBoolValue ||
                    (x >= 0 && x == std::floor(x) && x < 9.007199254740992e15 &&
                     (!mask || x <= 1));
    if (!ok) {
      std::string seen;
      (void)google::protobuf::util::MessageToJsonString(item, &seen);
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\"[", i, "] is ", seen, "; it must be ",
                       mask ? "0 or 1" : "a non-negative integer token id"));
    }
    out.push_back(item.kind_case() == Value::kBoolValue ? (item.bool_value() ? 1 : 0)
                                                        : static_cast<int64_t>(x));
  }
  return out;
}

absl::StatusOr<Record> ParseRecord(const std::string& text, const std::string& path,
                                   int64_t line, const std::string& model_dir) {
  const std::string where = Where(path, line);
  Struct record;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text, &record);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": not a JSON object (", parsed.ToString(),
                     "); each line must be one record such as {\"input_ids\": [...], "
                     "\"completion_mask\": [...]}"));
  }
  const auto& fields = record.fields();
  if (!(fields.count("input_ids") > 0)) {
    for (const char* key : {"messages", "prompt", "completion", "text"}) {
      if ((fields.count(key) > 0)) {
        const bool messages = std::string(key) == "messages";
        return absl::InvalidArgumentError(absl::StrCat(
            where, ": a text record (\"", key,
            "\") but cpptrain reads token ids only (it has no tokenizer). Tokenize the file "
            "with the model's tokenizer first: ",
            TokenizeCommand(path, model_dir, messages)));
      }
    }
    std::vector<std::string> keys;
    for (const auto& [key, value] : fields) keys.push_back(key);
    std::sort(keys.begin(), keys.end());
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": the record has no \"input_ids\" (its keys: ", absl::StrJoin(keys, ", "),
        "); give {\"input_ids\": [...]} with \"completion_mask\" or \"assistant_masks\", or "
        "text, prompt/completion or messages records for tools/sft_tokenize.py"));
  }
  Record out;
  out.line = line;
  auto ids = IntegerList(record, "input_ids", where, /*mask=*/false);
  if (!ids.ok()) return ids.status();
  out.input_ids = *std::move(ids);
  if (out.input_ids.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"input_ids\" is empty; drop the record or give its tokens"));
  }
  for (const char* key : {"completion_mask", "assistant_masks"}) {
    if (!(fields.count(key) > 0)) continue;
    auto mask = IntegerList(record, key, where, /*mask=*/true);
    if (!mask.ok()) return mask.status();
    if (mask->size() != out.input_ids.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": \"", key, "\" has ", mask->size(), " flags but \"input_ids\" has ",
                       out.input_ids.size(), " tokens; give one flag per token"));
    }
    if (std::string(key) == "completion_mask") {
      out.completion_mask = *std::move(mask);
      out.has_completion_mask = true;
    } else {
      out.assistant_masks = *std::move(mask);
      out.has_assistant_masks = true;
    }
  }
  return out;
}

absl::StatusOr<std::vector<Record>> ReadRecords(const std::string& path,
                                                const std::string& model_dir) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot open the JSONL data file ", path, ": check data.train_file"));
  }
  std::vector<Record> records;
  std::string text;
  int64_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (absl::StripAsciiWhitespace(text).empty()) continue;
    auto record = ParseRecord(text, path, line, model_dir);
    if (!record.ok()) return record.status();
    records.push_back(*std::move(record));
  }
  if (records.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no records"));
  }
  return records;
}

// The record's input ids and labels (TRL's build_labels), or why the options cannot apply.
absl::Status Label(const Record& r, const std::string& where, bool completion_only,
                   bool assistant_only, std::vector<int64_t>* labels) {
  if (completion_only && !r.has_completion_mask) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data.completion_only_loss is on but the record has no \"completion_mask\"; "
               "tokenize prompt/completion records with tools/sft_tokenize.py, or set "
               "data.completion_only_loss: false"));
  }
  if (assistant_only && !r.has_assistant_masks) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data.assistant_only_loss is on but the record has no \"assistant_masks\"; "
               "tokenize messages records with tools/sft_tokenize.py --assistant_only_loss, "
               "or set data.assistant_only_loss: false"));
  }
  if (assistant_only && std::find(r.assistant_masks.begin(), r.assistant_masks.end(), 1) ==
                            r.assistant_masks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": data.assistant_only_loss is on but the record has no assistant token (its "
               "\"assistant_masks\" is all 0); the chat template probably lacks "
               "{% generation %} markers around the assistant turns"));
  }
  *labels = r.input_ids;
  for (size_t i = 0; i < labels->size(); ++i) {
    if ((completion_only && r.completion_mask[i] == 0) ||
        (assistant_only && r.assistant_masks[i] == 0)) {
      (*labels)[i] = kIgnoreIndex;
    }
  }
  return absl::OkStatus();
}

bool HasLabel(const std::vector<int64_t>& labels) {
  return std::any_of(labels.begin(), labels.end(), [](int64_t l) { return l != kIgnoreIndex; });
}

}  // namespace

absl::StatusOr<std::shared_ptr<SftJsonlDataset>> SftJsonlDataset::Open(
    const std::string& path, const SftDataOptions& options) {
  if (options.max_length < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("data.max_length is ", options.max_length, "; it must be >= 1"));
  }
  CT_ASSIGN_OR_RETURN(std::vector<Record> records, ReadRecords(path, options.model_dir));
  // completion_only_loss unset: TRL turns it on for prompt/completion data, which is the data
  // that has a completion mask.
  const bool completion_only = options.completion_only_loss.value_or(
      std::all_of(records.begin(), records.end(),
                  [](const Record& r) { return r.has_completion_mask; }));
  auto dataset = std::shared_ptr<SftJsonlDataset>(new SftJsonlDataset());
  dataset->path_ = path;
  dataset->num_records_ = static_cast<int64_t>(records.size());
  std::vector<Row> examples;
  for (const Record& r : records) {
    Row row;
    row.first_line = r.line;
    row.input_ids = r.input_ids;
    CT_RETURN_IF_ERROR(Label(r, Where(path, r.line), completion_only,
                             options.assistant_only_loss, &row.labels));
    examples.push_back(std::move(row));
  }
  dataset->rows_ = options.packing ? Pack(std::move(examples), options.max_length)
                                   : Truncate(std::move(examples), options.max_length);
  if (dataset->rows_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": no example has a token to train on after truncation to data.max_length = ",
        options.max_length, "; raise max_length"));
  }
  return dataset;
}

std::vector<SftJsonlDataset::Row> SftJsonlDataset::Truncate(std::vector<Row> examples,
                                                            int64_t max_length) {
  // TRL's truncation (keep_start), then dropping what has no label left.
  std::vector<Row> rows;
  for (Row& row : examples) {
    if (static_cast<int64_t>(row.input_ids.size()) > max_length) {
      row.input_ids.resize(static_cast<size_t>(max_length));
      row.labels.resize(static_cast<size_t>(max_length));
    }
    if (HasLabel(row.labels)) rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<SftJsonlDataset::Row> SftJsonlDataset::Pack(std::vector<Row> examples,
                                                        int64_t max_length) {
  std::vector<int64_t> lengths;
  for (const Row& row : examples) lengths.push_back(static_cast<int64_t>(row.input_ids.size()));
  std::vector<Row> rows;
  for (const PackedRow& packed : PackBestFitDecreasing(lengths, max_length)) {
    Row row;
    row.first_line = examples[static_cast<size_t>(packed.examples[0])].first_line;
    for (size_t j = 0; j < packed.examples.size(); ++j) {
      const Row& e = examples[static_cast<size_t>(packed.examples[j])];
      const auto n = static_cast<std::ptrdiff_t>(packed.lengths[j]);
      row.input_ids.insert(row.input_ids.end(), e.input_ids.begin(), e.input_ids.begin() + n);
      row.labels.insert(row.labels.end(), e.labels.begin(), e.labels.begin() + n);
      for (int64_t p = 0; p < packed.lengths[j]; ++p) row.position_ids.push_back(p);
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

Example SftJsonlDataset::Get(int64_t index) const {
  if (index < 0 || index >= size()) return {};
  const Row& row = rows_[static_cast<size_t>(index)];
  auto tensor = [](const std::vector<int64_t>& v) {
    return at::tensor(at::ArrayRef<int64_t>(v), at::TensorOptions().dtype(at::kLong));
  };
  Example e;
  e.inputs = tensor(row.input_ids);
  e.labels = tensor(row.labels);
  if (!row.position_ids.empty()) e.position_ids = tensor(row.position_ids);
  return e;
}

absl::Status SftJsonlDataset::CheckTokensBelow(int64_t vocab_size) const {
  for (const Row& row : rows_) {
    for (int64_t id : row.input_ids) {
      if (id >= vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            Where(path_, row.first_line), ": token id ", id, " is >= the model's vocab_size ",
            vocab_size, "; tokenize with the model's own tokenizer"));
      }
    }
  }
  return absl::OkStatus();
}

int64_t SftJsonlDataset::num_label_tokens() const {
  int64_t n = 0;
  for (const Row& row : rows_) {
    n += std::count_if(row.labels.begin(), row.labels.end(),
                       [](int64_t l) { return l != kIgnoreIndex; });
  }
  return n;
}

}  // namespace cpptrain
