// Fuzzes the reader of trainer_state.textproto (checkpoint/manifest.h ReadTrainerState: the
// checksum line, then the text format) and what ckpt verify does with the state
// (checkpoint/verify.h VerifyCheckpoint: the rng_state files of every rank the state names).
// The input is the file. It is read three ways: as it is in a checkpoint whose manifest is of
// format 2 (checksum line required) and of format 1 (optional), and with its checksum line
// rewritten to match the rest, which reaches the text-format parser for nearly every mutation.
// A state that reads must print and read back as the same message.
#include <ATen/ATen.h>
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/verify.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/proto_util.h"
#include "google/protobuf/text_format.h"

namespace {

// A checkpoint directory without tensors: manifest.pb of `format` and one rng_state file.
std::string MakeCheckpoint(const std::string& name, int format) {
  const std::string dir = cpptrain::fuzz::ScratchPath(name);
  FUZZ_CHECK(::mkdir(dir.c_str(), 0755) == 0, "cannot create " << dir);
  cpptrain::proto::CheckpointManifest manifest;
  manifest.set_engine("local");
  manifest.set_world_size(1);
  std::string bytes;
  if (format >= cpptrain::kManifestFormatWithChecksums) {
    bytes = cpptrain::ManifestBytes(manifest);
  } else {
    manifest.set_format_version(1);
    bytes = manifest.SerializeAsString();
  }
  cpptrain::fuzz::WriteFileOrDie(dir + "/" + cpptrain::kManifestFileName, bytes);
  const absl::Status rng = cpptrain::WriteSafetensors(dir + "/rng_state_0.safetensors",
                                                      {{"cpu", at::arange(16, at::kByte)}});
  FUZZ_CHECK(rng.ok(), rng);
  return dir;
}

// The text without its last checksum line, with a checksum line of its own.
std::string WithFixedChecksum(absl::string_view text) {
  const size_t line = text.rfind("# crc32c ");
  if (line != absl::string_view::npos && (line == 0 || text[line - 1] == '\n')) {
    text = text.substr(0, line);
  }
  return cpptrain::WithChecksumLine(std::string(text));
}

void Check(const std::string& dir, bool required) {
  const std::string path = dir + "/" + cpptrain::kTrainerStateFileName;
  const auto state = cpptrain::ReadTrainerState(path, required);
  const auto report = cpptrain::VerifyCheckpoint(dir);
  FUZZ_CHECK(report.ok(),
             "a checkpoint whose manifest reads must be verified: " << report.status());
  if (!state.ok()) {
    FUZZ_CHECK(state.status().code() == absl::StatusCode::kDataLoss, state.status());
    return;
  }
  std::string printed;
  FUZZ_CHECK(google::protobuf::TextFormat::PrintToString(*state, &printed), "cannot print");
  cpptrain::fuzz::WriteFileOrDie(path, cpptrain::WithChecksumLine(printed));
  const auto again = cpptrain::ReadTrainerState(path, /*required=*/true);
  FUZZ_CHECK(again.ok(), "the printed state does not read back: " << again.status());
  FUZZ_CHECK(cpptrain::fuzz::SameMessage(*state, *again),
             "the printed state reads back as another:\n"
                 << printed);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string format2 = MakeCheckpoint("format2", 2);
  static const std::string format1 = MakeCheckpoint("format1", 1);
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const std::string state_file = std::string("/") + cpptrain::kTrainerStateFileName;

  cpptrain::fuzz::WriteFileOrDie(format2 + state_file, data, size);
  Check(format2, /*required=*/true);
  cpptrain::fuzz::WriteFileOrDie(format1 + state_file, data, size);
  Check(format1, /*required=*/false);
  cpptrain::fuzz::WriteFileOrDie(format2 + state_file, WithFixedChecksum(text));
  Check(format2, /*required=*/true);
  return 0;
}
