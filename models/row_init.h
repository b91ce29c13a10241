// Row-seeded initialization: the initial value of a parameter that does not depend on how its
// rows are split over ranks, so a model can be initialized straight into FullyShard's chunks
// (each rank fills only its rows) and still equal the same model initialized whole.
//
// A normal-initialized parameter is drawn in blocks of kRowInitBlock rows of dim 0; block b
// of parameter `index` comes from its own CPU generator seeded by (seed, index, b). A rank
// whose rows start or end inside a block draws the whole block and keeps its part.
//
//   FillRows({InitKind::kNormal, 0.02}, seed, /*index=*/3, /*row_begin=*/512, rows);
//
// A model built deferred (DecoderInit::Mode::kDeferred, module/deferred.h) costs nothing until
// FullyShard gives each rank its chunks and fills them with FillRows, or LoadHfWeights
// allocates each tensor as it reads it.
#ifndef CPPTRAIN_MODELS_ROW_INIT_H_
#define CPPTRAIN_MODELS_ROW_INIT_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "module/deferred.h"

namespace cpptrain {

enum class InitKind { kNormal, kOnes, kZeros };

struct RowInit {
  InitKind kind = InitKind::kZeros;
  double std = 0;  // kNormal: normal(0, std)
};

inline constexpr int64_t kRowInitBlock = 64;

// Fills `rows` with rows [row_begin, row_begin + rows.size(0)) of parameter `index` (`rows`
// is any floating dtype, on the CPU; 1-D parameters have one element per row).
void FillRows(const RowInit& init, uint64_t seed, int64_t index, int64_t row_begin,
              at::Tensor rows);

}  // namespace cpptrain

#endif  // CPPTRAIN_MODELS_ROW_INIT_H_
