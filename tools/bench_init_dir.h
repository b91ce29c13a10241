// The starting point tools/bench shares with tools/bench_torch.py, so the two train the same
// model on the same tokens and their losses can be compared: an init directory holding a
// Hugging Face model (config.json + model.safetensors, Hugging Face parameter names) and, per
// run shape, the token ids each rank trained on.
//
//   CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
//                       BenchModel(init_dir, config, "tiny", *engine));
//   ... train, keeping each micro-batch's input ids ...
//   const BenchTokensShape shape{"markov", world, accum, micro, seq, steps};
//   CT_RETURN_IF_ERROR(WriteBenchTokensIfAbsent(BenchTokensPath(init_dir, shape, rank), ids));
//   int64_t fingerprint = BenchTokensFingerprint(ids, rank);  // summed over ranks
#ifndef CPPTRAIN_TOOLS_BENCH_INIT_DIR_H_
#define CPPTRAIN_TOOLS_BENCH_INIT_DIR_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engines/engine.h"
#include "models/decoder.h"
#include "proto/model.pb.h"

namespace cpptrain {

// The model to train. Without `init_dir`: built from `config` after torch::manual_seed(0).
// With it, every rank looks for `init_dir`/config.json and all decide alike (one AllReduceSum
// on `engine`):
//   - present: every rank loads the directory (LoadHfDecoder); its config must describe the
//     same model as `config` (the --model named `model_name`), or the error shows both;
//   - absent: the model is built as without `init_dir`, rank 0 writes model.safetensors then
//     config.json (config.json last, so its presence means a complete directory), and every
//     rank waits at a barrier. The built model is the one written (fp32, exact).
absl::StatusOr<std::shared_ptr<DecoderLM>> BenchModel(const std::string& init_dir,
                                                      const proto::DecoderConfig& config,
                                                      const std::string& model_name,
                                                      Engine& engine);

// What one rank's token ids of a run depend on besides the dataset.
struct BenchTokensShape {
  std::string tokens = "markov";  // the stream's kind (tools/bench --tokens)
  int64_t world = 1;
  int64_t grad_accum = 1;
  int64_t micro_batch = 1;
  int64_t seq_len = 1;
  int64_t steps = 1;  // every optimizer step of the run, warm-up included
};

// `init_dir`/tokens-<kind>-w<world>-ga<accum>-mb<micro>-seq<seq>-steps<steps>-rank<rank>
// .safetensors; tools/bench_torch.py builds the same name.
std::string BenchTokensPath(const std::string& init_dir, const BenchTokensShape& shape,
                            int64_t rank);

// Writes `ids` ([steps, grad_accum, micro_batch, seq_len] int64, any device) to `path` as the
// safetensors tensor "input_ids", unless `path` exists (the first run of a shape writes it,
// later runs leave it; tools/bench_compare.py checks they saw the same tokens through the
// fingerprint).
absl::Status WriteBenchTokensIfAbsent(const std::string& path, const at::Tensor& ids);

// sum(ids[i] * (i % 97 + 1)) over the flattened ids, times rank + 1: summed over ranks, a
// number that changes when any token does (bench_torch.py computes the same). Exact in a
// double for the shapes benchmarked (< 2^53).
int64_t BenchTokensFingerprint(const at::Tensor& ids, int64_t rank);

}  // namespace cpptrain

#endif  // CPPTRAIN_TOOLS_BENCH_INIT_DIR_H_
