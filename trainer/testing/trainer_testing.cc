#include "trainer/testing/trainer_testing.h"

#include <algorithm>
#include <random>

#include <torch/torch.h>

#include "trainer/data/in_memory_dataset.h"

namespace cpptrain {
namespace testing {

std::shared_ptr<const Dataset> VariableLengthTokens(int64_t count, uint64_t seed) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<std::vector<int64_t>> sequences;
  for (int64_t i = 0; i < count; ++i) {
    std::vector<int64_t> tokens(3 + rng() % 10);
    for (int64_t& t : tokens) t = 1 + rng() % 60;
    sequences.push_back(tokens);
  }
  return *InMemoryDataset::FromTokenSequences(sequences);
}

absl::StatusOr<std::unique_ptr<torch::optim::Optimizer>> SgdTrainer::CreateOptimizer(
    const NamedParameters& params) {
  std::vector<torch::Tensor> tensors;
  for (const auto& [name, p] : params) tensors.push_back(p);
  return std::unique_ptr<torch::optim::Optimizer>(
      std::make_unique<torch::optim::SGD>(tensors, torch::optim::SGDOptions(0.5)));
}

std::vector<torch::Tensor> Parameters(torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& p : model.parameters()) out.push_back(p.detach().clone());
  return out;
}

double MaxRelativeDifference(const std::vector<torch::Tensor>& a,
                             const std::vector<torch::Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double scale = std::max(1e-6, b[i].abs().max().item<double>());
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>() / scale);
  }
  return worst;
}

}  // namespace testing
}  // namespace cpptrain
