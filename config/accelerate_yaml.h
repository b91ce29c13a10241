// The YAML file `accelerate config` writes (~/.cache/huggingface/accelerate/default_config.yaml,
// or the file given to `accelerate launch --config_file`), read without a YAML library: a
// strict parser of the subset such files use, and its settings for
// config/accelerate_config.h's mapping.
//
//   CT_ASSIGN_OR_RETURN(std::vector<AccelerateSetting> settings,
//                       ReadAccelerateYamlFile("fsdp.yaml"));
//   CT_ASSIGN_OR_RETURN(AccelerateMapping mapping, MapAccelerateSettings(settings));
//
// The subset: mappings by indentation (spaces), two levels deep (`fsdp_config:` and its
// keys); scalars plain, 'single-quoted' or "double-quoted" (\" \\ \n \t escapes); `{}` and
// `[]` for empty ones; lists of scalars, in flow form `[a, b]` or as `- item` lines; `null`
// and `~`; comments; one leading `---`. Everything else (tabs, anchors and aliases, tags,
// block scalars `|` and `>`, non-empty flow mappings, a third level, lists of mappings,
// duplicate keys, several documents) is refused with its line number.
#ifndef CPPTRAIN_CONFIG_ACCELERATE_YAML_H_
#define CPPTRAIN_CONFIG_ACCELERATE_YAML_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "config/accelerate_config.h"

namespace cpptrain {

struct YamlEntry {
  std::string path;   // "num_processes", "fsdp_config.fsdp_version"
  std::string value;  // the scalar unquoted; a list's items joined with ","; "" for null/{}/[]
  int line = 0;       // 1-based
};

// Parses `text`; errors are InvalidArgument "source:line: what; the subset this reads".
// An empty mapping (`fsdp_config: {}`) yields no entry.
absl::StatusOr<std::vector<YamlEntry>> ParseYamlSubset(absl::string_view text,
                                                       absl::string_view source);

// The file's entries as settings (source "path:line"). NotFound naming the path when it
// cannot be read.
absl::StatusOr<std::vector<AccelerateSetting>> ReadAccelerateYamlFile(const std::string& path);

}  // namespace cpptrain

#endif  // CPPTRAIN_CONFIG_ACCELERATE_YAML_H_
