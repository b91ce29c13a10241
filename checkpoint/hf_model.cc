#include "checkpoint/hf_model.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "base/logging.h"
#include "base/status.h"
#include "base/torch_status.h"
#include "checkpoint/files.h"
#include "checkpoint/internal/checkpoint_files.h"
#include "checkpoint/model_match.h"
#include "checkpoint/safetensors.h"
#include "models/configs.h"
#include "module/deferred.h"
#include "sharding/flat_shard.h"
#include "sharding/fully_shard.h"

namespace cpptrain {
namespace {

constexpr char kEmbedName[] = "model.embed_tokens.weight";
constexpr char kLmHeadName[] = "lm_head.weight";
// Non-persistent in transformers, but some older checkpoints hold them.
constexpr char kRotaryBufferSuffix[] = "rotary_emb.inv_freq";

std::string ShapeString(at::IntArrayRef shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// What to copy into one parameter: the rows [row_begin, row_end) of the file's tensor, or the
// whole tensor when `slice` is false; of those rows, flattened, elements [skip, skip + take)
// when take >= 0 (an FSDP1 / ZeRO-3 flat piece).
struct LoadPlan {
  std::string name;
  at::Tensor param;
  bool slice = false;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  int64_t skip = 0;
  int64_t take = -1;
};

// How the model is sharded at load time, if it is: per parameter (FullyShard) or flat
// (FlatShard). Both null for a whole model.
struct LoadSharding {
  const FullyShardedModel* rows = nullptr;
  const FlatShardedModel* flat = nullptr;

  const ShardInfo* Find(const at::Tensor& param) const {
    if (rows != nullptr) return rows->Find(param);
    return flat != nullptr ? flat->FindPiece(param) : nullptr;
  }
};

// The plan for a parameter that is this rank's chunk of rows (FullyShard) or its flat piece
// (FlatShard); an error when its shape is not that (the model is gathered).
absl::Status PlanShardedLoad(const ShardInfo& shard, bool flat, LoadPlan& plan) {
  const at::Tensor& param = plan.param;
  std::vector<int64_t> mine = shard.global_shape;
  if (flat) {
    mine = {shard.local_numel};
  } else {
    mine[0] = shard.local_rows;
  }
  if (param.sizes().vec() != mine) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter '", plan.name, "' has shape ", ShapeString(param.sizes()), ", not its shard's ",
        ShapeString(mine), ": load between steps, while the parameters are sharded"));
  }
  plan.slice = true;
  if (!flat) {
    plan.row_begin = shard.row_begin;
    plan.row_end = shard.row_begin + shard.local_rows;
    return absl::OkStatus();
  }
  const FlatPieceRows piece = RowsCoveringPiece(shard);
  plan.row_begin = piece.rows.begin;
  plan.row_end = piece.rows.end;
  plan.skip = piece.skip;
  plan.take = shard.local_numel;
  return absl::OkStatus();
}

bool IsFloating(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf ||
         dtype == at::kDouble;
}

// The hint for a tensor one side lacks: " (config field F probably differs)", or "".
std::string HintText(const std::string& field) {
  return field.empty() ? "" : absl::StrCat(" (config field ", field, " probably differs)");
}

