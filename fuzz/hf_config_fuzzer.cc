// Fuzzes the Hugging Face config.json reader (checkpoint/hf_config.h): the input is the file,
// read with DecoderConfigFromHfConfig. A config it accepts must pass ValidateDecoderConfig, be
// written by WriteHfConfig, and read back from that file as the same DecoderConfig (the header's
// round-trip promise).
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "checkpoint/hf_config.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/proto_util.h"
#include "glog/logging.h"
#include "models/configs.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  FLAGS_minloglevel = 2;  // the reader warns about ignored fields; only errors are printed
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = cpptrain::fuzz::ScratchPath("config.json");
  static const std::string written = cpptrain::fuzz::ScratchPath("written/config.json");
  cpptrain::fuzz::WriteFileOrDie(path, data, size);
  const auto config = cpptrain::DecoderConfigFromHfConfig(path);
  if (!config.ok()) return 0;
  const absl::Status valid = cpptrain::ValidateDecoderConfig(*config);
  FUZZ_CHECK(valid.ok(), "an accepted config.json fails ValidateDecoderConfig: " << valid);
  static const bool made = [] {
    return ::mkdir(cpptrain::fuzz::ScratchPath("written").c_str(), 0755) == 0;
  }();
  FUZZ_CHECK(made, "cannot create " << cpptrain::fuzz::ScratchPath("written"));
  const absl::Status write = cpptrain::WriteHfConfig(*config, written);
  FUZZ_CHECK(write.ok(), "WriteHfConfig refuses a config read from config.json: " << write);
  auto again = cpptrain::DecoderConfigFromHfConfig(written);
  FUZZ_CHECK(again.ok(),
             "the written config.json does not read back: " << again.status() << "\n"
                                                            << cpptrain::HfConfigJson(*config));
  // The writer spells out max_position_embeddings (its default when unset) so transformers
  // sees the value the model uses; reading it back sets what was a default before.
  if (again.ok() && !config->has_max_position_embeddings() &&
      again->max_position_embeddings() == config->max_position_embeddings()) {
    again->clear_max_position_embeddings();
  }
  FUZZ_CHECK(cpptrain::fuzz::SameMessage(*config, *again),
             "the written config.json reads back another config:\n"
                 << config->DebugString() << "---\n"
                 << again->DebugString());
  return 0;
}
