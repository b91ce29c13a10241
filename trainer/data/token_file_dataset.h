// A pre-tokenized corpus on disk: a flat file of little-endian uint16 or uint32 token ids
// (the nanoGPT / llm.c layout without a header), read with pread and cut into consecutive,
// non-overlapping samples of seq_len tokens. The trailing partial sample is dropped. A file
// renamed over (WriteTokenFile) keeps being read as it was; one cut short in place makes the
// read of a sample past its new end an error naming the file and both sizes (not a SIGBUS, as
// a memory mapping would give).
//
//   CT_RETURN_IF_ERROR(WriteTokenFile("/tmp/t.bin", {1, 2, 3, 4}, TokenWidth::kUint16));
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<TokenFileDataset> ds,
//                       TokenFileDataset::Open("/tmp/t.bin", TokenWidth::kUint16, 2));
//   Example e = ds->Get(1);  // inputs = int64 {3, 4}; labels undefined (= inputs)
#ifndef CPPTRAIN_TRAINER_DATA_TOKEN_FILE_DATASET_H_
#define CPPTRAIN_TRAINER_DATA_TOKEN_FILE_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/data/dataset.h"
#include "trainer/data/token_file_metadata.h"

namespace cpptrain {

// Bytes per token in the file. Mirrors DataSpec.TokenDType in proto/job.proto.
enum class TokenWidth { kUint16, kUint32 };

// 2 or 4.
int64_t TokenWidthBytes(TokenWidth width);
// "UINT16" or "UINT32", the names DataSpec.token_dtype uses.
absl::string_view TokenWidthName(TokenWidth width);

class TokenFileDataset final : public Dataset {
 public:
  // Maps `path`. Fails when the file is missing or unreadable, its size is not a multiple of
  // the token width, seq_len <= 0, or it holds fewer than seq_len tokens; and, when
  // <path>.meta.json exists (trainer/data/token_file_metadata.h), when it is malformed, its
  // dtype is not `width` or its num_tokens is not the file's.
  static absl::StatusOr<std::shared_ptr<TokenFileDataset>> Open(const std::string& path,
                                                                TokenWidth width, int64_t seq_len);

  ~TokenFileDataset() override;
  TokenFileDataset(const TokenFileDataset&) = delete;
  TokenFileDataset& operator=(const TokenFileDataset&) = delete;

  // Number of whole samples: num_tokens() / seq_len().
  int64_t size() const override;
  // inputs: int64 [seq_len] tokens [index * seq_len, (index + 1) * seq_len); labels
  // undefined. Returns an empty Example when index is out of range. Throws c10::Error (which
  // the DataLoader returns as its status) when the file was truncated under it.
  Example Get(int64_t index) const override;

  // An error when the metadata's vocab_size is above `vocab_size` (naming both), else one
  // pass over the samples' tokens: an error naming the file, the first offending token, its
  // byte offset and the largest token when any is >= vocab_size (instead of an out-of-range
  // index deep inside the first forward that reads it); and, for a UINT16 file of 64 tokens or
  // more without metadata, an error when every odd 16-bit word is 0 (uint32 ids read as
  // uint16, which no range check catches).
  absl::Status CheckTokensBelow(int64_t vocab_size) const;

  const std::string& path() const { return path_; }
  TokenWidth width() const { return width_; }
  int64_t seq_len() const { return seq_len_; }
  int64_t num_tokens() const { return num_tokens_; }
  // The <path>.meta.json read at Open, or nullopt when there was none.
  const std::optional<TokenFileMetadata>& metadata() const { return metadata_; }

 private:
  TokenFileDataset(std::string path, TokenWidth width, int64_t seq_len, int fd,
                   int64_t opened_bytes, int64_t num_tokens);

  // Reads `count` bytes at `offset` into `out`; a short read (the file was cut under us) is an
  // error naming the file, `what` needed the bytes, and the sizes then and now.
  absl::Status Read(int64_t offset, int64_t count, const std::string& what,
                    unsigned char* out) const;

  std::string path_;
  TokenWidth width_;
  int64_t seq_len_;
  int fd_;                // open read-only for the dataset's life
  int64_t opened_bytes_;  // the file's size at Open
  int64_t num_tokens_;
  std::optional<TokenFileMetadata> metadata_;
};

// Writes `tokens` to `path` as little-endian integers of `width`, through a temporary file
// renamed over `path`. Fails, writing nothing, when a token is negative or does not fit the
// width.
absl::Status WriteTokenFile(const std::string& path, const std::vector<int64_t>& tokens,
                            TokenWidth width);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_TOKEN_FILE_DATASET_H_