// Matches every parameter with its tensor and checks shapes and dtypes, adding what is wrong
// to `problems`. The plan holds one entry per parameter that matches; `missing`, the
// parameters without a tensor.
std::vector<LoadPlan> PlanLoad(const SafetensorsModelDir& files, TrainableModel& model,
                               const LoadSharding& sharded, LoadProblems& problems,
                               std::vector<LoadPlan>& missing) {
  std::vector<LoadPlan> plans;
  std::set<std::string> used;
  const auto params = model.named_parameters(/*recurse=*/true);
  std::vector<std::string> param_names;
  for (const auto& item : params) param_names.push_back(item.key());
  const int64_t model_layers = DecoderLayerCount(param_names);
  const int64_t saved_layers = DecoderLayerCount(files.names());
  for (const auto& item : params) {
    const std::string& name = item.key();
    const at::Tensor& param = item.value();
    const ShardInfo* shard = sharded.Find(param);
    const std::vector<int64_t> want = shard != nullptr ? shard->global_shape : param.sizes().vec();
    used.insert(name);
    if (!files.Has(name)) {
      const std::string hint = ConfigFieldHint(name, saved_layers);
      problems.Add(absl::StrCat("tensor '", name, "' (the model's shape ", ShapeString(want),
                                ") is not in the checkpoint", HintText(hint),
                                ": check that config.json's model_type and sizes describe this "
                                "checkpoint"),
                   hint);
      missing.push_back({name, param, shard != nullptr, shard ? shard->row_begin : 0, 0});
      continue;
    }
    const SafetensorsTensorInfo info = files.Info(name).value();
    if (info.shape != want) {
      problems.Add(absl::StrCat("tensor '", name, "' has shape ", ShapeString(info.shape),
                                " in the checkpoint, but the model's parameter has shape ",
                                ShapeString(want),
                                ": build the model from the checkpoint's config.json "
                                "(DecoderConfigFromHfConfig)"));
      continue;
    }
    if (!IsFloating(info.dtype)) {
      problems.Add(absl::StrCat("tensor '", name, "' has dtype ", c10::toString(info.dtype),
                                " in the checkpoint; expected a floating dtype (F32, BF16, F16, "
                                "F64) for a weight"));
      continue;
    }
    LoadPlan plan{name, param};
    if (shard != nullptr) {
      const absl::Status planned = PlanShardedLoad(*shard, sharded.flat != nullptr, plan);
      if (!planned.ok()) {
        problems.Add(std::string(planned.message()));
        continue;
      }
      if (plan.take == 0) continue;  // an empty flat piece: nothing of it on this rank
    }
    plans.push_back(std::move(plan));
  }

  const bool tied = params.contains(kEmbedName) && !params.contains(kLmHeadName);
  for (const std::string& name : files.names()) {
    if (used.count(name) > 0 || absl::EndsWith(name, kRotaryBufferSuffix)) continue;
    if (name == kLmHeadName && tied) continue;  // checked by CheckTiedHead
    const SafetensorsTensorInfo info = files.Info(name).value();
    const std::string hint = ConfigFieldHint(name, model_layers);
    problems.Add(absl::StrCat("tensor '", name, "' (shape ", ShapeString(info.shape), ", in '",
                              files.FileOf(name).value()->path(),
                              "') matches no parameter of the model", HintText(hint),
                              ": check config.json's num_hidden_layers, attention_bias, "
                              "tie_word_embeddings and model_type against the checkpoint"),
                 hint);
  }
  return plans;
}

// transformers saves a tied head once, as the embedding; a checkpoint that still holds
// lm_head.weight for a model that ties it must hold the same values, or the head would be
// silently replaced by the embedding.
absl::Status CheckTiedHead(const SafetensorsModelDir& files, TrainableModel& model,
                           LoadProblems& problems) {
  const auto params = model.named_parameters(/*recurse=*/true);
  if (!params.contains(kEmbedName) || params.contains(kLmHeadName) || !files.Has(kLmHeadName) ||
      !files.Has(kEmbedName)) {
    return absl::OkStatus();
  }
  CT_ASSIGN_OR_RETURN(at::Tensor head, files.Get(kLmHeadName));
  CT_ASSIGN_OR_RETURN(at::Tensor embed, files.Get(kEmbedName));
  CT_ASSIGN_OR_RETURN(bool same, CatchTorch([&] {
                        return head.sizes() == embed.sizes() &&
                               head.scalar_type() == embed.scalar_type() && at::equal(head, embed);
                      }));
  for (const char* name : {kLmHeadName, kEmbedName}) files.FileOf(name).value()->ReleasePages(name);
  if (!same) {
    problems.Add(absl::StrCat("tensor '", kLmHeadName, "' differs from '", kEmbedName,
                              "', but the model ties them (tie_word_embeddings): set "
                              "tie_word_embeddings to false in config.json to load both"),
                 "tie_word_embeddings");
  }
  return absl::OkStatus();
}

// What the file holds for `plan`: a read-only view of the mapping (the rows, or the whole
// tensor); for a flat piece, the rows that cover it (`Piece` narrows them).
absl::StatusOr<at::Tensor> Source(const SafetensorsModelDir& files, const LoadPlan& plan) {
  return plan.slice ? files.GetSlice(plan.name, plan.row_begin, plan.row_end)
                    : files.Get(plan.name);
}

at::Tensor Piece(const LoadPlan& plan, const at::Tensor& source) {
  return plan.take < 0 ? source : source.reshape({-1}).narrow(0, plan.skip, plan.take);
}

