// Fuzzes the token-file reader (trainer/data/token_file_dataset.h). The first 4 bytes of the input
// choose the reader's arguments (byte 0: the width, uint16 or uint32; byte 1: seq_len 0..255;
// bytes 2-3: a vocab_size, little-endian), the rest is the file. For a file that opens, every
// sample must hold the file's tokens decoded independently here, out-of-range indices give an
// empty Example, and CheckTokensBelow(vocab_size) must fail exactly when some token of a whole
// sample is >= vocab_size or, for uint16 (no metadata here) of at least 64 tokens, every odd
// token of the samples is 0 while some token is not (uint32 ids read as uint16).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "trainer/data/token_file_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const cpptrain::TokenWidth width =
      (data[0] & 1) != 0 ? cpptrain::TokenWidth::kUint32 : cpptrain::TokenWidth::kUint16;
  const int64_t seq_len = data[1];
  const int64_t vocab_size = data[2] | (data[3] << 8);
  const uint8_t* file_bytes = data + 4;
  const size_t file_size = size - 4;
  static const std::string path = cpptrain::fuzz::ScratchPath("tokens.bin");
  cpptrain::fuzz::WriteFileOrDie(path, file_bytes, file_size);

  const auto dataset = cpptrain::TokenFileDataset::Open(path, width, seq_len);
  const int64_t token_bytes = cpptrain::TokenWidthBytes(width);
  const bool should_open = seq_len > 0 && file_size % token_bytes == 0 &&
                           static_cast<int64_t>(file_size) / token_bytes >= seq_len;
  FUZZ_CHECK(dataset.ok() == should_open, "Open(width " << token_bytes << ", seq_len " << seq_len
                                                        << ") of " << file_size
                                                        << " bytes: " << dataset.status());
  if (!dataset.ok()) return 0;
  const cpptrain::TokenFileDataset& ds = **dataset;
  const int64_t num_tokens = static_cast<int64_t>(file_size) / token_bytes;
  FUZZ_CHECK(ds.num_tokens() == num_tokens && ds.size() == num_tokens / seq_len,
             "num_tokens " << ds.num_tokens() << ", size " << ds.size());

  auto token_at = [&](int64_t i) {
    int64_t value = 0;
    for (int64_t b = token_bytes - 1; b >= 0; --b) {
      value = value << 8 | file_bytes[i * token_bytes + b];
    }
    return value;
  };
  int64_t max_token = -1;
  bool odd_tokens_zero = true;
  for (int64_t index = 0; index < ds.size(); ++index) {
    const cpptrain::Example example = ds.Get(index);
    FUZZ_CHECK(example.inputs.defined() && example.inputs.dim() == 1 &&
                   example.inputs.size(0) == seq_len && example.inputs.scalar_type() == at::kLong,
               "sample " << index);
    const int64_t* tokens = example.inputs.data_ptr<int64_t>();
    for (int64_t i = 0; i < seq_len; ++i) {
      const int64_t expected = token_at(index * seq_len + i);
      FUZZ_CHECK(tokens[i] == expected, "sample " << index << " token " << i << " is " << tokens[i]
                                                  << ", the file holds " << expected);
      max_token = std::max(max_token, expected);
      if ((index * seq_len + i) % 2 == 1 && expected != 0) odd_tokens_zero = false;
    }
  }
  FUZZ_CHECK(!ds.Get(-1).inputs.defined() && !ds.Get(ds.size()).inputs.defined(),
             "an out-of-range index gave a sample");
  const absl::Status below = ds.CheckTokensBelow(vocab_size);
  const bool looks_wide = width == cpptrain::TokenWidth::kUint16 &&
                          ds.size() * seq_len >= 64 && odd_tokens_zero && max_token > 0;
  FUZZ_CHECK(below.ok() == (max_token < vocab_size && !looks_wide), "CheckTokensBelow("
                                                         << vocab_size << ") with largest token "
                                                         << max_token << ": " << below);
  return 0;
}
