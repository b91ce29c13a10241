#include "models/row_init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace cpptrain {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

void FillRows(const RowInit& init, uint64_t seed, int64_t index, int64_t row_begin,
              at::Tensor rows) {
  TORCH_CHECK(rows.device().is_cpu() && rows.is_floating_point() && rows.dim() >= 1,
              "FillRows: rows must be a floating CPU tensor with a dim 0, got ", rows.sizes(), " ",
              rows.scalar_type(), " on ", rows.device());
  at::NoGradGuard no_grad;
  if (init.kind == InitKind::kOnes) {
    rows.fill_(1);
    return;
  }
  if (init.kind == InitKind::kZeros) {
    rows.zero_();
    return;
  }
  const int64_t n = rows.size(0);
  if (n == 0) return;
  const int64_t row_numel = rows.numel() / n;
  at::Tensor out = rows.view({n, row_numel});  // rows of a chunk are contiguous
  const int64_t row_end = row_begin + n;
  for (int64_t block = row_begin / kRowInitBlock; block * kRowInitBlock < row_end; ++block) {
    const int64_t block_begin = block * kRowInitBlock;
    auto generator = at::make_generator<at::CPUGeneratorImpl>(
        SplitMix64(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(index))) ^
                   static_cast<uint64_t>(block)));
    at::Tensor values = at::empty({kRowInitBlock, row_numel}, at::kFloat);
    values.normal_(0.0, init.std, generator);
    const int64_t lo = std::max(block_begin, row_begin);
    const int64_t hi = std::min(block_begin + kRowInitBlock, row_end);
    out.narrow(0, lo - row_begin, hi - lo).copy_(values.narrow(0, lo - block_begin, hi - lo));
  }
}

}  // namespace cpptrain
