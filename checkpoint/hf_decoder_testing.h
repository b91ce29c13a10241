// For tests in checkpoint/ and trainer/, which sit below jobs/: a Hugging Face model directory
// loaded into the reference decoder, as jobs/job_model.h's LoadHfDecoder loads it.
//
//   absl::StatusOr<std::shared_ptr<DecoderLM>> model = LoadHfDecoderForTest(dir);
#ifndef CPPTRAIN_CHECKPOINT_HF_DECODER_TESTING_H_
#define CPPTRAIN_CHECKPOINT_HF_DECODER_TESTING_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "base/status.h"
#include "checkpoint/hf_config.h"
#include "checkpoint/hf_model.h"
#include "models/configs.h"
#include "models/decoder.h"

namespace cpptrain {

inline absl::StatusOr<std::shared_ptr<DecoderLM>> LoadHfDecoderForTest(const std::string& dir) {
  CT_ASSIGN_OR_RETURN(proto::DecoderConfig config,
                      DecoderConfigFromHfConfig(dir + "/config.json"));
  CT_ASSIGN_OR_RETURN(std::shared_ptr<DecoderLM> model,
                      BuildDecoder(config, {DecoderInit::Mode::kDeferred, 0}));
  CT_RETURN_IF_ERROR(LoadHfWeights(dir, *model));
  return model;
}

}  // namespace cpptrain

#endif  // CPPTRAIN_CHECKPOINT_HF_DECODER_TESTING_H_
