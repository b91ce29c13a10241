// Fuzzes the checkpoint manifest's reader alone (checkpoint/manifest.h ReadManifest: the
// protobuf parse, the format-2 trailing CRC-32C), a thousand times faster than
// manifest_fuzzer.cc, which also loads a checkpoint per input. The input is manifest.pb; it is
// read as it is and with its checksum rewritten to match (fuzz/manifest_bytes.h). Properties:
// a failure is a DataLoss error that names the file; a manifest that reads is written again by
// WriteManifest and reads back as the same message.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "checkpoint/manifest.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/manifest_bytes.h"

namespace {

// The message without what ManifestBytes sets itself (the format and the checksum).
std::string Comparable(cpptrain::proto::CheckpointManifest manifest) {
  manifest.clear_manifest_crc32c();
  manifest.clear_format_version();
  return manifest.SerializeAsString();
}

void ReadOne(const std::string& bytes) {
  const std::string dir = cpptrain::fuzz::ScratchPath("in");
  const std::string path = dir + "/" + cpptrain::kManifestFileName;
  cpptrain::fuzz::WriteFileOrDie(path, bytes.data(), bytes.size());
  absl::StatusOr<cpptrain::proto::CheckpointManifest> manifest = cpptrain::ReadManifest(dir);
  if (!manifest.ok()) {
    FUZZ_CHECK(manifest.status().code() == absl::StatusCode::kDataLoss, manifest.status());
    FUZZ_CHECK(absl::StrContains(manifest.status().message(), path), manifest.status());
    return;
  }
  const std::string out = cpptrain::fuzz::ScratchPath("out");
  const absl::Status written = cpptrain::WriteManifest(out, *manifest);
  FUZZ_CHECK(written.ok(), "a manifest that read must write: " << written);
  absl::StatusOr<cpptrain::proto::CheckpointManifest> again = cpptrain::ReadManifest(out);
  FUZZ_CHECK(again.ok(), "a manifest WriteManifest wrote must read: " << again.status());
  FUZZ_CHECK(Comparable(*again) == Comparable(*manifest), "the manifest changed in a round trip");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool made = [] {
    for (const char* name : {"in", "out"}) {
      const std::string dir = cpptrain::fuzz::ScratchPath(name);
      FUZZ_CHECK(::mkdir(dir.c_str(), 0755) == 0, "cannot create " << dir);
    }
    return true;
  }();
  (void)made;
  ReadOne(std::string(reinterpret_cast<const char*>(data), size));
  ReadOne(cpptrain::fuzz::WithFixedChecksum(data, size));
  return 0;
}
