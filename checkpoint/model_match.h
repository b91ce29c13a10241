// Says what differs between saved weights and the model they are loaded into, in the model
// configuration's terms: the config fields whose values differ, and for a tensor that one side
// lacks, the field that probably decides it (q_norm/k_norm: qk_norm, *.bias: attention_bias or
// mlp_bias, lm_head.weight: tie_word_embeddings). LoadModelState (checkpoint.h) and
// LoadHfWeights (hf_model.h) collect every problem in LoadProblems, then either refuse the load
// with all of them (strict, the default, like PyTorch's load_state_dict(strict=True)) or warn
// once per problem and load what matches.
//
//   LoadProblems problems;
//   problems.AddConfigDifferences(DecoderConfigDifferences(saved, model->config()));
//   problems.AddUnexpected("model.layers.0.self_attn.q_norm.weight", {8}, "checkpoint");
//   CT_RETURN_IF_ERROR(problems.Resolve(absl::StrCat("checkpoint '", dir, "'"), strict));
#ifndef CPPTRAIN_CHECKPOINT_MODEL_MATCH_H_
#define CPPTRAIN_CHECKPOINT_MODEL_MATCH_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"

namespace cpptrain {

// One line per field that differs, naming it and both values, e.g.
// "rope_theta is 1000000 in the checkpoint but 10000 in the model". Compares what changes the
// parameters or the function they compute: the sizes, head_dim (unset: hidden / heads),
// rope_theta, rms_norm_eps, tie_word_embeddings, qk_norm and attention_bias; not
// initializer_range (it only draws initial values). `saved_as` names the saved side
// ("the checkpoint", "config.json").
std::vector<std::string> DecoderConfigDifferences(const proto::DecoderConfig& saved,
                                                  const proto::DecoderConfig& model,
                                                  absl::string_view saved_as = "the checkpoint");

// The config field that decides whether a tensor named `name` exists, or "" when the name does
// not tell. `other_side_layers`: the number of decoder layers ("model.layers.<i>.") on the side
// that lacks the tensor, so a layer index past it points at num_hidden_layers (-1: unknown).
std::string ConfigFieldHint(absl::string_view name, int64_t other_side_layers = -1);

// 1 + the largest i of the names "model.layers.<i>.*" (with or without a "model." prefix in
// front, as checkpoint manifests name them); 0 when there are none.
int64_t DecoderLayerCount(const std::vector<std::string>& names);

// Everything that does not match in one load, reported together.
class LoadProblems {
 public:
  // A config field that differs (a line of DecoderConfigDifferences).
  void AddConfigDifference(std::string line);
  void AddConfigDifferences(const std::vector<std::string>& lines);
  // A tensor of the saved weights the model has no parameter for. `hint`: ConfigFieldHint.
  void AddUnexpected(const std::string& name, const std::vector<int64_t>& shape,
                     const std::string& hint);
  // A parameter of the model the saved weights lack.
  void AddMissing(const std::string& name, const std::vector<int64_t>& shape,
                  const std::string& hint);
  void AddShapeMismatch(const std::string& name, const std::vector<int64_t>& saved,
                        const std::vector<int64_t>& model);
  // Anything else, said in full; `field`: a config field it points at ("" when none).
  void Add(std::string line, const std::string& field = "");

  bool empty() const { return lines_.empty(); }
  const std::vector<std::string>& lines() const { return lines_; }

  // OK when there is nothing. Otherwise, strict: an InvalidArgument error that begins with
  // `what` ("checkpoint '/ckpt/checkpoint-10'"), counts the problems, names the config fields
  // that probably differ, lists the problems (the first 16, then a count) and says how to load
  // anyway (`escape`, e.g. "set load_strict: false"). Not strict: one warning per problem,
  // and OK.
  absl::Status Resolve(const std::string& what, bool strict, const std::string& escape) const;

 private:
  std::vector<std::string> lines_;
  std::set<std::string> fields_;  // config fields that differ or probably differ
};

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_MODEL_MATCH_H_
