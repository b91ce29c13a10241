// The model a TrainJob names (proto/job.proto ModelSpec), for tools/train, tools/generate and
// C++ applications: a named or given decoder shape built fresh, or a Hugging Face directory
// (model.pretrained) with its config.json and safetensors weights.
//
//   CT_ASSIGN_OR_RETURN(JobModel built, BuildJobModel(job));
//   Trainer trainer(job.args(), built.model, train, eval, std::move(built.engine));
//
// Under FSDP2 (args.fsdp.version 2) a pretrained model is sharded at load: built deferred, the
// engine shards it (each rank allocates only its rows), then each rank reads only its own rows
// of each tensor from the memory-mapped files (LoadHfWeights); no rank holds a whole tensor and
// no weights travel between ranks. The engine that sharded it comes back for the Trainer.
// FSDP1 with fsdp.cpu_ram_efficient_loading and ZeRO-3 with zero.zero3_init_flag do the same
// with their flat pieces: each rank holds its 1/N of the fp32 parameters, never the whole
// model (without the option every rank loads it whole, then shards it).
#ifndef CPPTRAIN_JOBS_JOB_MODEL_H_
#define CPPTRAIN_JOBS_JOB_MODEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/hf_model.h"
#include "engines/engine.h"
#include "models/decoder.h"
#include "proto/job.pb.h"
#include "proto/model.pb.h"

namespace cpptrain {

struct JobModel {
  std::shared_ptr<DecoderLM> model;
  // Set when the model was sharded at load: pass it to the Trainer. Null otherwise (the
  // Trainer creates its engine from the arguments).
  std::unique_ptr<Engine> engine;
};

// The decoder config of `spec`: the named or given shape, or model.pretrained's config.json.
// With pretrained, each model.decoder field that is set must equal the directory's value, else
// an error naming the field and both values.
absl::StatusOr<proto::DecoderConfig> ResolveJobModelConfig(const proto::ModelSpec& spec);

// The model of `job`, initialized (from args.seed) or loaded from model.pretrained.
absl::StatusOr<JobModel> BuildJobModel(const proto::TrainJob& job);

// A decoder on the CPU in fp32 from `dir`: a checkpoint of the Trainer (manifest.pb; its
// decoder config, and its weights whether saved full or sharded, at any world size) or a
// Hugging Face model directory (config.json and safetensors weights).
absl::StatusOr<std::shared_ptr<DecoderLM>> LoadDecoderDir(const std::string& dir);

// A Hugging Face model directory as the reference decoder: DecoderConfigFromHfConfig
// (dir/config.json), BuildDecoder deferred (each tensor allocated once, as it is read), then
// LoadHfWeights. On the CPU, in fp32.
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model, LoadHfDecoder("/models/Qwen3-0.6B"));
absl::StatusOr<std::shared_ptr<DecoderLM>> LoadHfDecoder(const std::string& dir,
                                                         const HfLoadOptions& options = {});

}  // namespace cpptrain

#endif  // CPPTRAIN_JOBS_JOB_MODEL_H_
