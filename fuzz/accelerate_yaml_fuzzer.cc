// Fuzzes the reader of `accelerate config` YAML (config/accelerate_yaml.h) and the mapping of
// its settings (config/accelerate_config.h). A refused input's error names the source and a
// line of the input; an accepted one's entries name lines of the input and paths of at most
// two levels; and every override the mapping makes applies to a job (the mapping checks each
// value, so none may reach ApplyOverride malformed).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "config/accelerate_config.h"
#include "config/accelerate_yaml.h"
#include "config/text_proto.h"
#include "fuzz/fuzz_util.h"
#include "proto/job.pb.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  const int lines = static_cast<int>(std::count(text.begin(), text.end(), '\n')) + 1;
  const auto entries = cpptrain::ParseYamlSubset(text, "fuzz.yaml");
  if (!entries.ok()) {
    const absl::string_view message = entries.status().message();
    FUZZ_CHECK(absl::StartsWith(message, "fuzz.yaml:"), "an error without the source: " << message);
    int line = 0;
    const absl::string_view rest = message.substr(10);
    FUZZ_CHECK(absl::SimpleAtoi(rest.substr(0, rest.find(':')), &line) && line >= 1 &&
                   line <= lines,
               "an error whose line is not one of the input's " << lines << ": " << message);
    return 0;
  }
  std::vector<cpptrain::AccelerateSetting> settings;
  for (const cpptrain::YamlEntry& e : *entries) {
    FUZZ_CHECK(e.line >= 1 && e.line <= lines, "entry " << e.path << " at line " << e.line);
    FUZZ_CHECK(!e.path.empty() && std::count(e.path.begin(), e.path.end(), '.') <= 1,
               "an entry whose path is empty or deeper than two levels: " << e.path);
    settings.push_back({e.path, e.value, "fuzz.yaml"});
  }
  const auto mapping = cpptrain::MapAccelerateSettings(settings);
  if (!mapping.ok()) return 0;
  cpptrain::proto::TrainJob job;
  const absl::Status applied = cpptrain::ApplyOverrides(mapping->overrides, &job);
  FUZZ_CHECK(applied.ok(), "the mapping made overrides that do not apply: "
                               << applied << "\n" << absl::StrJoin(mapping->overrides, "\n"));
  return 0;
}
