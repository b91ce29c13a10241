#include "trainer/data/bfd_packing.h"

#include <algorithm>
#include <deque>
#include <iterator>
#include <map>
#include <numeric>

namespace cpptrain {
namespace {

void PackChunk(const std::vector<int64_t>& lengths, int64_t begin, int64_t end,
               int64_t max_length, std::vector<PackedRow>* rows) {
  std::vector<int64_t> order;
  for (int64_t i = begin; i < end; ++i) {
    if (lengths[static_cast<size_t>(i)] > 0) order.push_back(i);
  }
  auto clipped = [&](int64_t i) { return std::min(lengths[static_cast<size_t>(i)], max_length); };
  // Longest first; a stable sort keeps equal lengths in index order (Arrow's sort is stable).
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return clipped(a) > clipped(b); });
  // Free space -> rows with exactly that space, oldest first. A new row is always available
  // (TRL's segment tree holds max_length for it), so only spaces below max_length are kept.
  std::map<int64_t, std::deque<size_t>> open;
  for (int64_t i : order) {
    const int64_t length = clipped(i);
    size_t row;
    int64_t space = max_length;
    auto fit = open.lower_bound(length);
    if (fit != open.end()) {
      space = fit->first;
      row = fit->second.front();
      fit->second.pop_front();
      if (fit->second.empty()) open.erase(fit);
    } else {
      row = rows->size();
      rows->emplace_back();
    }
    (*rows)[row].examples.push_back(i);
    (*rows)[row].lengths.push_back(length);
    space -= length;
    if (space > 0) open[space].push_back(row);
  }
}

}  // namespace

std::vector<PackedRow> PackBestFitDecreasing(const std::vector<int64_t>& lengths,
                                             int64_t max_length, int64_t chunk_size) {
  std::vector<PackedRow> rows;
  const int64_t n = static_cast<int64_t>(lengths.size());
  for (int64_t begin = 0; begin < n; begin += chunk_size) {
    PackChunk(lengths, begin, std::min(n, begin + chunk_size), max_length, &rows);
  }
  return rows;
}

}  // namespace cpptrain
