// The metadata file tools/tokenize_text.py writes beside a token file: <file>.meta.json, one flat
// JSON object of strings and integers, e.g.
//
//   {"format": "cpptrain-tokens", "dtype": "uint16", "vocab_size": 50257, "eos_id": 50256,
//    "num_tokens": 1048576, "tokenizer": "gpt2/tokenizer.json"}
//
// TokenFileDataset::Open reads it when present (the token file alone still works) and checks
// dtype and num_tokens against the file; CheckTokensBelow checks vocab_size against the model's.
//
//   CT_ASSIGN_OR_RETURN(std::optional<TokenFileMetadata> meta,
//                       ReadTokenFileMetadata(TokenFileMetadataPath("train.bin")));
#ifndef CPPTRAIN_TRAINER_DATA_TOKEN_FILE_METADATA_H_
#define CPPTRAIN_TRAINER_DATA_TOKEN_FILE_METADATA_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace cpptrain {

struct TokenFileMetadata {
  std::string path;   // the .meta.json file read
  std::string dtype;  // "uint16" or "uint32"
  int64_t vocab_size = 0;
  std::optional<int64_t> eos_id;  // absent or null: none
  int64_t num_tokens = 0;
};

// "<token_file>.meta.json".
std::string TokenFileMetadataPath(const std::string& token_file);

// nullopt when `path` does not exist. InvalidArgument naming the file and the field when it
// is not a flat JSON object, or dtype, vocab_size or num_tokens is missing or ill-typed, or
// a value is out of range (vocab_size < 1, eos_id outside [0, vocab_size), num_tokens < 0).
// Keys it does not know are ignored.
absl::StatusOr<std::optional<TokenFileMetadata>> ReadTokenFileMetadata(const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_TOKEN_FILE_METADATA_H_
