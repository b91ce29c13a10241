#include "tools/bench_init_dir.h"

#include <ATen/ATen.h>
#include <torch/types.h>
#include <torch/utils.h>

#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/logging.h"
#include "base/status.h"
#include "checkpoint/safetensors.h"
#include "jobs/job_model.h"
#include "models/configs.h"

namespace cpptrain {
namespace {

// config.json as HfConfigJson writes it, with the fields that reading one fills in (head_dim,
// initializer_range) made explicit, so two configs of the same model give the same text.
std::string CanonicalConfigJson(proto::DecoderConfig config) {
  if (!config.has_head_dim()) {
    config.set_head_dim(config.hidden_size() / config.num_attention_heads());
  }
  config.set_initializer_range(config.initializer_range());
  return HfConfigJson(config);
}

absl::Status WriteModelDir(const std::string& dir, DecoderLM& model) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    return absl::InvalidArgumentError(absl::StrCat("--init_dir=", dir,
                                                   " cannot be created: ", error.message(),
                                                   "; choose a writable directory"));
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const auto& param : model.named_parameters(/*recurse=*/true)) {
    tensors.emplace_back(param.key(), param.value().detach());
  }
  CT_RETURN_IF_ERROR(
      WriteSafetensors(absl::StrCat(dir, "/", kSafetensorsFileName), tensors, {{"format", "pt"}}));
  // Last: a directory with config.json holds a complete model.
  CT_RETURN_IF_ERROR(WriteHfConfig(model.config(), absl::StrCat(dir, "/config.json")));
  LOG(INFO) << "wrote the initial model (" << tensors.size() << " tensors) to " << dir;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<DecoderLM>> BenchModel(const std::string& init_dir,
                                                      const proto::DecoderConfig& config,
                                                      const std::string& model_name,
                                                      Engine& engine) {
  if (init_dir.empty()) {
    torch::manual_seed(0);
    return BuildDecoder(config);
  }
  const std::string config_path = absl::StrCat(init_dir, "/config.json");
  // Every rank looks, and all decide by the sum: no rank writes before this collective, so one
  // that saw nothing while another saw the model can only be behind a lagging shared file
  // system, and then fails loading, naming the file.
  const double seen = std::filesystem::exists(config_path) ? 1.0 : 0.0;
  CT_ASSIGN_OR_RETURN(at::Tensor present,
                      engine.AllReduceSum(torch::tensor({seen}, torch::kFloat64)));
  if (present.item<double>() > 0) {
    CT_ASSIGN_OR_RETURN(proto::DecoderConfig stored, DecoderConfigFromHfConfig(config_path));
    if (CanonicalConfigJson(stored) != CanonicalConfigJson(config)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--init_dir=", init_dir, " holds another model than --model=", model_name, ":\n",
          CanonicalConfigJson(stored), "\nagainst\n", CanonicalConfigJson(config),
          "\nuse a new --init_dir, or the --model it was written with"));
    }
    CT_LOG_RANK0(INFO) << "loading the initial model from " << init_dir;
    return LoadHfDecoder(init_dir);
  }
  torch::manual_seed(0);
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, BuildDecoder(config));
  if (engine.rank() == 0) CT_RETURN_IF_ERROR(WriteModelDir(init_dir, *model));
  CT_RETURN_IF_ERROR(engine.Barrier());
  return model;
}

std::string BenchTokensPath(const std::string& init_dir, const BenchTokensShape& shape,
                            int64_t rank) {
  return absl::StrCat(init_dir, "/tokens-", shape.tokens, "-w", shape.world, "-ga",
                      shape.grad_accum, "-mb",
                      shape.micro_batch, "-seq", shape.seq_len, "-steps", shape.steps, "-rank",
                      rank, ".safetensors");
}

absl::Status WriteBenchTokensIfAbsent(const std::string& path, const at::Tensor& ids) {
  if (std::filesystem::exists(path)) return absl::OkStatus();
  CT_RETURN_IF_ERROR(
      WriteSafetensors(path, {{"input_ids", ids.to(at::kCPU, at::kLong)}}, {{"format", "pt"}}));
  LOG(INFO) << "wrote the token ids of this rank's " << ids.size(0) << " steps to " << path;
  return absl::OkStatus();
}

int64_t BenchTokensFingerprint(const at::Tensor& ids, int64_t rank) {
  const at::Tensor flat = ids.to(at::kCPU, at::kLong).reshape({-1});
  const at::Tensor weights = at::arange(flat.numel(), at::kLong).remainder(97) + 1;
  return (flat * weights).sum().item<int64_t>() * (rank + 1);
}

}  // namespace cpptrain