// Before anything is copied: each tensor to load matches the checksum its file stores for it
// (files written here carry one; other writers' do not), and the rows to load are finite.
absl::Status VerifySources(const std::string& dir, const SafetensorsModelDir& files,
                           const std::vector<LoadPlan>& plans) {
  for (const LoadPlan& plan : plans) {
    CT_ASSIGN_OR_RETURN(const SafetensorsFile* file, files.FileOf(plan.name));
    CT_RETURN_IF_ERROR(file->VerifyCrc32c(plan.name));
    CT_ASSIGN_OR_RETURN(at::Tensor source, Source(files, plan));
    CT_RETURN_IF_ERROR(checkpoint_internal::CheckFinite(
        absl::StrCat("Hugging Face model directory '", dir, "', file '", file->path(), "'"),
        plan.name, source, plan.row_begin));
    file->ReleasePages(plan.name);  // the checksum read every byte of the tensor
  }
  return absl::OkStatus();
}

// The config fields of `dir`/config.json that differ from the model's, when the model is a
// decoder (its ConfigProto is a DecoderConfig) and the file is there.
void CompareWithConfigJson(const std::string& dir, const TrainableModel& model,
                           LoadProblems& problems);

}  // namespace

absl::Status LoadHfWeights(const std::string& dir, TrainableModel& model,
                           const HfLoadOptions& options) {
  CT_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsModelDir> files, SafetensorsModelDir::Open(dir));
  const LoadSharding sharded{FullyShardedOf(model), FlatShardedOf(model)};
  LoadProblems problems;
  CompareWithConfigJson(dir, model, problems);
  std::vector<LoadPlan> missing;
  std::vector<LoadPlan> plans = PlanLoad(*files, model, sharded, problems, missing);
  CT_RETURN_IF_ERROR(CheckTiedHead(*files, model, problems));
  CT_RETURN_IF_ERROR(problems.Resolve(
      absl::StrCat("Hugging Face model directory '", dir, "'"), options.strict,
      "set load_strict: false in the training arguments (HfLoadOptions.strict = false in C++)"));
  CT_RETURN_IF_ERROR(VerifySources(dir, *files, plans));

  at::NoGradGuard no_grad;
  int64_t bytes = 0;
  for (LoadPlan& plan : plans) {
    CT_ASSIGN_OR_RETURN(at::Tensor source, Source(*files, plan));
    // `source` views the read-only mapping: copy_ reads it (converting the dtype) and never
    // writes to it. A deferred parameter gets its memory here.
    absl::Status copied = CatchTorch([&] {
      if (IsDeferred(plan.param)) plan.param.set_data(at::empty_like(plan.param));
      plan.param.copy_(Piece(plan, source));
    });
    files->FileOf(plan.name).value()->ReleasePages(plan.name);
    if (!copied.ok()) {
      return absl::Status(copied.code(),
                          absl::StrCat("loading tensor '", plan.name, "' from '", dir,
                                       "': ", copied.message(), " (the model is partly loaded)"));
    }
    bytes += Piece(plan, source).numel() * static_cast<int64_t>(source.element_size());
  }
  // Not strict: parameters the directory lacks keep their initial values (drawn now when the
  // model was built deferred).
  for (LoadPlan& plan : missing) {
    if (!IsDeferred(plan.param)) continue;
    CT_RETURN_IF_ERROR(CatchTorch([&] { plan.param.set_data(at::empty_like(plan.param)); }));
    CT_RETURN_IF_ERROR(model.InitializeRows(plan.name, plan.row_begin, plan.param.detach()));
  }
  LOG(INFO) << "loaded " << plans.size() << " tensors, " << bytes << " bytes ("
            << static_cast<double>(bytes) / (1 << 20) << " MiB) from " << dir
            << (sharded.rows != nullptr   ? ", this rank's rows only"
                : sharded.flat != nullptr ? ", this rank's flat pieces only"
                                          : "");
  return absl::OkStatus();
}

namespace {

void CompareWithConfigJson(const std::string& dir, const TrainableModel& model,
                           LoadProblems& problems) {
  const proto::DecoderConfig* decoder = AsDecoderConfig(model.ConfigProto());
  const std::string path = absl::StrCat(dir, "/config.json");
  if (decoder == nullptr || ::access(path.c_str(), F_OK) != 0) return;
  absl::StatusOr<proto::DecoderConfig> saved = DecoderConfigFromHfConfig(path);
  if (!saved.ok()) {
    problems.Add(absl::StrCat("its config.json does not describe a decoder this model can be: ",
                              saved.status().message()));
    return;
  }
  problems.AddConfigDifferences(DecoderConfigDifferences(*saved, *decoder, "config.json"));
}

}  // namespace

}  // namespace cpptrain
