// Loads the weights of a Hugging Face model directory, as transformers' save_pretrained writes
// it (config.json and model.safetensors, or shards named by model.safetensors.index.json), into
// a model whose parameters carry Hugging Face's names, for fine-tuning. It knows TrainableModel
// only; jobs/job_model.h's LoadHfDecoder builds the reference decoder from config.json and
// calls it:
//
//   CT_RETURN_IF_ERROR(LoadHfWeights("/models/Qwen3-0.6B", *model));
//
// Sharded at load time, each rank reads only the rows it owns (built deferred, no rank ever
// allocates a whole tensor):
//   CT_ASSIGN_OR_RETURN(auto config, DecoderConfigFromHfConfig(dir + "/config.json"));
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
//                       BuildDecoder(config, {DecoderInit::Mode::kDeferred, 0}));
//   CT_RETURN_IF_ERROR(FullyShard(*model, mesh, options).status());
//   CT_RETURN_IF_ERROR(LoadHfWeights(dir, *model));
//
// The other direction, a model trained here for transformers' from_pretrained:
//   CT_RETURN_IF_ERROR(WriteHfConfig(model->config(), dir + "/config.json"));
//   CT_RETURN_IF_ERROR(WriteSafetensors(dir + "/model.safetensors", <named_parameters()>,
//                                       {{"format", "pt"}}));
#ifndef CPPTRAIN_CHECKPOINT_HF_MODEL_H_
#define CPPTRAIN_CHECKPOINT_HF_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
// DecoderConfigFromHfConfig, HfConfigJson and WriteHfConfig: config.json on its own.
#include "checkpoint/hf_config.h"
#include "module/trainable_model.h"
#include "proto/model.pb.h"

namespace cpptrain {

struct HfLoadOptions {
  // true, like load_state_dict(strict=True): every mismatch below is one error listing them
  // all. false: one warning each; what matches loads, the rest keeps its initial values.
  // Damage (a checksum mismatch, non-finite values) is an error either way.
  bool strict = true;
};

// Copies the tensors of the safetensors model directory `dir` into the model's parameters of
// the same names (DecoderLM uses Hugging Face's names), converting the file's dtype (BF16,
// F16, F32, F64) to each parameter's. Everything is checked before anything is copied, so an
// error leaves the model unchanged: a parameter without a tensor, a tensor without a parameter
// (allowed: lm_head.weight when the model ties it to the embedding, and rotary inv_freq
// buffers), a shape that differs, a non-floating dtype, config.json fields that differ from a
// decoder's config (its ConfigProto: rope_theta, rms_norm_eps, head_dim, the sizes, ...), a tensor whose
// bytes fail the checksum its file stores (files written here carry one), NaN or infinite
// values in the rows to load. Errors name the tensor (both shapes, both values, the config
// field that probably differs) and what to do.
//
// When FullyShardedOf(model) is set, each parameter is the rank's chunk of rows
// [row_begin, row_begin + local_rows) of the full tensor (ShardInfo): only those rows are read
// from the file. When FlatShardedOf(model) is set (FSDP1, ZeRO-3), each parameter is the
// rank's piece of the flattened tensor: only the rows that cover it are read. Call it between
// steps (parameters at rest, not gathered); every rank calls it for its own part, without
// communication. Each tensor's mapped pages leave the resident set once it is read, so a rank
// holds what it loads, not the file (the checksum still reads every byte of each tensor).
absl::Status LoadHfWeights(const std::string& dir, TrainableModel& model,
                           const HfLoadOptions& options = {});

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_HF_MODEL_H_
