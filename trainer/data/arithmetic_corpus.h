// A builtin corpus that needs no download: a deterministic stream of addition lines such as
// "17+25=42\n" with character-level tokens, cut into fixed-length windows. Small models learn
// it quickly, so loss curves and generation demos can be checked by eye.
//
// Vocabulary (ArithmeticVocabSize() == 14):
//   0 = padding, 1..10 = '0'..'9', 11 = '+', 12 = '=', 13 = '\n'.
// Operands are uniform in [0, 99]. Train and eval splits use different seeds.
//
//   CT_ASSIGN_OR_RETURN(auto train, MakeArithmeticDataset(4096, 64, /*seed=*/1234));
//   CT_ASSIGN_OR_RETURN(auto eval, MakeArithmeticDataset(256, 64, /*seed=*/1235));
//   LOG(INFO) << DecodeArithmetic(train->Get(0).inputs);  // "7+25=42\n3+9=12\n61+..."
#ifndef CPPTRAIN_TRAINER_DATA_ARITHMETIC_CORPUS_H_
#define CPPTRAIN_TRAINER_DATA_ARITHMETIC_CORPUS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "trainer/data/in_memory_dataset.h"

namespace cpptrain {

inline constexpr int64_t kArithmeticPadId = 0;

// 14: padding plus the 13 characters "0123456789+=\n".
int64_t ArithmeticVocabSize();

// num_samples windows of seq_len tokens each, consecutive and non-overlapping in one stream
// of lines generated from `seed` (std::mt19937_64, so identical on every platform). Fails
// when num_samples or seq_len is not positive, or the corpus would exceed 2^28 tokens.
absl::StatusOr<std::shared_ptr<InMemoryDataset>> MakeArithmeticDataset(int64_t num_samples,
                                                                       int64_t seq_len,
                                                                       uint64_t seed);

// Text for token ids; padding decodes to nothing, unknown ids to '?'.
std::string DecodeArithmetic(const std::vector<int64_t>& tokens);
// Same for a 1-D integer tensor (e.g. Example::inputs or a row of Batch::inputs).
std::string DecodeArithmetic(const at::Tensor& tokens);

// Token ids for text made of "0123456789+=\n" (e.g. a prompt "17+25="); fails naming the
// first other character.
absl::StatusOr<std::vector<int64_t>> EncodeArithmetic(absl::string_view text);

}  // namespace cpptrain

#endif  // CPPTRAIN_TRAINER_DATA_ARITHMETIC_CORPUS_H_
